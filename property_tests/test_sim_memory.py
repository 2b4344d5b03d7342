"""sim.memory.release_memory: a finished run's cyclic garbage is freed when it is called."""

from __future__ import annotations

import gc
import weakref

from mamba_radix.sim.memory import release_memory


class _Node:
    def __init__(self) -> None:
        self.parent: _Node | None = None
        self.children: list[_Node] = []


def test_release_memory_frees_cyclic_garbage_at_once():
    """A parent/child cycle (a dead tree's shape) is gone after one call, whatever the collector's
    thresholds would have waited for."""
    gc.disable()  # the call must collect by itself, not because a threshold happened to trip
    try:
        root, child = _Node(), _Node()
        root.children.append(child)
        child.parent = root
        alive = weakref.ref(root)
        del root, child
        assert alive() is not None  # only the cycle holds it
        release_memory()
        assert alive() is None
        release_memory()  # a second call (heap already trimmed) is harmless
    finally:
        gc.enable()
