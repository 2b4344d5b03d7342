"""A brute-force reference of a prefix cache's observable behaviour.

The oracle knows nothing about nodes, edges or eviction orders. It keeps the content the cache was last
seen to hold, as plain sets of prefixes (page-aligned, so a prefix names one page of KV):

- ``kv``: every resident prefix key ``(extra_key, tokens[:n])``, ``n`` a multiple of the page size ->
  the KV indices of its last page;
- ``checkpoints``: the prefix keys that carry a state checkpoint.

Between two observations an operation may *add* content only where the machine announced it
(:meth:`PrefixOracle.allow_kv` / :meth:`PrefixOracle.allow_checkpoints`: what an insert or a request handed
to the cache) and may *remove* anything that is not locked. :meth:`PrefixOracle.observe` checks a fresh
:class:`~mamba_radix.testing.adapter.TreeSnapshot` against those rules and then adopts it. So "a match never
returns more than was inserted and not evicted" becomes: the snapshot never holds an unannounced prefix, the
indices under a resident prefix never change, and a match returns exactly the deepest checkpoint prefix of
its key in the last verified snapshot (:meth:`PrefixOracle.expect_match`).

Cost: all methods are O(total resident tokens x key length) in the worst case; the suite keeps the cache
tiny, so clarity beats speed here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mamba_radix.testing.adapter import Key, TreeSnapshot

__all__ = ["ROOT_KEY", "ExpectedMatch", "OracleViolation", "PrefixOracle"]

ROOT_KEY: Key = (None, ())


class OracleViolation(AssertionError):
    """The cache did something no correct cache may do; the message says what and where."""


@dataclass(frozen=True)
class ExpectedMatch:
    """What a correct match of a key returns, given the last verified content.

    ``hit_len``: length of the deepest checkpoint prefix of the key; ``kv_indices``: the indices of that
    prefix; ``full_kv_hit_len``: the longest resident KV prefix, whole pages only.
    """

    hit_len: int
    kv_indices: tuple[int, ...]
    full_kv_hit_len: int


def _page_keys(extra_key: Any, tokens: Sequence[int], page: int) -> Iterable[Key]:
    """The page-aligned prefix keys of ``tokens``, shortest first."""
    t = tuple(tokens)
    return ((extra_key, t[:n]) for n in range(page, len(t) + 1, page))


class PrefixOracle:
    """Expected content of the cache plus the rules that content may change by.

    ``page_size``: matches compare whole pages; ``grid``: the checkpoint grid (``lcm(state chunk, page)``)
    used to judge ``mamba_branching_seqlen``.
    """

    def __init__(self, page_size: int, grid: int, kv_only_leaves: bool = False) -> None:
        self.kv_only_leaves = kv_only_leaves
        self.page_size = page_size
        self.grid = grid
        self.kv: dict[Key, tuple[int, ...]] = {}
        self.checkpoints: set[Key] = set()
        self._allowed_kv: dict[Key, set[tuple[int, ...]]] = {}
        self._allowed_ckpt: set[Key] = set()

    # ----------------------------------------------------------------------------------- announcements
    def allow_kv(self, extra_key: Any, tokens: Sequence[int], indices: Sequence[int], start: int = 0) -> None:
        """The whole pages of ``tokens`` past ``start`` may become resident with these indices during this
        step. ``start`` is rounded down to a page; a trailing partial page is not offered."""
        if len(indices) < len(tokens):
            raise ValueError("one index per token is needed")
        t, page = tuple(tokens), self.page_size
        idx = tuple(int(i) for i in indices)
        for n in range(start - start % page + page, len(t) + 1, page):
            self._allowed_kv.setdefault((extra_key, t[:n]), set()).add(idx[n - page : n])

    def allow_checkpoints(self, extra_key: Any, tokens: Sequence[int], lengths: Iterable[int]) -> None:
        """Checkpoints at these prefix lengths of ``tokens`` may appear during this step."""
        t = tuple(tokens)
        for n in lengths:
            if n > 0:
                self._allowed_ckpt.add((extra_key, t[:n]))

    # ----------------------------------------------------------------------------------------- queries
    def expect_match(self, extra_key: Any, tokens: Sequence[int]) -> ExpectedMatch:
        """The match a correct cache returns for ``tokens``, from the last verified content. O(len)."""
        t = tuple(tokens)
        page = self.page_size
        usable = len(t) - len(t) % page
        hit = 0
        kv_len = 0
        for n in range(page, usable + 1, page):
            # a page matches only if all of its tokens are resident
            if (extra_key, t[:n]) not in self.kv:
                break
            kv_len = n
            if (extra_key, t[:n]) in self.checkpoints:
                hit = n
        indices = tuple(i for n in range(page, hit + 1, page) for i in self.kv[(extra_key, t[:n])])
        return ExpectedMatch(hit, indices, kv_len)

    def check_branching(self, full_kv_hit_len: int, hit_len: int, branching: int | None) -> None:
        """``mamba_branching_seqlen`` is the KV match rounded down to the grid, when that lies past the hit.

        Accepted: ``None`` when the rounded length does not lie past the hit (engines differ on whether
        they report it then); otherwise exactly the rounded length.
        """
        rounded = full_kv_hit_len // self.grid * self.grid
        if branching is None:
            if rounded > hit_len:
                raise OracleViolation(
                    f"mamba_branching_seqlen is None but KV matched {full_kv_hit_len} tokens past "
                    f"the hit {hit_len} (grid {self.grid}: expected {rounded})"
                )
            return
        if branching != rounded or branching <= 0:
            raise OracleViolation(
                f"mamba_branching_seqlen {branching} != full KV match {full_kv_hit_len} rounded "
                f"down to the grid {self.grid} ({rounded})"
            )

    # ------------------------------------------------------------------------------------ observation
    def observe(
        self,
        snap: TreeSnapshot,
        locked: Iterable[Key],
        kv_only: Iterable[Key] = (),
        kv_locked_now: Iterable[Key] = (),
    ) -> None:
        """Check ``snap`` against the last content, the announcements and the locks, then adopt it.

        ``locked``: node keys held locked (by the machine or by running requests) since before the step;
        their KV path, with the same indices, and their checkpoint must still be resident, except the
        checkpoint of a key that only KV-only locks held (``kv_only``, a sub-multiset of ``locked``: SGLang's
        ``SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK`` hand-over lock leaves it evictable). ``kv_locked_now``: keys
        KV-only locked at this observation, whose node may be a tombstone leaf. Raises
        :class:`OracleViolation`. O(resident pages + locked path pages).
        """
        problems: list[str] = []
        locked = list(locked)
        # keys whose checkpoint some lock held throughout covers: the KV-only locks taken out, one each
        checkpoint_locked = Counter(locked)
        checkpoint_locked.subtract(Counter(kv_only))
        page = self.page_size
        for key, idx in snap.kv.items():
            extra, toks = key
            if len(toks) % page or not toks:
                problems.append(f"KV prefix {key} does not end on a page boundary")
                continue
            if len(toks) > page and (extra, toks[:-page]) not in snap.kv:
                problems.append(f"KV prefix {key} is resident but its parent prefix is not")
            if key in self.kv and self.kv[key] == idx:
                continue
            allowed = self._allowed_kv.get(key)
            if allowed is None or idx not in allowed:
                old = self.kv.get(key)
                why = "was never inserted" if old is None else f"held index {old} before"
                problems.append(f"KV prefix {key} -> index {idx}: {why} and nothing announced index {idx}")
        for key in snap.checkpoints:
            if key == ROOT_KEY:
                problems.append("the root holds a checkpoint")
                continue
            if key not in snap.kv:
                problems.append(f"checkpoint {key} has no resident KV")
            if key not in self.checkpoints and key not in self._allowed_ckpt:
                problems.append(f"checkpoint {key} appeared without an insert of that prefix")
        for key in locked:
            if key == ROOT_KEY:
                continue
            if checkpoint_locked[key] > 0 and key not in snap.checkpoints:
                problems.append(f"locked node {key} lost its checkpoint")
            extra, toks = key
            for pk in _page_keys(extra, toks, page):
                if pk not in snap.kv:
                    problems.append(f"locked path {key} lost its KV at {pk}")
                    break
                if pk in self.kv and self.kv[pk] != snap.kv[pk]:
                    problems.append(
                        f"locked path {key}: index of {pk} changed {self.kv[pk]} -> {snap.kv[pk]}"
                    )
                    break
        # a maximal resident prefix is the end of a leaf, and a leaf is never a tombstone (unless the
        # cache keeps KV-only leaves on purpose, SGLang 0.5.23, or a KV-only lock holds it)
        if not self.kv_only_leaves:
            extended = {(e, t[:-page]) for (e, t) in snap.kv}
            kv_held = set(kv_locked_now)
            for key in snap.kv:
                if key not in snap.checkpoints and key not in extended and key not in kv_held:
                    problems.append(
                        f"leaf {key} is a tombstone (resident KV with no checkpoint and no child)"
                    )
        if problems:
            raise OracleViolation("oracle: " + "; ".join(problems[:8]))
        self.kv = dict(snap.kv)
        self.checkpoints = set(snap.checkpoints)
        self._allowed_kv.clear()
        self._allowed_ckpt.clear()
