"""The ``plan`` subcommand: flags (SGLang's names) and the printed report.

``mamba_radix.cli`` mounts it as ``mamba-radix plan`` through :func:`add_plan_arguments` and
:func:`run_plan`; ``python -m mamba_radix.capacity.cli`` runs it alone. Sizes are printed as SGLang's logs
print them: ``GB`` is GiB (``1 << 30`` bytes), two decimals for pools and three for ReplaySSM rings; per-slot
state in MB (MiB) to three significant digits and per-token KV in KB (KiB), as the seeds write them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields

from mamba_radix.capacity.formats import FormatSizing
from mamba_radix.capacity.host import HostPlan, HostSplit
from mamba_radix.capacity.memory import GIB, Parallelism, gib, kib, mib, torch_dtype_name
from mamba_radix.capacity.models import load_model
from mamba_radix.capacity.official import SKIP_LOCK_ENV, Comparison, SplitOutcome
from mamba_radix.capacity.options import MemoryComparison, compare_memory_options
from mamba_radix.capacity.planner import Plan, Workload, decode_slots_in_use, plan
from mamba_radix.capacity.sizing import DEFAULT_MAMBA_FULL_MEMORY_RATIO, MemoryBudget, SizingInputs
from mamba_radix.capacity.unified import UnifiedPlan, unified_plan
from mamba_radix.config import CacheConfig
from mamba_radix.defaults import deployment_for
from mamba_radix.errors import ConfigError, InvalidArgument, MambaRadixError

__all__ = [
    "add_plan_arguments",
    "build_host_plan",
    "build_inputs",
    "build_workload",
    "format_comparison",
    "format_host",
    "format_plan",
    "format_unified",
    "main",
    "run_plan",
]


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``plan`` flags to ``parser``: the rows of :mod:`mamba_radix.flags` that ``plan`` uses (SGLang's
    names where SGLang has the flag; the model's deployment defaults shared with ``simulate``)."""
    from mamba_radix.flags import add_flags

    add_flags(parser, "plan")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _given(args: argparse.Namespace, name: str, default: object = None) -> object:
    value = getattr(args, name, None)
    return default if value is None else value


def build_inputs(args: argparse.Namespace) -> SizingInputs:
    """Turn parsed flags into validated :class:`SizingInputs` (raises ConfigError). Flags left out take
    the defaults of :class:`CacheConfig` and of the model's deployment (:func:`deployment_for`)."""
    model_name = _given(args, "model", "kimi-k3")
    model = load_model(str(model_name))
    dep = deployment_for(
        str(model_name),
        tp_size=args.tp_size,
        kv_cache_dtype=args.kv_cache_dtype,
        mamba_ssm_dtype=args.mamba_ssm_dtype,
        mamba_conv_dtype=args.mamba_conv_dtype,
    )
    cache_fields = {
        name: getattr(args, name)
        for name in (
            "page_size", "mamba_radix_cache_strategy", "disable_overlap_schedule", "mamba_track_interval",
            "mamba_cache_chunk_size", "mamba_max_states_per_path", "chunked_prefill_size",
            "speculative_num_draft_tokens", "skip_decode_lock", "disable_radix_cache", "enable_unified_memory",
            "unified_memory_give_way", "disaggregation_mode", *_CHECKPOINT_CONFIG_FIELDS,
        )
        if getattr(args, name, None) is not None
    }  # fmt: skip
    cache = CacheConfig(**cache_fields)  # its own checks: unified memory with spec decoding or PD
    budget = None
    if args.memory_budget_gb is not None:
        if args.gpu_memory_gb is not None:
            raise ConfigError("give either --memory-budget-gb or --gpu-memory-gb with --weights-gb, not both")
        budget = MemoryBudget(args.memory_budget_gb)
    elif args.gpu_memory_gb is not None:
        if args.weights_gb is None:
            raise ConfigError("--gpu-memory-gb needs --weights-gb (the weights each GPU holds)")
        budget = MemoryBudget.from_gpu(
            args.gpu_memory_gb, _given(args, "mem_fraction_static", 0.9), args.weights_gb
        )
    return SizingInputs(
        model=model,
        parallelism=Parallelism(dep.tp_size, _given(args, "dcp_size", 1)),
        cache=cache,
        kv_cache_dtype=dep.kv_cache_dtype,
        mamba_ssm_dtype=dep.mamba_ssm_dtype,
        mamba_conv_dtype=dep.mamba_conv_dtype,
        enable_linear_replayssm_spec=bool(args.enable_linear_replayssm_spec),
        linear_replayssm_cache_len=_given(args, "linear_replayssm_cache_len", 16),
        budget=budget,
        mamba_full_memory_ratio=_given(args, "mamba_full_memory_ratio", DEFAULT_MAMBA_FULL_MEMORY_RATIO),
        max_mamba_cache_size=args.max_mamba_cache_size,
        max_total_tokens=args.max_total_tokens,
        max_running_requests=args.max_running_requests,
        context_len=args.context_length,
        checkpoint_format=getattr(args, "checkpoint_format", None),
        checkpoint_slots=getattr(args, "checkpoint_slots", None),
        enable_hierarchical_cache=bool(getattr(args, "enable_hierarchical_cache", False)),
    )  # type: ignore[arg-type]


