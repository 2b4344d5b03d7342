"""SGLang's real prefix cache, loaded from its PyPI wheel at run time, and a sequential replay through it.

- :mod:`~mamba_radix.testing.sglang.loader`: fetch the wheel, import the cache with stand-ins
  (:mod:`~mamba_radix.testing.sglang.standins`, :mod:`~mamba_radix.testing.sglang.standins_0_5_23`):
  0.5.20's ``MambaRadixCache``, 0.5.23's ``UnifiedRadixCache`` (Python tree core);
- :mod:`~mamba_radix.testing.sglang.pools`: counting pools with SGLang's interfaces;
- :mod:`~mamba_radix.testing.sglang.replay`: SGLang's scheduler rules, one request at a time;
- :mod:`~mamba_radix.testing.sglang.parity`: the same requests through our simulator, per-request diff.

No SGLang code is stored in this repository; it is downloaded and imported when a replay runs. This is
test and benchmark tooling: install it with ``pip install "mamba-radix[sglang-tools]"`` (the ``test`` extra
includes it); no ``mamba-radix`` command imports it.
"""

from __future__ import annotations

from mamba_radix.testing.sglang.loader import (
    SUPPORTED_VERSIONS,
    SGLangError,
    SGLangLoadError,
    SGLangModules,
    SGLangToolsMissingError,
    SGLangUnavailableError,
    cache_dir,
    fetch_wheel,
    load_sglang,
)

__all__ = [
    "SUPPORTED_VERSIONS",
    "SGLangError",
    "SGLangLoadError",
    "SGLangModules",
    "SGLangToolsMissingError",
    "SGLangUnavailableError",
    "cache_dir",
    "fetch_wheel",
    "load_sglang",
]
