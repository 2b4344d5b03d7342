"""The one switch for the optional C extensions (``mamba_radix/_cwalk.c``, the tree's walk loop,
``mamba_radix/_ctokens.c``, the prompt check, ``mamba_radix/_cstate.c``, the one-slot state copy, and
``mamba_radix/_cfree.c``, an eviction's multi-chunk free).

``MAMBA_RADIX_C=0`` in the environment makes every compiled path fall back to its pure-Python
reference (the same results, more slowly); ``1``, the default, uses each extension that was built. Any
other value is refused with :class:`InvalidArgument`. Each fast path is chosen from it once, where its
user is built, and never tested on the path itself: the tree's walk per tree
(:func:`mamba_radix.walks.choose_walk`; the switch read at import), the token check per request lifecycle
(:func:`mamba_radix.token_checks.make_token_check`), the state copy per state pool
(:func:`mamba_radix.pools.mamba_pool.compiled_copy_row`) and the multi-chunk release per host free list
(:func:`mamba_radix.pools.host_free_list.compiled_release_ids`), the switch read then.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from mamba_radix.errors import InvalidArgument

__all__ = ["ENV", "compiled_paths_enabled"]

ENV = "MAMBA_RADIX_C"


def compiled_paths_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the compiled paths may run (each still needs its extension built). O(1)."""
    value = environ.get(ENV, "1")
    if value not in ("0", "1"):
        raise InvalidArgument(
            f"{ENV}={value!r} is not a switch; set it to 1 (the compiled paths where they were built, the "
            "default) or 0 (always the pure-Python references)"
        )
    return value == "1"