# CacheConfig's checkpoint fields, once it has them (until then they are the planner's alone)
_CHECKPOINT_CONFIG_FIELDS = tuple(
    name
    for name in ("checkpoint_format", "checkpoint_slots")
    if name in {f.name for f in fields(CacheConfig)}
)


def build_workload(args: argparse.Namespace) -> Workload | None:
    """The workload from ``--trace`` or ``--input-len``/``--output-len``; None when neither is given."""
    if args.trace is not None:
        if args.input_len is not None or args.output_len is not None:
            raise ConfigError("give either --trace or --input-len/--output-len, not both")
        return Workload.from_trace(args.trace)
    if args.input_len is None and args.output_len is None:
        return None
    if args.input_len is None or args.output_len is None:
        raise ConfigError("a length workload needs both --input-len and --output-len")
    # absent: bench_serving's own default, 0.0 (the flag table's); None would mean fixed lengths
    ratio = 0.0 if args.random_range_ratio is None else args.random_range_ratio
    return Workload.random_range(args.input_len, args.output_len, ratio)


def build_host_plan(args: argparse.Namespace, result: Plan) -> HostPlan | None:
    """``--host-memory-gb``: the host bytes split for the workload (``--trace``: its prefix tree, read once;
    ``--input-len/--output-len``: unique prompts, one point a request), SGLang's split beside it when the
    device pools are known. None without the flag. Raises :class:`ConfigError` without a workload, or for
    host memory that holds no KV page and state slot. O(trace)."""
    gib_value = getattr(args, "host_memory_gb", None)
    if gib_value is None:
        return None
    from mamba_radix.capacity.host import length_coverage, plan_host, workload_coverage

    cache = result.resolution.inputs.cache
    chunk = cache.chunked_prefill_size if cache.uses_extra_buffer else None
    if args.trace is not None:
        from mamba_radix.sim.traces import iter_trace

        coverage = workload_coverage(iter_trace(args.trace), chunk)
    elif result.workload is not None:
        w = result.workload
        coverage = length_coverage(len(w.requests), w.mean_input_len, w.mean_output_len, chunk)
    else:
        raise ConfigError(
            "--host-memory-gb splits host memory for a workload: give --trace (or --input-len/--output-len)"
        )
    r = result.resolution
    kv_bytes = math.ceil(r.kv.bytes_per_token)  # the host KV pool mirrors the device rows, per GPU
    slot_bytes = r.state.slot_bytes  # the host state pool mirrors conv + temporal (no rings)
    state_pool = (r.num_slots + 1) * slot_bytes
    try:
        return plan_host(
            int(gib_value * GIB),
            coverage,
            r.inputs.cache.page_size,
            kv_bytes,
            slot_bytes,
            r.kv_pool_bytes,
            state_pool,
        )
    except InvalidArgument as err:
        raise ConfigError(f"--host-memory-gb {gib_value:g}: {err}") from None


