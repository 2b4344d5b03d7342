"""Byte-level invariants of the unified memory pool (:func:`check_unified`), for the test suite.

Checked, each failure an :class:`~mamba_radix.errors.InvariantError` naming the bytes:

- every id is either live or a hole, inside its side's span, never both;
- the boundary is consistent: the state span ends at or below the KV span's start, both spans lie inside
  the buffer past the padding sink, and a side's span respects its cap (the ``floor`` rule);
- no two live ranges overlap (state slots, KV pages and the sink, as byte intervals);
- every byte is exactly one of: sink, live state, state hole, gap, KV hole, live KV, top slack;
- freed ranges are reused: no hole touches the gap (a free at the frontier pulls it back), so a hole is
  handed out before the gap is (the allocator takes holes first);
- the typed views address the buffer: each view's first element of the first live unit lies inside that
  unit's byte range.
"""

from __future__ import annotations

from itertools import pairwise

from mamba_radix.errors import InvariantError
from mamba_radix.pools.unified import KV, STATE, UnifiedMemoryPool

__all__ = ["check_unified"]


def _fail(message: str) -> None:
    raise InvariantError(f"unified pool: {message}")


def _check_side(pool: UnifiedMemoryPool, side: str) -> tuple[set[int], set[int]]:
    a = pool.allocator
    live, holes = set(a.live(side)), set(a.holes(side))
    if live & holes:
        _fail(f"{side} ids both live and free: {sorted(live & holes)[:8]}")
    if side == "low":
        span = set(range(a.min_id["low"], a.low_frontier))
        edge = a.low_frontier - 1
    else:
        span = set(range(a.high_frontier, a.high_end))
        edge = a.high_frontier
    if live | holes != span:
        _fail(
            f"{side} live + holes != its span [{min(span, default=0)}, {max(span, default=-1) + 1}): "
            f"missing {sorted(span - live - holes)[:8]}, outside {sorted((live | holes) - span)[:8]}"
        )
    if edge in holes:
        _fail(f"{side} hole {edge} touches the gap: the frontier did not move back over it")
    cap = a.cap_bytes[side]
    if cap is not None and a.span_bytes(side) > cap:
        _fail(f"{side} span of {a.span_bytes(side)} B exceeds its cap of {cap} B")
    return live, holes


def check_unified(pool: UnifiedMemoryPool) -> None:
    """Raise :class:`InvariantError` unless ``pool``'s byte ranges obey the invariants of the module
    docstring. No side effects. O(live units log live units)."""
    a = pool.allocator
    low_live, low_holes = _check_side(pool, "low")
    high_live, high_holes = _check_side(pool, "high")
    if not (a.reserved_bytes <= a.min_id["low"] * pool.slot_bytes <= a.low_top):
        _fail(f"the state span starts below the sink or past its top ({a.low_top} B)")
    if a.low_top > a.high_bottom:
        _fail(f"the state span ends at byte {a.low_top}, past the KV span's start at {a.high_bottom}")
    top = a.high_end * pool.page_bytes
    if not (a.high_bottom <= top <= pool.total_bytes):
        _fail(f"the KV span [{a.high_bottom}, {top}) leaves the {pool.total_bytes} B buffer")

    intervals = [(0, a.reserved_bytes, "sink")]
    intervals += [(*pool.byte_range(STATE, u), f"state slot {u}") for u in low_live]
    intervals += [(*pool.byte_range(KV, p), f"KV page {p}") for p in high_live]
    intervals.sort()
    for (s0, e0, n0), (s1, e1, n1) in pairwise(intervals):
        if s1 < e0:
            _fail(f"{n0} [{s0}, {e0}) overlaps {n1} [{s1}, {e1})")

    sink_top = a.min_id["low"] * pool.slot_bytes
    parts = {
        "sink": sink_top,
        "live state": len(low_live) * pool.slot_bytes,
        "state holes": len(low_holes) * pool.slot_bytes,
        "gap": a.gap_bytes,
        "KV holes": len(high_holes) * pool.page_bytes,
        "live KV": len(high_live) * pool.page_bytes,
        "slack": pool.total_bytes - top,
    }
    if any(v < 0 for v in parts.values()) or sum(parts.values()) != pool.total_bytes:
        _fail(f"the bytes do not partition the {pool.total_bytes} B buffer: {parts}")

    base = pool.raw.data_ptr()
    for kind, live, views in ((STATE, low_live, pool.tensors), (KV, high_live, _kv_first_views(pool))):
        if not live:
            continue
        unit = min(live)
        start, end = pool.byte_range(kind, unit)
        row = unit if kind == STATE else unit * pool.page_size
        for view in views:
            element = view[0, row] if kind == STATE else view[row]
            offset = element.data_ptr() - base
            if not start <= offset < end:
                _fail(f"a {kind} view addresses byte {offset} for unit {unit}, outside [{start}, {end})")


def _kv_first_views(pool: UnifiedMemoryPool) -> list:
    return [t for layer in pool.kv_views for t in layer]
