"""State stamps without tensors: what a state slot should hold, and a store for caches with no state memory.

A recurrent state is valid only at the exact prefix it summarises. The suite names that prefix by a stamp
``(fingerprint(tokens), len(tokens))`` (:func:`expected_stamp`): an adapter plays the model by writing the
stamp of the tokens a state covers into the slot the state goes to, and the checks compare what a slot
holds with the stamp of the prefix it is supposed to hold.

The fingerprint is the package's one fingerprint, :func:`mamba_radix.state_stamp.fingerprint` (O(len),
deterministic across processes; ``0`` for no tokens, so a zeroed slot holds the stamp of the empty
prefix): a checkpoint the suite stamps in our cache holds the stamp the simulator would write for the same
prefix. No second hash on purpose: the cache under test never computes a stamp, it only moves the bytes
the suite wrote, so the checks compare the suite's stamps with the suite's stamps and a shared hash costs
them nothing. ``state_stamp`` imports torch only when a stamp is written into tensors, so importing the
suite needs numpy but not torch.

Where the state lives is the adapter's business. An adapter over real state tensors writes stamps into
them (our cache: :func:`mamba_radix.state_stamp.write_stamp`, so a copy that skips a layer is caught); an
adapter over counting pools that hold no state memory (SGLang's cache in
:mod:`mamba_radix.testing.sglang_adapter`, the toy cache of the README) keeps a :class:`StampStore`, a
plain dict from slot to stamp that it copies, clears and writes where the engine would copy, clear and
write states.
"""

from __future__ import annotations

from collections.abc import Sequence

from mamba_radix.state_stamp import EMPTY_FINGERPRINT, fingerprint

__all__ = ["EMPTY_STAMP", "StampStore", "expected_stamp"]

EMPTY_STAMP: tuple[int, int] = (EMPTY_FINGERPRINT, 0)  # the state of no tokens: a cleared slot


def expected_stamp(tokens: Sequence[int]) -> tuple[int, int]:
    """The stamp a state summarising ``tokens`` carries: ``(fingerprint(tokens), len(tokens))``. O(len);
    :class:`~mamba_radix.errors.InvalidArgument` unless ``tokens`` are int ids in ``0..2**63-1``."""
    return fingerprint(tokens), len(tokens)


class StampStore:
    """Stamps of state slots for a cache whose pools hold no state memory: slot -> stamp.

    A slot never written (or cleared) holds :data:`EMPTY_STAMP`, as a zeroed state would. All methods
    are O(1) (``write`` is O(len(tokens)) for the fingerprint). Side effects: only on the store.
    """

    def __init__(self) -> None:
        self._stamps: dict[int, tuple[int, int]] = {}

    def write(self, slot: int, tokens: Sequence[int]) -> None:
        """The model left the state of ``tokens`` in ``slot``."""
        self._stamps[int(slot)] = expected_stamp(tokens)

    def read(self, slot: int) -> tuple[int, int]:
        return self._stamps.get(int(slot), EMPTY_STAMP)

    def copy(self, src: int, dst: int) -> None:
        """A slot-to-slot state copy (copy-on-write, a chunk end's checkpoint)."""
        self._stamps[int(dst)] = self.read(src)

    def clear(self, slot: int) -> None:
        """The slot was zeroed (a request without a hit starts from the empty state)."""
        self._stamps.pop(int(slot), None)