def format_host(h: HostPlan) -> str:
    """The ``--host-memory-gb`` section: the workload's coverage, the planner's split and SGLang's."""
    c = h.coverage
    lines = [
        f"host tier ({gib(h.host_bytes):.2f} GB of host memory per GPU)",
        f"  workload tree           {c.kv_tokens:,} KV tokens, {c.resumable_points:,} resumable points "
        f"({c.sequence_ends:,} sequence ends, {c.branch_points:,} branch points): {c.tokens_per_point:,.0f} "
        f"tokens a point; with {c.chunk_points:,} prefill chunk checkpoints {c.tokens_per_checkpoint:,.0f} "
        "tokens a checkpoint",
    ]

    def row(label: str, s: HostSplit) -> str:
        return (
            f"  {label:<24}{s.kv_tokens:,} host KV tokens ({gib(s.kv_bytes):.2f} GB) + {s.state_slots:,} host "
            f"state slots ({gib(s.state_bytes):.2f} GB) = {s.total_bytes:,} B; {s.tokens_per_slot:,.0f} tokens a slot"
        )

    lines.append(row("planned, resumable", h.resumable))
    lines.append(row("planned, write_through", h.every_checkpoint))
    if h.sglang is not None:
        lines.append(row("sglang --hicache-size", h.sglang))
        lines.append(
            "  (SGLang splits host memory as the device pools' bytes, like --hicache-ratio; the planned splits "
            "give the host one state slot per host copy's KV: under --host-write-policy resumable the geometric "
            "mean of a point's and a checkpoint's, any checkpoint under SGLang's write policies: simulate "
            "--host-split planned)"
        )
    else:
        lines.append("  sglang --hicache-size: give a memory budget to size the device pools it splits by")
    return "\n".join(lines)


def _mb(num_bytes: int) -> str:
    return f"{mib(num_bytes):.3g} MB"


