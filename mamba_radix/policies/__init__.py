"""Research policies: the offline optimum, faithful peers and our own online policy (see
:mod:`mamba_radix.policies.registry` for the names)."""
