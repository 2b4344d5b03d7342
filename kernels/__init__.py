"""State-movement kernels for MambaPool tensors (import name ``mamba_radix_kernels``).

Five operations, each one kernel launch over all layers and over the conv tensors and the temporal tensor
together (bits moved unchanged, 64-bit offsets, no host synchronisation):

========  =====================================================  =================================
op        meaning                                                 use
========  =====================================================  =================================
copy      ``t[:, dst[i]] = t[:, src[i]]``                         copy-on-write of a matched checkpoint
fork      ``t[:, dst[i]] = t[:, src]``                            one slot into k slots
track     ``t[:, track[i]] = t[:, active[i]]`` where mask, >= 0   decode/prefill checkpoint, static grid
gather    ``out[j][:, i] = t_j[:, slots[i]]``                     pool -> staging/host buffer (offload)
scatter   ``t_j[:, slots[i]] = src[j][:, i]``                     staging/host buffer -> pool
========  =====================================================  =================================

:mod:`.naive` holds the torch reference of each (the specification and the CPU path); :mod:`.slot_move`
the Triton launchers. This package imports without triton and without a GPU: :data:`HAS_TRITON` tells
whether the kernels exist. Most callers want :mod:`mamba_radix.state_ops`, which validates indices and
dispatches (CUDA -> Triton, otherwise the reference).
"""

from __future__ import annotations

from typing import Any

from .naive import (
    bits_view,
    copy_slots_ref,
    fork_slots_ref,
    gather_slots_ref,
    move_slots_ref,
    scatter_slots_ref,
    track_slots_ref,
)
from .quant_naive import (
    dequantize_scatter_ref,
    quantize_gather_ref,
    row_len_for,
)

# The Triton side is imported lazily (PEP 562): importing triton costs about a second, and Triton decides
# "interpreter or compiled" when a kernel is decorated, i.e. on first use here, after TRITON_INTERPRET is set.
_LAZY = {
    "HAS_TRITON",
    "INTERPRETED",
    "MAX_TENSORS_PER_LAUNCH",
    "copy_slots_triton",
    "fork_slots_triton",
    "gather_slots_triton",
    "move_slots_triton",
    "scatter_slots_triton",
    "track_slots_triton",
    "triton_usable",
}
# Checkpoint quantization kernels (kernels/triton_quant.py); that module needs triton, so it loads on use.
_LAZY_QUANT = {"dequantize_scatter_triton", "quantize_gather_triton"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import slot_move

        return getattr(slot_move, name)
    if name in _LAZY_QUANT:
        from . import triton_quant

        return getattr(triton_quant, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "HAS_TRITON",
    "INTERPRETED",
    "MAX_TENSORS_PER_LAUNCH",
    "bits_view",
    "copy_slots_ref",
    "copy_slots_triton",
    "dequantize_scatter_ref",
    "dequantize_scatter_triton",
    "fork_slots_ref",
    "fork_slots_triton",
    "gather_slots_ref",
    "gather_slots_triton",
    "move_slots_ref",
    "move_slots_triton",
    "quantize_gather_ref",
    "quantize_gather_triton",
    "row_len_for",
    "scatter_slots_ref",
    "scatter_slots_triton",
    "track_slots_ref",
    "track_slots_triton",
    "triton_usable",
]