def format_plan(p: Plan) -> str:
    """The human-readable report (pool lines in SGLang's log format)."""
    r = p.resolution
    i = r.inputs
    model, cache = i.model, i.cache
    lines: list[str] = []
    add = lines.append
    overlap = "on" if cache.overlap else "off"
    add(
        f"{model.name}: {model.num_layers} layers = {model.num_linear_layers} {model.linear.kind} + "
        f"{model.num_full_layers} {model.full_attention.kind}; TP {i.parallelism.tp_size}, DCP {i.parallelism.dcp_size}; "
        f"strategy {cache.strategy} (overlap {overlap})"
    )
    add("")
    add("per GPU")
    kv = r.kv
    per_token = float(kv.bytes_per_token)
    add(
        f"  KV per token        {kib(per_token):g} KB ({kv.dtype}: {kv.num_full_layers} layers x "
        f"{kv.elements_per_layer} elements x {kv.element_bytes} B / DCP {kv.dcp_size})"
    )
    st = r.state
    add(
        f"  state per slot      conv {_mb(st.conv_bytes)} {list(st.conv_shape)} {st.conv_dtype} + "
        f"ssm {_mb(st.temporal_bytes)} {list(st.temporal_shape)} {st.ssm_dtype}, x {st.num_linear_layers} layers"
    )
    if r.rings is not None:
        add(f"  rings per slot      {mib(r.rings.slot_bytes):.3f} MB (L={r.rings.cache_len})")
    add(f"  bytes per slot      {r.bytes_per_slot:,} (SGLang's mamba_cache_per_req)")
    add("")
    add("pools (SGLang log lines)")
    if i.budget is not None:
        add(f"  budget {i.budget.rest_gib:.2f} GB, --mamba-full-memory-ratio {i.mamba_full_memory_ratio:g}")
    add(
        f"  Mamba Cache is allocated. max_mamba_cache_size: {r.num_slots}, "
        f"conv_state size: {gib(st.pool_conv_bytes(r.num_slots)):.2f}GB, "
        f"ssm_state size: {gib(st.pool_temporal_bytes(r.num_slots)):.2f}GB"
    )
    if r.rings is not None:
        rings = ", ".join(f"{n}={gib(r.rings.pool_bytes(n, r.num_slots)):.3f}GB" for n in ("d", "k", "g"))
        rest = ", ".join(
            f"{n}={gib(r.rings.pool_bytes(n, r.num_slots)):.3f}GB" for n in ("rawv", "rawk", "beta")
        )
        add(f"  GDN ReplaySSM ring buffers allocated (L={r.rings.cache_len}): {rings} {rest}")
    if r.intermediate_bytes:
        add(f"  speculative intermediate states: {gib(r.intermediate_bytes):.2f}GB")
    if r.num_tokens is not None and r.kv_pool_bytes is not None:
        rows = "" if kv.dcp_size == 1 else f" ({r.kv_rows} rows per GPU)"
        add(
            f"  KV Cache is allocated. dtype: {torch_dtype_name(kv.dtype)}, #tokens: {r.num_tokens}, "
            f"KV size: {gib(r.kv_pool_bytes):.2f} GB{rows}"
        )
    else:
        add("  KV Cache: unknown (give a memory budget or --max-total-tokens)")
    if p.formats is not None:
        _format_checkpoints(p.formats, r.max_running_requests, add)
    add("")
    add("concurrency")
    add(
        f"  slots per request   {r.slots_per_request} ({cache.strategy}"
        f"{', skip-decode-lock' if cache.skip_decode_lock else ''}); "
        f"{decode_slots_in_use(cache)} in use while decoding"
    )
    limits = ", ".join(f"{name} {value}" for name, value in r.limits.items())
    add(f"  max_running_requests {r.max_running_requests}, bound by the {r.binding} ({limits})")
    add(f"  state usage at max_running_requests: {p.state_usage_at_max_running:.2f}")
    if r.message:
        add(f"  {r.message}")
    if p.workload is not None:
        _format_workload(p, add)
    return "\n".join(lines)


def _format_workload(p: Plan, add: Callable[[str], None]) -> None:
    r = p.resolution
    w, counts, b = p.workload, p.checkpoints, p.balance
    assert w is not None and counts is not None and b is not None
    add("")
    add(
        f"workload {w.source} ({len(w.requests)} shape(s), mean in {w.mean_input_len:.0f} / out {w.mean_output_len:.0f})"
    )
    if p.per_request is not None:
        c = p.per_request
        add(
            f"  checkpoints/request prefill {c.prefill} + decode {c.decode} taken; kept {c.kept} "
            f"(seed bound in // chunk + 2 = {c.seed_bound})"
        )
    else:
        add(
            f"  checkpoints/request mean taken {counts.mean_taken:.2f}, kept {counts.mean_kept:.2f} (max {counts.max_kept})"
        )
    if p.kv_usage_at_max_running is not None:
        add(
            f"  at {r.max_running_requests} running: full token usage <= {p.kv_usage_at_max_running:.2f}, "
            f"mamba usage {p.state_usage_at_max_running:.2f}"
        )
        running = min(r.max_running_requests, p.workload_kv_limit or r.max_running_requests)
        add(
            f"  this workload runs {running} at once: KV holds {p.workload_kv_limit}, state admits "
            f"{r.max_running_requests}; bound by the {p.workload_binding}"
        )
    add(f"recommendation at {b.concurrency} running requests")
    add(
        f"  admission only      --mamba-full-memory-ratio {b.ratio_admission:.3f}  "
        f"--max-mamba-cache-size {b.slots_admission}"
    )
    add(
        f"  keep checkpoints    --mamba-full-memory-ratio {b.ratio_with_checkpoints:.3f}  "
        f"--max-mamba-cache-size {b.slots_with_checkpoints}"
    )
    add(f"  KV tokens needed    {b.kv_tokens}")
    if p.max_concurrency_admission is not None:
        memory = r.rest_bytes / GIB if r.rest_bytes else 0.0
        add(
            f"  in {memory:.2f} GB a balanced split runs {p.max_concurrency_admission} requests "
            f"({p.max_concurrency_with_checkpoints} keeping their checkpoints)"
        )
    if p.official is not None:
        _format_official(p.official, add)
    if len(p.dcp_options) > 1:
        add(f"TP {r.inputs.parallelism.tp_size} vs DCP")
        add("  dcp  KV/token/GPU  ratio(admission)  ratio(checkpoints)  max running")
        for o in p.dcp_options:
            running = "-" if o.max_concurrency is None else str(o.max_concurrency)
            add(
                f"  {o.dcp_size:>3}  {kib(o.kv_bytes_per_token):>9.3g} KB  {o.ratio_admission:>16.3f}  "
                f"{o.ratio_with_checkpoints:>18.3f}  {running:>11}"
            )


