"""A deliberately small prefix cache with state checkpoints: the "your engine" of docs/invariant-suite.md's "Test your own
cache" section, whose adapter there puts it under the invariant suite.

No tree: one dict entry per resident prefix (a token tuple) with the KV index of its last token, and one per
checkpoint with its state slot. Resident prefixes are prefix-closed (a prefix is resident only if its
parent is); a checkpoint sits on a resident prefix; KV eviction takes least-recently-used unlocked leaves
(with their checkpoints), state eviction takes least-recently-used unlocked checkpoints and leaves their KV
(a KV-only leaf can remain, as in SGLang 0.5.23). A lock on a checkpoint pins it and its whole prefix path.

Costs are linear in the resident prefixes (it is a toy); every method documents its side effects.
"""

from __future__ import annotations

from collections import Counter

__all__ = ["ToyPrefixCache"]


class ToyPrefixCache:
    """KV indices ``1..kv_tokens`` and state slots ``1..state_slots`` (0 is never handed out)."""

    def __init__(self, kv_tokens: int, state_slots: int) -> None:
        self.kv_free = list(range(kv_tokens, 0, -1))
        self.slot_free = list(range(state_slots, 0, -1))
        self.kv_capacity, self.slot_capacity = kv_tokens, state_slots
        self.kv: dict[tuple[int, ...], int] = {}  # resident prefix -> KV index of its last token
        self.states: dict[tuple[int, ...], int] = {}  # checkpointed prefix -> state slot
        self.ids: dict[tuple[int, ...], int] = {}  # resident prefix -> node id (for lock handles)
        self.used: dict[tuple[int, ...], int] = {}  # prefix -> last use (a logical clock)
        self.locks: Counter[tuple[int, ...]] = Counter()
        self.clock = self.next_id = 0
        self.evicted_tokens = self.evicted_states = 0

    # ---------------------------------------------------------------------------------- memory
    def alloc_kv(self, n: int) -> list[int] | None:
        """``n`` free KV indices, or ``None`` (nothing taken) if fewer are free."""
        if n > len(self.kv_free):
            return None
        return [self.kv_free.pop() for _ in range(n)]

    def alloc_slot(self) -> int | None:
        return self.slot_free.pop() if self.slot_free else None

    def free_kv(self, indices: list[int]) -> None:
        self.kv_free.extend(indices)

    def free_slot(self, slot: int) -> None:
        self.slot_free.append(slot)

    # ------------------------------------------------------------------------------------ tree
    def _touch(self, tokens: tuple[int, ...], upto: int) -> None:
        self.clock += 1
        for n in range(1, upto + 1):
            self.used[tokens[:n]] = self.clock

    def match(self, tokens: tuple[int, ...]) -> tuple[int, list[int], int, int]:
        """``(hit, kv_indices, kv_len, node_id)``: the deepest checkpoint prefix, its KV, the longest
        resident prefix and the hit's node id (0: the root). Refreshes the matched path's recency."""
        hit = kv_len = 0
        while kv_len < len(tokens) and tokens[: kv_len + 1] in self.kv:
            kv_len += 1
            if tokens[:kv_len] in self.states:
                hit = kv_len
        self._touch(tokens, kv_len)
        node = self.ids[tokens[:hit]] if hit else 0
        return hit, [self.kv[tokens[:n]] for n in range(1, hit + 1)], kv_len, node

    def insert(self, tokens: tuple[int, ...], kv: list[int], slot: int) -> tuple[int, bool]:
        """Make ``tokens`` resident with a checkpoint in ``slot``; returns ``(prefix_len, exists)``. The
        caller's KV indices for already-resident prefixes are freed; with ``exists`` the caller keeps (and
        frees) its slot."""
        prefix_len = 0
        for n in range(1, len(tokens) + 1):
            if tokens[:n] in self.kv:
                prefix_len = n
                self.free_kv([kv[n - 1]])
            else:
                self.kv[tokens[:n]] = kv[n - 1]
                self.next_id += 1
                self.ids[tokens[:n]] = self.next_id
        exists = tokens in self.states
        if not exists:
            self.states[tokens] = slot
        self._touch(tokens, len(tokens))
        return prefix_len, exists

    def lock(self, node_id: int) -> None:
        if node_id:
            self.locks[self._key(node_id)] += 1

    def unlock(self, node_id: int) -> None:
        if node_id:
            key = self._key(node_id)
            self.locks[key] -= 1
            if not self.locks[key]:
                del self.locks[key]

    def _key(self, node_id: int) -> tuple[int, ...]:
        return next(k for k, i in self.ids.items() if i == node_id)

    def pinned(self) -> set[tuple[int, ...]]:
        """Every prefix on the path of a lock (their KV cannot be evicted)."""
        return {key[:n] for key in self.locks for n in range(1, len(key) + 1)}

    # -------------------------------------------------------------------------------- eviction
    def evict(self, num_tokens: int, num_states: int) -> tuple[int, int]:
        """Evict at least ``num_tokens`` tokens (LRU unlocked leaves, with their checkpoints) and at least
        ``num_states`` checkpoints (LRU unlocked), or all that can go. Returns what left, exactly."""
        tokens = states = 0
        pinned = self.pinned()
        while tokens < num_tokens:
            parents = {k[:-1] for k in self.kv}
            leaves = [k for k in self.kv if k not in parents and k not in pinned]
            if not leaves:
                break
            leaf = min(leaves, key=lambda k: (self.used.get(k, 0), len(k), k))
            self.free_kv([self.kv.pop(leaf)])
            del self.ids[leaf]
            tokens += 1
            if leaf in self.states:
                self.free_slot(self.states.pop(leaf))
                states += 1
        while states < num_states:
            free = [k for k in self.states if k not in self.locks]
            if not free:
                break
            victim = min(free, key=lambda k: (self.used.get(k, 0), len(k), k))
            self.free_slot(self.states.pop(victim))
            states += 1
        self.evicted_tokens += tokens
        self.evicted_states += states
        return tokens, states

    def check(self) -> None:
        """Raise ``AssertionError`` if the structure is broken (prefix-closed, checkpoints resident, pools)."""
        for key in self.kv:
            assert len(key) == 1 or key[:-1] in self.kv, f"{key} resident without its parent"
        for key in self.states:
            assert key in self.kv, f"checkpoint {key} without KV"
        assert len(self.kv_free) + len(self.kv) == self.kv_capacity, "KV indices leaked or doubled"
        assert len(self.slot_free) + len(self.states) == self.slot_capacity, "state slots leaked or doubled"
