"""Peers as policies (DESIGN.md §9): other systems' prefix-cache policies, expressed in our knobs.

Each preset is a function of the current :class:`~mamba_radix.config.CacheConfig` that returns the
fields to change (``{field: value}``); :func:`apply_peer` applies them and validates the result, so a
peer runs through the very same cache, pools and simulator as everything else and only the policy
differs. The ideas come from ``reference/anchors.md`` (Marconi §1, vLLM §2) and
``reference/sglang-semantics.md`` (§4.5-4.6, §7.1); the code is ours (Marconi's is CC BY-NC: ideas
only). Every description says what is *not* equivalent to the real system.

**Names.** A preset is a set of config knobs; a *policy* of the experiment
(:data:`mamba_radix.policies.registry.POLICIES`) may add a policy object. Where both exist under one
name they mean the same rules (``sglang-0.5.20``, ``sglang-0.5.23``). Marconi has two, under two
names: the preset ``marconi-static`` is Marconi's admission with our *static* ``flop_weighted`` eviction
key (:func:`marconi_static`); the policy ``marconi`` is Marconi's own renormalised utility with a tuned
alpha (:mod:`mamba_radix.policies.marconi`). The preset was called ``marconi`` before; that name now
raises a :class:`ConfigError` pointing at both (:data:`RETIRED_PEERS`).

A preset sets only policy fields, plus what the policy cannot run without (``vllm-align`` sets the page
grid; ``vllm-align`` and ``marconi-static`` switch no_buffer to extra_buffer, which they need); memory
budget, model, chunked-prefill size (except for rounding it to whole blocks) and overlap stay the
caller's. The fields a peer sets win over the caller's: apply it after the flags.

Use::

    config = apply_peer(CacheConfig(...), "marconi-static")  # ConfigError for an unknown name
    changes = peer_changes(config, "vllm-align")          # the dict alone, e.g. to record in results
    sorted(PEERS)                                         # names, for a --peer choices list
    PEERS["marconi-static"].description                   # one paragraph, for --help or a report
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mamba_radix.config import CacheConfig
from mamba_radix.errors import ConfigError

__all__ = [
    "MARCONI_ADMISSION",
    "PEERS",
    "RETIRED_PEERS",
    "SGLANG_HICACHE_RATIO",
    "Peer",
    "apply_peer",
    "peer_changes",
    "peer_engine_options",
]

Changes = dict[str, Any]


@dataclass(frozen=True)
class Peer:
    """A named policy preset: ``changes(config)`` gives the fields to set; ``description`` says what it
    models and what it does not."""

    name: str
    description: str
    changes: Callable[[CacheConfig], Changes]
    # simulator options (EngineOptions fields) the preset brings where the caller gave none: the host
    # tier's sizing, which needs the device pools and so is no CacheConfig field (peer_engine_options)
    engine_options: tuple[tuple[str, Any], ...] = ()


def _extra_buffer_if_needed(config: CacheConfig) -> Changes:
    """The policies below need tracked checkpoints: turn no_buffer (asked, or what auto resolved to) into
    extra_buffer; leave extra_buffer and extra_buffer_lazy alone."""
    return {"mamba_radix_cache_strategy": "extra_buffer"} if config.strategy == "no_buffer" else {}


def sglang(config: CacheConfig) -> Changes:
    """SGLang today (after PR #31643/#31648): a hit refreshes only the checkpoint it consumes, victims in
    LRU order with leaf-first ties, one checkpoint per prefill chunk (and the branch point); the rules of
    the current release, 0.5.23."""
    return sglang_0_5_23(config)


def _sglang_policy() -> Changes:
    return {
        "mamba_lru_refresh": "node",
        "mamba_eviction_order": "leaf_first",
        "mamba_checkpoint_admission": "all",
        "mamba_decode_insert": False,
    }


def sglang_0_5_20(config: CacheConfig) -> Changes:
    """SGLang 0.5.20's ``MambaRadixCache``: headroom of 3 free slots before every prefill chunk, a deleted
    leaf's stateless ancestors deleted with it."""
    return {**_sglang_policy(), "mamba_slot_headroom": "per_chunk", "mamba_kv_only_leaves": False}


def sglang_0_5_23(config: CacheConfig) -> Changes:
    """SGLang 0.5.23's ``UnifiedRadixCache``: exactly the slots a request takes, evicted when it takes
    them; a deleted leaf's stateless ancestors kept as KV-only leaves."""
    return {**_sglang_policy(), "mamba_slot_headroom": "exact", "mamba_kv_only_leaves": True}


# SGLang's default --hicache-ratio (ServerArgs._handle_hicache_ratio_default; 1.0 only for host-pool decode
# retraction, which we do not model)
SGLANG_HICACHE_RATIO = 2.0


def sglang_0_5_23_hicache(config: CacheConfig) -> Changes:
    """SGLang 0.5.23 with HiCache (``--enable-hierarchical-cache``): the 0.5.23 rules, SGLang's default
    write policy (``write_through``) and its selective threshold (2). The host pools' sizes come from the
    simulator (``host_memory_ratio`` R: each pool R x its device pool, SGLang's ``--hicache-ratio``; the
    preset brings R = 2, SGLang's default, where neither R nor explicit host sizes are given)."""
    return {
        **sglang_0_5_23(config),
        "host_write_policy": "write_through",
        "host_write_through_threshold": 2,
    }


def sglang_legacy(config: CacheConfig) -> Changes:
    """SGLang before PR #31643: a hit (and an insert walk) refreshes every checkpoint of the path, which
    makes ancestors older than their descendants, so eviction is root-first within a path."""
    return {
        **sglang_0_5_20(config),
        "mamba_lru_refresh": "path",
        "mamba_eviction_order": "root_first",
    }


def vllm_align(config: CacheConfig) -> Changes:
    """vLLM's ``--mamba-cache-mode align``: block-aligned states, one block = one page = one grid step.

    The block size is the config's checkpoint grid, ``lcm(mamba_cache_chunk_size, page_size)`` (set
    ``--mamba-cache-chunk-size`` to choose it). Decode checkpoints every block, prefill chunks rounded
    down to whole blocks (as vLLM schedules align-mode prefill), LRU with tail-first ties (vLLM frees a
    chain's blocks in reverse order), only the hit block's state refreshed (earlier Mamba blocks are null).
    """
    block = config.mamba_checkpoint_grid
    changes: Changes = {
        "page_size": block,
        "mamba_cache_chunk_size": block,
        "mamba_track_interval": block,
        "mamba_lru_refresh": "node",
        "mamba_eviction_order": "leaf_first",
        "mamba_checkpoint_admission": "all",
    }
    if config.chunked_prefill_size > 0:
        changes["chunked_prefill_size"] = max(block, config.chunked_prefill_size // block * block)
    changes.update(_extra_buffer_if_needed(config))  # pages > 1 need it anyway
    return changes


# Marconi's admission (MLSys'25): a prompt keeps prefill checkpoints only at its branch point and its end,
# and a hit refreshes only the consumed node (its V2). The one home of that rule: the static preset below
# (marconi_static) and the policy of Marconi's utility (mamba_radix.policies.marconi) both apply it.
MARCONI_ADMISSION: Changes = {"mamba_checkpoint_admission": "branch_and_end", "mamba_lru_refresh": "node"}


def marconi_static(config: CacheConfig) -> Changes:
    """The preset ``marconi-static``: Marconi (MLSys'25) as config knobs, its admission and our static
    FLOP-aware eviction key (``flop_weighted``, one fixed ``mamba_flop_weight``). Not the policy
    ``marconi`` (:class:`mamba_radix.policies.marconi.Marconi`: renormalised utility, alpha tuned on a
    warm-up)."""
    return {**_extra_buffer_if_needed(config), **MARCONI_ADMISSION, "mamba_eviction_order": "flop_weighted"}


PEERS: dict[str, Peer] = {
    peer.name: peer
    for peer in (
        Peer(
            "sglang",
            "SGLang's MambaRadixCache as of PR #31643/#31648 (2026-07): on a hit only the consumed "
            "checkpoint is refreshed and an insert walk does not re-stamp existing ones; victims in LRU "
            "order (ties, which only a shared stamp makes, go deepest first); under extra_buffer one "
            "checkpoint per prefill chunk at its last aligned position, or the branch point. These are "
            "our defaults. Not equivalent: SGLang's LRU lists are strict orders where we break equal "
            "stamps by depth. The release rules are those of sglang-0.5.23.",
            sglang,
        ),
        Peer(
            "sglang-0.5.20",
            "SGLang 0.5.20's MambaRadixCache, per request in sequential replay: the 'sglang' policy, plus "
            "its slot headroom (before admission and before every later prefill chunk, checkpoints are "
            "evicted until 3 slots are free, 2 when lazy: alloc_req_slots) and its leaf deletion (a "
            "deleted leaf's ancestors without a state go with it, KV included). Checked against SGLang's "
            "own cache (experiments/sglang_parity.py). Not equivalent: overlap scheduling's one-step "
            "lookahead, speculative decoding, HiCache, and the batch-wide headroom (we take it per "
            "request, which is the same in sequential replay).",
            sglang_0_5_20,
        ),
        Peer(
            "sglang-0.5.23",
            "SGLang 0.5.23's UnifiedRadixCache (Python and Rust tree cores agree), the current release and "
            "our defaults: the 'sglang' policy, exactly the slots a request takes evicted when it takes "
            "them, and a deleted leaf's stateless ancestors kept as KV-only leaves (their KV still tells "
            "a later request where to checkpoint the branch). Not equivalent: as sglang-0.5.20.",
            sglang_0_5_23,
        ),
        Peer(
            "sglang-0.5.23-hicache",
            "SGLang 0.5.23's UnifiedRadixCache with HiCache for hybrids (--enable-hierarchical-cache, #19663, "
            "#23316): the sglang-0.5.23 rules, a host KV pool and a host Mamba state pool each --hicache-ratio "
            "x its device pool (host_memory_ratio; 2, SGLang's default, unless given; --hicache-size G splits G "
            "GB in proportion to the device pools' bytes, the same proportion), its default write policy "
            "write_through (a node is backed up when an insert creates it or gives it a checkpoint, if its "
            "parent has a host copy), and a hit that ends in host-only nodes loads their KV and the deepest "
            "host checkpoint (one state slot) back before the forward. Not equivalent: as sglang-0.5.23; host "
            "KV rounded down to whole pages where SGLang adds one page (and one state slot) to int(R x "
            "device); backups and loads are synchronous in the tree (SGLang's finish on a side stream, the "
            "simulator times them on the host link); no L3 storage backend, prefetch or host-pool decode "
            "retraction; write_back copies a victim's missing ancestors first (SGLang copies the victim alone); "
            "host eviction takes host-only leaves LRU from a lazy heap where SGLang keeps a host LRU list.",
            sglang_0_5_23_hicache,
            (("host_memory_ratio", SGLANG_HICACHE_RATIO),),
        ),
        Peer(
            "sglang-legacy",
            "SGLang before PR #31643: every match and insert walk re-stamps all checkpoints of its path, "
            "ancestors ending up older than descendants, so checkpoint eviction goes root-first within a "
            "path (test_mamba_radix_cache_1 tombstones the shallow node first). We stamp the whole path "
            "with one tick and break the tie shallowest first, which gives the same order within a path "
            "and the same LRU order across paths. Admission as today (every chunk).",
            sglang_legacy,
        ),
        Peer(
            "vllm-align",
            "vLLM's --mamba-cache-mode align (PR #30877) with its shared-prefix admission (#37898): "
            "states only on block boundaries, one block = one KV page = one checkpoint grid step (the "
            "block size is the config's grid, lcm(mamba_cache_chunk_size, page_size)), decode "
            "checkpoints every block, prefill chunks in whole blocks, LRU with tail-first ties, only the "
            "hit block refreshed. Not equivalent: vLLM sizes the attention block so one KV page holds as "
            "many bytes as a state page (hundreds to thousands of tokens) and serves KV and states from "
            "one pool and one LRU free queue, evicting any unreferenced block (a chain's tail first), "
            "where we keep two pools, evict KV leaf-first and states by their own order; vLLM reserves "
            "1 + speculative blocks for the running state where we reserve our strategy's slots; our "
            "branch point is always on (vLLM before #37898 had none); and the simulator must cut "
            "shared-budget prefill chunks to whole blocks for positions to stay on the block grid.",
            vllm_align,
        ),
        Peer(
            "marconi-static",
            "Marconi's rules as static config knobs (not the experiment's policy 'marconi', which runs "
            "Marconi's own renormalised utility with a tuned alpha: mamba_radix.policies.marconi). "
            "Marconi (Pan et al., MLSys'25), ideas only (its code is CC BY-NC): at most two prefill "
            "checkpoints per prompt, at the branch point and at the input's end "
            "(mamba_checkpoint_admission=branch_and_end), and FLOP-aware eviction that keeps the "
            "checkpoints saving the most compute per byte (mamba_eviction_order=flop_weighted), a hit "
            "refreshing only the consumed checkpoint. Not equivalent: Marconi renormalises recency and "
            "FLOP efficiency over the live candidates at every eviction (O(n)) with a weight tuned "
            "online by replaying a bootstrap window, where ours is a static O(log n) key with a fixed "
            "exchange rate (mamba_flop_weight, to sweep offline); Marconi checkpoints the exact split "
            "position and the last decoded token, ours the grid position at or before the branch, the "
            "input's last aligned position and the decode interval; Marconi evicts KV by the same "
            "utility and merges a single-child node into its child, ours evicts KV leaf-first LRU and "
            "tombstones.",
            marconi_static,
        ),
    )
}


# Former preset names, each with the one-line message that says where its meaning went. "marconi" was the
# static preset; the name now belongs to the experiment's policy alone, so a run asking for the preset by
# its old name fails instead of silently getting either one.
RETIRED_PEERS: dict[str, str] = {
    "marconi": "the peer preset 'marconi' is now 'marconi-static' (Marconi's admission with the static "
    "flop_weighted eviction key); Marconi's own utility with a tuned alpha is the policy: experiment "
    "--policies marconi",
}


def _lookup(name: str) -> Peer:
    peer = PEERS.get(name)
    if peer is None:
        raise ConfigError(RETIRED_PEERS.get(name) or f"unknown peer {name!r}; use one of {', '.join(PEERS)}")
    return peer


def peer_changes(config: CacheConfig, name: str) -> Changes:
    """The fields peer ``name`` sets, given ``config`` (the preset's full choice, including fields that
    already have that value: record it beside a run's results). Raises :class:`ConfigError` for an
    unknown name, listing the known ones, or for a retired one (:data:`RETIRED_PEERS`), saying where its
    meaning went."""
    return _lookup(name).changes(config)


def peer_engine_options(name: str | None, options: dict[str, Any], config: CacheConfig) -> dict[str, Any]:
    """``options`` (EngineOptions fields) with peer ``name``'s simulator options added where the caller
    set none: ``sglang-0.5.23-hicache`` adds ``host_memory_ratio`` 2 unless the options have a ratio or
    ``config`` has explicit host pools. A new dict; ``options`` as it is for no peer or a peer without
    options. Raises :class:`ConfigError` for an unknown or retired name. O(1)."""
    if name is None:
        return dict(options)
    peer = _lookup(name)
    out = dict(options)
    for key, value in peer.engine_options:
        if out.get(key) is None and not (key == "host_memory_ratio" and config.host_tier):
            out[key] = value
    return out


def apply_peer(config: CacheConfig, name: str) -> CacheConfig:
    """``config`` with peer ``name``'s policy applied and validated. Raises :class:`ConfigError` for an
    unknown name (listing the known ones) or when the result is invalid (naming the peer). O(1)."""
    changes = peer_changes(config, name)
    try:
        return config.replace(**changes)
    except ConfigError as err:
        raise ConfigError(f"peer={name!r}: {err}") from err