def _format_checkpoints(f: FormatSizing, running: int, add: Callable[[str], None]) -> None:
    """The checkpoint format's split of the state budget (both counts and the cached prefixes that fit)."""
    if not f.separate_pool:
        add(
            f"  checkpoints in the state pool (model dtype): at {running} running requests "
            f"{f.cached_prefixes(running)} of the {f.working_slots} slots are left for cached prefixes"
        )
        return
    add("")
    add(
        f"checkpoints --checkpoint-format {f.fmt} (equal bytes: the same {gib(f.state_bytes):.2f} GB of state)"
    )
    add(
        f"  working slots       {f.working_slots} x {f.working_slot_bytes:,} B (model dtype, rings included): "
        f"{gib(f.working_pool_bytes):.2f} GB, max_running_requests {f.max_running_requests} "
        f"(bound by the {f.binding})"
    )
    add(
        f"  checkpoint slots    {f.checkpoint_slots} x {f.checkpoint_slot_bytes:,} B ({f.fmt}): "
        f"{gib(f.checkpoint_pool_bytes):.2f} GB; cached prefixes that fit: {f.cached_prefixes(running)}"
    )
    if f.sglang is not None:
        add(
            f"  sglang view         SGLang keeps every state slot and adds an int8 pool of {f.sglang.slots} slots "
            f"({gib(f.sglang.total_bytes):.2f} GB, {f.sglang.bytes_per_slot:,} B a slot: int8 SSM, a scale per "
            "(head, k) in the SSM dtype, conv unquantized) beyond the budget, from --mem-fraction-static headroom"
        )
    elif f.fmt == "fp8_e4m3":
        add("  sglang view         SGLang has no fp8 checkpoint pool (#40706 is open)")
    add(
        "  (the concurrency below is the model format's: every state slot a working slot, as SGLang sizes it)"
    )


def format_unified(u: UnifiedPlan | None, inputs_ratio: float) -> str:
    """The ``--enable-unified-memory`` section: start-up budget, the workload's peak, whether one buffer
    covers it."""
    if u is None:
        return "unified memory: give a workload (--input-len/--output-len or --trace) to see its peak"
    lines = [
        "unified memory (one buffer; the ratio only fixes the start-up split)",
        f"  buffer              {gib(u.buffer_bytes):.2f} GB = sink {u.sink_bytes:,} B + "
        + (f"checkpoint pool {gib(u.checkpoint_pool_bytes):.2f} GB + " if u.checkpoint_pool_bytes else "")
        + f"{gib(u.usable_bytes):.2f} GB shared by KV and states",
        f"  start-up split      --mamba-full-memory-ratio {inputs_ratio:g}: {u.startup_slots} state slots, "
        f"{u.startup_kv_tokens} KV tokens; max_running_requests {u.max_running_requests} (set at start-up)",
        f"  peak at {u.concurrency} running  {u.peak_kv_tokens} KV tokens + {u.peak_state_slots} state slots = "
        f"{gib(u.peak_bytes):.2f} GB; with their {u.peak_checkpoints} checkpoints {gib(u.peak_bytes_with_checkpoints):.2f} GB",
        f"  one buffer covers it: {'yes' if u.covers else 'no'} (reservations), "
        f"{'yes' if u.covers_with_checkpoints else 'no'} (keeping checkpoints); the buffer runs {u.max_concurrency} "
        f"requests ({u.max_concurrency_with_checkpoints} keeping their checkpoints)",
    ]
    if u.capped_by_startup:
        lines.append(
            f"  the start-up split admits only {u.max_running_requests} running requests: raise "
            f"--mamba-full-memory-ratio to {u.startup_ratio:.3f} or more (its slots then admit what the KV holds)"
        )
    return "\n".join(lines)


