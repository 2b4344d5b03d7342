"""Checks of a cache against its pools and against plain arithmetic over a snapshot.

Each function takes plain data (a :class:`~mamba_radix.testing.adapter.TreeSnapshot`, an
:class:`~mamba_radix.testing.adapter.Ownership`, views of running requests) and raises
:class:`SuiteViolation` with a readable message; none has side effects. Costs are linear in what they
inspect (resident prefixes, allocated indices), plus a sort of the allocated indices.

- :func:`check_conservation`: every allocated KV index / state slot / request row is held by exactly one
  owner (tree, a running request, the fault injector), nothing is held that the pool thinks is free, and
  the pool's free count adds up (no leaks, no double ownership).
- :func:`check_accounting`: the cache's evictable/protected counters equal what the locks imply.
- :func:`check_stamps`: every checkpoint slot holds the state stamped for its own prefix.
- :func:`check_running`: what a running request holds locked is still in the tree, with its indices, and
  its live state is the state of its own prefix.
- :func:`check_path_cap`: the soft per-path checkpoint cap after an insert.
- :func:`check_pools_full`: after releasing and evicting everything, every pool is whole again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from mamba_radix.testing.adapter import Key, Ownership, RunningView, TreeSnapshot
from mamba_radix.testing.stamps import expected_stamp

__all__ = [
    "SuiteViolation",
    "check_accounting",
    "check_cap_policy",
    "check_conservation",
    "check_path_cap",
    "check_pools_full",
    "check_running",
    "check_stamps",
    "expected_stamp",
]


class SuiteViolation(AssertionError):
    """A conservation, accounting or state-content check failed."""


def check_conservation(own: Ownership) -> None:
    """Every allocated page is owned exactly once and every owned page is allocated. O(n log n).

    Ownership is compared per page (``index // page_size``): a request's partly filled last page belongs
    to it as a whole. Two owners of one page, an owned page the pool calls free, an allocated page nobody
    owns (a leak), or a free count that does not add up raise :class:`SuiteViolation`. A pool that cannot
    list its allocations (``allocated=None``) is checked by counts: owned pages plus free pages must be
    the capacity (a leak leaves fewer, a page owned but free more).
    """
    ps = own.page_size
    first = ps if own.first_index is None else own.first_index
    unit, one = ("pages", "page") if ps > 1 else ("entries", "entry")
    holder: dict[int, str] = {}
    problems: list[str] = []
    for name, indices in own.owners.items():
        seen_here: set[int] = set()
        counts = Counter(int(i) for i in indices)
        dup = sorted(i for i, c in counts.items() if c > 1)
        if dup:
            problems.append(f"{own.name}: {name} holds {dup[:6]} twice")
        for i in counts:
            if i < first:  # page 0 (index 0 when unpaged) is the padding sink
                problems.append(f"{own.name}: {name} holds padding index {i}")
            page = i // ps
            if page in seen_here:
                continue
            seen_here.add(page)
            other = holder.get(page)
            if other is not None:
                problems.append(f"{own.name}: {one} {page} (index {i}) owned by both {other} and {name}")
            else:
                holder[page] = name
    owned_pages = set(holder)
    capacity_pages = own.capacity // ps
    available_pages = own.available // ps
    if own.allocated is None:
        if available_pages + len(owned_pages) != capacity_pages:
            problems.append(
                f"{own.name}: {available_pages} free + {len(owned_pages)} owned {unit} != capacity "
                f"{capacity_pages} ({'a leak' if available_pages + len(owned_pages) < capacity_pages else 'owned but free'})"
            )
        if problems:
            raise SuiteViolation("conservation: " + "; ".join(problems[:8]))
        return
    allocated_pages = {int(i) // ps for i in own.allocated}
    if owned_pages - allocated_pages:
        bad = sorted(owned_pages - allocated_pages)[:6]
        problems.append(
            f"{own.name}: {unit} {bad} are owned ({[holder[p] for p in bad]}) but free in the pool"
        )
    if allocated_pages - owned_pages:
        problems.append(
            f"{own.name}: {unit} {sorted(allocated_pages - owned_pages)[:6]} leaked (allocated, no owner)"
        )
    if available_pages + len(allocated_pages) != capacity_pages:
        problems.append(
            f"{own.name}: {available_pages} free + {len(allocated_pages)} allocated {unit} != capacity "
            f"{capacity_pages}"
        )
    if problems:
        raise SuiteViolation("conservation: " + "; ".join(problems[:8]))


def _prefixes_of(keys: Iterable[Key], page: int) -> set[Key]:
    """Every page-aligned prefix of every key (the keys included)."""
    out: set[Key] = set()
    for extra, toks in keys:
        for n in range(page, len(toks) + 1, page):
            out.add((extra, toks[:n]))
    return out


def check_accounting(
    snap: TreeSnapshot, locked: Iterable[Key], page: int, kv_only: Iterable[Key] = ()
) -> None:
    """The cache's size counters against the snapshot and the locks. O(resident + locked tokens).

    A lock covers the KV of the whole path to the root and the checkpoint of the locked node only (a
    KV-only lock, SGLang's ``SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK`` hand-over lock, not even that: ``kv_only``
    is the sub-multiset of ``locked`` taken that way), so: protected tokens = resident pages on the path
    of a locked key; protected states = keys some full lock holds that hold a checkpoint; evictable = the
    rest.
    """
    locked = list(locked)
    covered = _prefixes_of(locked, page) & snap.kv.keys()
    full_locks = Counter(locked)
    full_locks.subtract(Counter(kv_only))
    protected_states = {k for k, n in full_locks.items() if n > 0 and k in snap.checkpoints}
    expected = {
        "full_protected": page * len(covered),
        "full_evictable": page * (len(snap.kv) - len(covered)),
        "mamba_protected": len(protected_states),
        "mamba_evictable": len(snap.checkpoints) - len(protected_states),
    }
    wrong = {k: (snap.counters.get(k), v) for k, v in expected.items() if snap.counters.get(k) != v}
    if wrong:
        detail = ", ".join(f"{k} = {got} (expected {want})" for k, (got, want) in wrong.items())
        raise SuiteViolation(f"accounting: {detail}")


def check_stamps(snap: TreeSnapshot, read_stamp: Callable[[int], tuple[int, int]]) -> None:
    """Every checkpoint slot holds the stamp of its own prefix. O(checkpoints x stamp read)."""
    for (extra, toks), slot in snap.checkpoints.items():
        got = read_stamp(slot)
        want = expected_stamp(toks)
        if got != want:
            raise SuiteViolation(
                f"checkpoint {(extra, toks)} in slot {slot} holds the state of a {got[1]}-token prefix "
                f"(stamp {got}), expected {want}"
            )


def check_running(
    views: Iterable[RunningView], snap: TreeSnapshot, read_stamp: Callable[[int], tuple[int, int]], page: int
) -> list[Key]:
    """Running requests keep what they locked; their live state matches their KV. Returns their lock keys.

    For each request: the locked node is in the tree and ends at ``protected_len``; the tree's KV indices of
    ``tokens[:protected_len]`` are the first entries of its row; its live slot holds the stamp of
    ``tokens[:kv_len]``. O(sum of protected lengths).
    """
    keys: list[Key] = []
    for v in views:
        key = snap.node_keys.get(v.lock_node)
        if key is None:
            raise SuiteViolation(f"req {v.rid}: its locked node was removed from the tree")
        if key[0] != v.extra_key and key[1]:
            raise SuiteViolation(
                f"req {v.rid}: locked node {key} is in another namespace than {v.extra_key!r}"
            )
        if len(key[1]) != v.protected_len or key[1] != v.tokens[: v.protected_len]:
            raise SuiteViolation(
                f"req {v.rid}: locked node {key} does not end at its protected prefix of {v.protected_len}"
            )
        for n in range(page, v.protected_len + 1, page):
            pk = (v.extra_key, v.tokens[:n])
            if snap.kv.get(pk) != v.row[n - page : n]:
                raise SuiteViolation(
                    f"req {v.rid}: the page ending at {n} of its locked prefix is {v.row[n - page : n]} in "
                    f"its row but {snap.kv.get(pk)} in the tree"
                )
        if v.live_slot is not None:
            got = read_stamp(v.live_slot)
            want = expected_stamp(v.tokens[: v.kv_len])
            if got != want:
                raise SuiteViolation(
                    f"req {v.rid}: live slot {v.live_slot} holds stamp {got}, expected the state at "
                    f"{v.kv_len} tokens {want}"
                )
        keys.append(key)
    return keys


def check_path_cap(
    snap: TreeSnapshot, new_checkpoints: Iterable[Key], cap: int, locked: Iterable[Key], page_size: int
) -> None:
    """The soft per-path cap after an insert that added checkpoints. O(path length x resident).

    For every checkpoint added by this step (the tail of an insert): if its root path holds more than
    ``cap`` checkpoints, none of the extra ones may be removable, i.e. every other holder on the path is a
    fork (children != 1) or locked.
    """
    if cap < 0:
        return
    locked_prefixes = _prefixes_of(locked, page_size)
    children = _children(snap, page_size)
    for tail in new_checkpoints:
        if tail not in snap.checkpoints:
            continue  # removed again in the same step (e.g. evicted): nothing to judge
        extra, toks = tail
        holders = [
            (extra, toks[:n])
            for n in range(page_size, len(toks), page_size)
            if (extra, toks[:n]) in snap.checkpoints
        ]
        if len(holders) + 1 <= cap:
            continue
        removable = [h for h in holders if len(children.get(h, ())) == 1 and h not in locked_prefixes]
        if removable:
            raise SuiteViolation(
                f"per-path cap {cap}: path to {tail} holds {len(holders) + 1} checkpoints, yet "
                f"{removable[:4]} are neither forks nor locked"
            )


def _children(snap: TreeSnapshot, page_size: int) -> dict[Key, set[tuple[int, ...]]]:
    """Prefix key -> the distinct next pages resident below it (the node's children, per page)."""
    children: dict[Key, set[tuple[int, ...]]] = {}
    for extra, toks in snap.kv:
        children.setdefault((extra, toks[:-page_size]), set()).add(toks[-page_size:])
    return children


def check_cap_policy(
    before: TreeSnapshot,
    after: TreeSnapshot,
    new_checkpoints: Iterable[Key],
    cap: int,
    locked: Iterable[Key],
    page_size: int,
) -> None:
    """A step that evicted nothing removed only what the per-path cap may drop. O(removed x path).

    Call it only when the cache's eviction totals did not move during the step. Then a checkpoint can only
    have left through the cap, and the cap (SGLang PR #31230) drops a checkpoint only if all of these
    hold: a cap is set; it lies on the root path of a checkpoint this step added; it is not a fork (the
    node continues with exactly one page) and not in ``locked`` (locks held across the whole step); and
    its KV stays (the node
    becomes a tombstone). No KV prefix may leave either. A cap that drops forks, the new tail, a locked
    checkpoint or KV passes the bound check (:func:`check_path_cap`) but not this one.
    """
    gone = [k for k in before.checkpoints if k not in after.checkpoints]
    lost_kv = [k for k in before.kv if k not in after.kv]
    problems: list[str] = []
    if lost_kv:
        problems.append(f"KV prefixes {lost_kv[:3]} left the tree although nothing was evicted")
    if gone:
        new = list(new_checkpoints)
        locked_keys = set(locked)
        children = _children(after, page_size)
        for key in gone:
            extra, toks = key
            on_path = any(e == extra and len(t) > len(toks) and t[: len(toks)] == toks for e, t in new)
            if cap < 0:
                problems.append(f"checkpoint {key} left the tree: nothing was evicted and no cap is set")
            elif not on_path:
                problems.append(f"checkpoint {key} dropped, but it is on no path of a checkpoint added now")
            elif len(children.get(key, ())) != 1:
                problems.append(
                    f"the per-path cap {cap} dropped checkpoint {key}, a fork ({len(children.get(key, ()))} "
                    "children): forks are never dropped"
                )
            elif key in locked_keys:
                problems.append(f"the per-path cap {cap} dropped checkpoint {key}, which was locked")
    if problems:
        raise SuiteViolation("cap policy: " + "; ".join(problems[:6]))


def check_pools_full(records: Iterable[Ownership]) -> None:
    """After everything is released and evicted, every pool is entirely free."""
    for own in records:
        held = {name: sorted(set(idx))[:6] for name, idx in own.owners.items() if idx}
        if own.available != own.capacity or own.allocated or held:
            raise SuiteViolation(
                f"teardown: pool {own.name} has {own.available}/{own.capacity} free, allocated "
                f"{sorted(own.allocated or [])[:6]}, still held: {held}"
            )
