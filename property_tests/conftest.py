"""Shared test set-up: the Triton interpreter switch, the Hypothesis profile, the markers.

Profiles live in the package (:mod:`mamba_radix.testing.profiles`), chosen with
``MAMBA_RADIX_HYPOTHESIS_PROFILE``: ``ci`` (default, bounded for 2 cores), ``dev`` (quick), ``thorough``.
"""

from __future__ import annotations

import os

# The interpreter flag is read when a kernel is decorated, so it must be set before anything imports
# mamba_radix_kernels. Without a GPU the Triton kernels run under the interpreter.
if os.environ.get("TRITON_INTERPRET") is None:
    try:
        import torch

        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    except ImportError:  # pragma: no cover
        os.environ["TRITON_INTERPRET"] = "1"

from mamba_radix.testing.profiles import load_profile

load_profile()  # $MAMBA_RADIX_HYPOTHESIS_PROFILE: ci (default), dev or thorough


def pytest_configure(config):  # type: ignore[no-untyped-def]
    """Markers registered here (``--strict-markers`` refuses unknown ones)."""
    config.addinivalue_line(
        "markers",
        "sglang: differential tests against SGLang's real cache, loaded from its PyPI wheel "
        "(fetched once into $MAMBA_RADIX_SGLANG_CACHE); deselect with -m 'not sglang'",
    )