def format_comparison(c: MemoryComparison, p: Plan) -> str:
    """The ``--compare-memory-options`` table and recommendation."""
    r = p.resolution
    i = r.inputs
    w = p.workload
    assert w is not None
    lines = [
        f"{i.model.name}: TP {i.parallelism.tp_size}, DCP {i.parallelism.dcp_size}; KV {r.kv.dtype}, SSM "
        f"{r.state.ssm_dtype}; strategy {i.cache.strategy}; {c.budget_gib:.2f} GB of KV + state per GPU",
        f"workload {w.source}: peak {c.peak_kv_len:,.0f} KV tokens and {c.kept_per_request:.2f} kept checkpoints "
        f"per request, {r.slots_per_request} slots reserved per running request",
        "",
        f"  {'option':<12}{'checkpoints':<12}{'ratio':>7}{'state':>7}{'ckpt':>8}{'KV tokens':>11}{'running':>9}"
        f"{'w/ ckpts':>10}",
    ]
    for o in c.rows:
        if o.refused:
            lines.append(f"  {o.mechanism:<12}{o.fmt:<12}  refused: {o.refused}")
            continue
        ckpt = "shared" if o.checkpoint_slots is None else str(o.checkpoint_slots)
        lines.append(
            f"  {o.mechanism:<12}{o.fmt:<12}{o.ratio:>7.3f}{o.state_slots:>7}{ckpt:>8}{o.kv_tokens:>11}"
            f"{o.running:>9}{o.with_checkpoints:>10}"
        )
    lines += [
        "  state / ckpt / KV tokens: pools at start-up (ckpt: a quantized pool; shared: checkpoints in the state "
        "slots); running: admitted at once; w/ ckpts: running while each keeps its checkpoints; adaptive and "
        "unified: at the peak",
        "",
        f"recommendation: {c.reason}",
        f"  flags: {c.best.flags}",
    ]
    return "\n".join(lines)


def _signed(value: float | int | None, fmt: str) -> str:
    return "-" if value is None else format(value, "+" + fmt)


