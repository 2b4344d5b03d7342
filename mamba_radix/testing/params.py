"""Strategies of :class:`~mamba_radix.testing.adapter.SuiteParams`: tiny, consistent configurations.

:func:`suite_params` draws the knobs every cache of the SGLang family has, consistently with the rules
such caches share (no_buffer runs unpaged and without overlap scheduling, extra_buffer_lazy needs
overlap; chunk sizes and the decode track interval are page multiples when paged), so an adapter gets
only configurations its engine can build. An engine with its own rules narrows the choices with the
arguments and, where a rule is its own, maps the draw through its configurator (``.filter``/``.map``),
as :func:`mamba_radix.testing.sglang_adapter.sglang_params` does. Engine-only knobs are drawn by the
engine's own strategy (:func:`mamba_radix.testing.radix_adapter.radix_params`).

Tiny on purpose: 12-64 KV tokens and a few state slots make eviction, tombstones and slot exhaustion
happen in almost every example.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hypothesis import strategies as st

from mamba_radix.config import CacheConfig
from mamba_radix.testing.adapter import SuiteParams

__all__ = ["STRATEGIES", "slots_per_request", "suite_params"]

STRATEGIES: tuple[str, ...] = ("no_buffer", "extra_buffer", "extra_buffer_lazy")


def slots_per_request(strategy: str, overlap: bool) -> int:
    """State slots SGLang sizes per running request (``_calculate_mamba_ratio``), as the config's
    :class:`~mamba_radix.config.SlotBudget` (the one home of the rule) derives them: 3 (the live slot and
    checkpoint headroom), plus the track slots a request holds (2 with overlap scheduling, 1 without; lazy
    1). O(1)."""
    config = CacheConfig(mamba_radix_cache_strategy=strategy, disable_overlap_schedule=not overlap)  # type: ignore[arg-type]
    return config.slots_per_request


@st.composite
def suite_params(
    draw: st.DrawFn,
    strategies: Sequence[str] = STRATEGIES,
    page_sizes: Sequence[int] = (1, 2, 4),
    caps: Sequence[int] = (-1, -1, 1, 2, 3),
    kv_only_leaves: Sequence[bool] = (False, True),
    kv_tokens: tuple[int, int] = (12, 64),
    spare_slots: tuple[int, int] | None = None,
    prefill_chunks: Sequence[int] = (2, 3, 4, 6, 8),
    kv_tokens_by_page: Mapping[int, tuple[int, int]] | None = None,
    req_rows: tuple[int, int] = (1, 3),
) -> SuiteParams:
    """A consistent :class:`SuiteParams`. ``strategies``/``page_sizes``/``caps``/``kv_only_leaves``: the
    choices (pass a single one to fix a knob); ``kv_tokens``: the KV pool's range in tokens, or
    ``kv_tokens_by_page[page_size]`` where given (large pages need more tokens for the same few pages: a
    pool of two 16-token pages admits almost nothing). State slots range from one request's share
    (:func:`slots_per_request`) to three requests' worth plus four checkpoints, or to the share plus
    ``spare_slots`` (a range) when given. ``prefill_chunks``: the unpaged chunk sizes (paged: one to three
    pages). ``req_rows``: the range of request rows. With the defaults of the last two arguments the draws
    are the same as before they existed."""
    strategy = draw(st.sampled_from(list(strategies)))
    page = 1 if strategy == "no_buffer" else draw(st.sampled_from(list(page_sizes)))
    overlap = {"no_buffer": False, "extra_buffer_lazy": True}.get(strategy)
    if overlap is None:
        overlap = draw(st.booleans())
    per_request = slots_per_request(strategy, overlap)
    tokens = draw(st.integers(*(kv_tokens_by_page or {}).get(page, kv_tokens)))
    return SuiteParams(
        page_size=page,
        strategy=strategy,
        overlap=overlap,
        max_states_per_path=draw(st.sampled_from(list(caps))),
        kv_pages=max(tokens // page, 2),
        state_slots=per_request + draw(st.integers(*(spare_slots or (0, 2 * per_request + 4)))),
        req_rows=draw(st.integers(*req_rows)),
        state_chunk=draw(st.sampled_from([1, 2, 4])),
        # a page multiple when paged: chunks then start on page boundaries, so checkpoints land on pages
        prefill_chunk=draw(st.sampled_from(list(prefill_chunks)))
        if page == 1
        else page * draw(st.integers(1, 3)),
        track_interval=page * draw(st.integers(1, 3)),
        kv_only_leaves=draw(st.sampled_from(list(kv_only_leaves))),
    )
