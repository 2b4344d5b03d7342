"""State movement between slots of a MambaPool, one function per operation.

Initial torch-only version; the kernels engineer extends it with the Triton dispatch for CUDA tensors.
Each function takes the pool's tensors ``[*conv, temporal]`` (each ``[num_layers, num_slots + 1, ...]``).
"""

from __future__ import annotations

import torch

__all__ = ["copy_slots", "fork_slots"]


def copy_slots(tensors: list[torch.Tensor], src: torch.Tensor, dst: torch.Tensor) -> None:
    """``t[:, dst[i]] = t[:, src[i]]`` for every tensor. Side effect: writes the destination slots."""
    for t in tensors:
        t[:, dst] = t[:, src]


def fork_slots(tensors: list[torch.Tensor], src: int, dst: torch.Tensor) -> None:
    """Copy slot ``src`` into every slot of ``dst``."""
    for t in tensors:
        t[:, dst] = t[:, src : src + 1]