def _format_official(c: Comparison, add: Callable[[str], None]) -> None:
    """The "official calculator vs corrected" section: the official r*, then one line per step with its
    difference from the step before (they add up to corrected minus official), then the corrected totals."""
    o = c.official
    budget = "" if o.budget_gib is None else f", in {o.budget_gib:.2f} GB"
    add(f"official calculator vs corrected (same deployment and workload{budget})")
    skip = f" ({o.slots_per_request_without_skip_lock} - {o.skip_lock_drop} under {SKIP_LOCK_ENV})"
    add(
        f"  official r* = (S + D) x token_equiv x dcp / L = ({o.slots_per_request}{skip if o.skip_lock_drop else ''}"
        f" + {o.draft_tokens}) x {o.token_equiv:,.1f} x {o.dcp_size} / {o.context_len:,.1f} = {o.ratio:.3f}"
    )
    add(
        f"    token_equiv = {o.state_bytes_per_slot:,} B per slot / {o.kv_bytes_per_token:,} B per token "
        "(per GPU, KV before DCP)"
    )
    header = f"  {'':<44}{'ratio':>8}{'slots':>8}{'running':>9}{'w/ ckpts':>10}{'kept':>8}"
    add(header)

    def row(label: str, ratio: str, out: SplitOutcome | None, kept: str, totals: bool) -> None:
        if out is None:
            cells = f"{'-':>8}{'-':>9}{'-':>10}"
        elif totals:
            cells = f"{out.slots:>8}{out.max_running_requests:>9}{out.running_with_checkpoints:>10}"
        else:
            cells = ""
        add(f"  {label:<44}{ratio:>8}{cells}{kept:>8}")

    row("official calculator", f"{o.ratio:.3f}", o.outcome, "0", True)
    for before, after in c.deltas():
        label = f"{after.seed}. {after.name}" if after.seed else f"+ {after.name}"
        b, a = before.outcome, after.outcome
        if b is None or a is None:
            cells = f"{'-':>8}{'-':>9}{'-':>10}"
        else:
            cells = (
                f"{_signed(a.slots - b.slots, 'd'):>8}{_signed(a.max_running_requests - b.max_running_requests, 'd'):>9}"
                f"{_signed(a.running_with_checkpoints - b.running_with_checkpoints, 'd'):>10}"
            )
        kept = _signed(after.kept_per_request - before.kept_per_request, ".2f")
        add(f"  {label:<44}{_signed(after.ratio - before.ratio, '.3f'):>8}{cells}{kept:>8}")
        add(f"      {after.detail}")
    final = c.corrected
    row(
        "corrected (recommendation, keep checkpoints)",
        f"{final.ratio:.3f}",
        final.outcome,
        f"{final.kept_per_request:.2f}",
        True,
    )
    add(
        "  slots: max_mamba_cache_size at that ratio; running: SGLang's max_running_requests; w/ ckpts: "
        "requests running at once that keep their checkpoints"
    )
    for label, out in (("official", o.outcome), ("corrected", final.outcome)):
        if out is not None and out.error is not None:
            add(f"  at the {label} ratio SGLang would not start: {out.error}")


def run_plan(args: argparse.Namespace) -> int:
    """Run ``plan`` on parsed flags: print the table (or JSON with ``--json``); 0 on success.

    Bad input raises :class:`~mamba_radix.errors.ConfigError` (the caller prints one line, exits 2).
    """
    inputs = build_inputs(args)
    workload = build_workload(args)
    compare = bool(getattr(args, "compare_memory_options", False))
    if compare and workload is None:
        raise ConfigError(
            "--compare-memory-options needs a workload: give --input-len/--output-len or --trace"
        )
    result = plan(inputs, workload, args.concurrency)
    unified = None
    if inputs.cache.enable_unified_memory and workload is not None:
        unified = unified_plan(result.resolution, workload, args.concurrency)
    comparison = compare_memory_options(inputs, workload) if compare and workload is not None else None
    host = build_host_plan(args, result)
    if args.json:
        out = result.to_dict()
        if unified is not None:
            out["unified_memory"] = unified.to_dict()
        if comparison is not None:
            out["memory_options"] = comparison.to_dict()
        if host is not None:
            out["host_tier"] = host.to_dict()
        print(json.dumps(out, indent=2))
    elif comparison is not None:
        print(format_comparison(comparison, result))
    else:
        print(format_plan(result))
        if inputs.cache.enable_unified_memory:
            print("")
            print(format_unified(unified, inputs.mamba_full_memory_ratio))
    if host is not None and not args.json:
        print("")
        print(format_host(host))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry: ``python -m mamba_radix.capacity.cli --model kimi-k3 ...``."""
    parser = argparse.ArgumentParser(
        prog="mamba-radix plan",
        description="Size the full-KV and state pools of a hybrid model as SGLang does, and recommend a split.",
    )
    add_plan_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_plan(args)
    except MambaRadixError as exc:
        from mamba_radix.flags import flag_message

        print(f"mamba-radix plan: error: {flag_message(str(exc).splitlines()[0])}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
