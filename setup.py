"""Package discovery and the optional compiled core, which pyproject.toml alone cannot express (the rest of
the metadata is there).

Every package under ``mamba_radix/`` (``mamba_radix*``) is found automatically, so a new subpackage ships
without editing a list; ``kernels/`` and its subpackages are installed as ``mamba_radix_kernels``
(``package-dir`` in pyproject.toml).

``mamba_radix._cwalk`` (``mamba_radix/_cwalk.c``, plain CPython C API) is the radix tree's page-1 walk
compiled. It is optional: where no C compiler or Python headers are found the build warns and the install
goes on, and :mod:`mamba_radix.tree` runs its pure-Python loop (the reference the compiled one is tested
against). ``mamba_radix._ctokens`` (``mamba_radix/_ctokens.c``) is the request lifecycle's token-list check
compiled, optional the same way (:mod:`mamba_radix.lifecycle` then runs its ``struct.pack`` check, the
reference). ``mamba_radix._cstate`` (``mamba_radix/_cstate.c``) is the state pool's one-slot copy on the
CPU, optional the same way (:class:`mamba_radix.pools.MambaPool` then copies through numpy, the reference).
``mamba_radix._cfree`` (``mamba_radix/_cfree.c``) is the host free list's multi-chunk release (an eviction's
frees) compiled, optional the same way (:class:`mamba_radix.pools.host_free_list.HostFreeList` then runs its
numpy scatters, the reference). An editable install (``pip install -e .``) builds all four in place next to
the sources.
"""

from setuptools import Extension, find_packages, setup


def packages_found() -> list[str]:
    """``mamba_radix`` and all its subpackages, plus ``kernels*`` renamed to ``mamba_radix_kernels*``."""
    ours = find_packages(include=["mamba_radix", "mamba_radix.*"])
    kernels = [
        "mamba_radix_kernels" + name[len("kernels") :]
        for name in find_packages(include=["kernels", "kernels.*"])
    ]
    return ours + kernels


# optional=True: a failed compile (no gcc, no Python.h) is a warning, not a failed install
CWALK = Extension(
    "mamba_radix._cwalk",
    sources=["mamba_radix/_cwalk.c"],
    optional=True,
)

CTOKENS = Extension(
    "mamba_radix._ctokens",
    sources=["mamba_radix/_ctokens.c"],
    optional=True,
)

CSTATE = Extension(
    "mamba_radix._cstate",
    sources=["mamba_radix/_cstate.c"],
    optional=True,
)

CFREE = Extension(
    "mamba_radix._cfree",
    sources=["mamba_radix/_cfree.c"],
    optional=True,
)

setup(packages=packages_found(), ext_modules=[CWALK, CTOKENS, CSTATE, CFREE])
