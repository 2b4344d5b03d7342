"""One table of the command-line flags of ``simulate``, ``sweep`` and ``plan``: name, type with bounds,
help, default, and where the value goes. ``mamba_radix.cli`` and ``mamba_radix.capacity.cli`` build their
parsers from it, so a flag's help and default are written once.

Defaults are not restated here: a cache flag's default is its :class:`~mamba_radix.config.CacheConfig`
field's, a cost flag's its :class:`~mamba_radix.cost_model.CostModel` field's, a deployment flag's the
model's (:mod:`mamba_radix.defaults`). Every numeric flag has bounds, so an absurd value (``--input-len
1e12``, ``--memory-budget-gb 1e15``, ``--check-invariants-every -1``) is a usage error before any work.

:func:`flag_message` maps the Python argument names in a library error (``budget_gib``, ``kv_tokens``) to
the flags that set them. No side effects on import (the cost defaults are read on first use). Nothing
here imports torch, the cache or the simulator, so ``mamba-radix --help`` stays fast.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass, fields
from typing import Any

__all__ = [
    "FLAGS",
    "MAX_SEQ_TOKENS",
    "Flag",
    "add_flags",
    "apply_env_defaults",
    "bool_value",
    "env_bool",
    "flag_message",
    "float_in",
    "int_in",
]

# longest request or length any command accepts (tokens): 2^27 = 134M, 500x a 262k context
MAX_SEQ_TOKENS = 1 << 27
MAX_GIB = float(1 << 20)  # 1 PiB: more memory per rank than anything real


# ------------------------------------------------------------------------------------------- types
def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """A flag type: an integer from ``lo`` to ``hi`` (inclusive); the error says the range."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip().replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be an integer from {lo:,} to {hi:,}, got {text!r}"
            ) from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be an integer from {lo:,} to {hi:,}, got {text}")
        return value

    parse.__name__ = "integer"
    return parse


def float_in(lo: float, hi: float, lo_open: bool = False) -> Callable[[str], float]:
    """A flag type: a finite number in ``[lo, hi]`` (``(lo, hi]`` when ``lo_open``)."""
    span = f"{'>' if lo_open else '>='} {lo:g} and <= {hi:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number {span}, got {text!r}") from None
        if not math.isfinite(value) or value < lo or (lo_open and value == lo) or value > hi:
            raise argparse.ArgumentTypeError(f"must be a number {span}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


def bool_value(text: str) -> bool:
    """A switch's explicit value: true/false, yes/no, on/off, 1/0."""
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"must be true or false, got {text}")


bool_value.__name__ = "bool"


def rate_per_s(text: str) -> float:
    """A flag type: a rate per second, > 0; ``inf`` (all at once) allowed, as bench_serving's
    ``--request-rate``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0 or inf, got {text!r}") from None
    if not value > 0:  # also NaN
        raise argparse.ArgumentTypeError(f"must be a number > 0 or inf, got {text}")
    return value


rate_per_s.__name__ = "number"


def env_bool(text: str) -> bool | None:
    """An environment variable's boolean as SGLang's ``EnvBool`` reads it: true, 1, yes, y / false, 0,
    no, n (any case); None for anything else (SGLang warns and keeps the default)."""
    low = text.strip().lower()
    if low in ("true", "1", "yes", "y"):
        return True
    if low in ("false", "0", "no", "n"):
        return False
    return None


def choice(options: Iterable[str]) -> Callable[[str], str]:
    opts = tuple(options)

    def parse(text: str) -> str:
        if text not in opts:
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(opts)}, got {text}")
        return text

    parse.__name__ = "choice"
    return parse


def _peer(text: str) -> str:
    """A preset name of :data:`~mamba_radix.peers.PEERS`; a retired one (``marconi``) says where it went."""
    from mamba_radix.peers import PEERS, RETIRED_PEERS

    if text in RETIRED_PEERS:
        raise argparse.ArgumentTypeError(RETIRED_PEERS[text])
    return choice(PEERS)(text)


_peer.__name__ = "peer"


# --------------------------------------------------------------------------------------------- table
SIM = frozenset({"simulate", "sweep"})
ALL = frozenset({"simulate", "sweep", "plan"})
PLAN = frozenset({"plan"})
LOAD = frozenset({"simulate"})  # bench_serving's load test: simulate only
# speculative decoding's settings: plan sizes with them; simulate sizes its pools with them and nothing else
SPEC = frozenset({"simulate", "plan"})


@dataclass(frozen=True)
class Flag:
    """One flag. ``where``: ``config`` (a CacheConfig field), ``budget``, ``deployment``, ``options``
    (EngineOptions), ``cost`` (CostModel), ``peer``, ``plan`` (the planner only), ``trace``, ``run``.
    ``default``: shown in help and used by the planner; None with ``default_text`` for computed ones.
    ``switch``: a boolean that alone means true. ``sweep``: a comma list under ``sweep``. ``env``: an
    environment variable (SGLang's) whose value is the default when the flag is not given
    (:func:`apply_env_defaults`)."""

    flag: str
    where: str
    kind: Callable[[str], Any]
    help: str
    commands: frozenset[str] = SIM
    group: str = "cache"
    default: Any = None
    # shown instead of ``default``; a dict gives one text per command
    default_text: str | dict[str, str] | None = None
    switch: bool = False
    sweep: bool = True
    metavar: str | None = None
    env: str | None = None

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")


def _config_default(name: str) -> Any:
    from mamba_radix.config import CacheConfig

    for f in fields(CacheConfig):
        if f.name == name:
            return f.default if f.default is not MISSING else None
    return MISSING


def _cost_default(name: str) -> Any:
    # the light module, not sim.engine (which imports torch): --help shows these defaults
    from mamba_radix.cost_model import CostModel

    return getattr(CostModel(), name)


def _choices(name: str) -> tuple[str, ...]:
    from mamba_radix.config import FIELD_CHOICES

    return FIELD_CHOICES[name]


# mamba_radix.capacity.host.HOST_SPLITS, written out so that --help imports no numpy (a test holds them equal)
_HOST_SPLIT_NAMES = ("ratio", "planned")


def _host_links() -> tuple[str, ...]:
    from mamba_radix.cost_model import HOST_LINK_PRESETS

    return tuple(HOST_LINK_PRESETS)


def _cache_flags() -> list[Flag]:
    from mamba_radix.config import STRATEGIES

    # (flag, type, help, commands): defaults come from CacheConfig
    rows: list[tuple[str, Callable[[str], Any], str, frozenset[str], bool]] = [
        ("--mamba-radix-cache-strategy", choice(STRATEGIES),
         f"checkpoint strategy: {', '.join(STRATEGIES)} (auto: extra_buffer with overlap scheduling)", ALL, False),
        ("--mamba-track-interval", int_in(1, MAX_SEQ_TOKENS), "decode checkpoint every N tokens", ALL, False),
        ("--mamba-max-states-per-path", int_in(-1, 1 << 20),
         "soft cap on checkpoints per root-to-leaf path (-1 = no cap)", ALL, False),
        ("--mamba-cache-chunk-size", int_in(1, 1 << 20), "prefill checkpoint grid (tokens)", ALL, False),
        ("--mamba-eviction-order", choice(_choices("mamba_eviction_order")),
         "checkpoint victim order among equally recent ones: leaf_first, root_first, mixed, or "
         "flop_weighted (LRU with a bonus for the compute a checkpoint saves)", SIM, False),
        ("--mamba-lru-refresh", choice(_choices("mamba_lru_refresh")),
         "what a hit refreshes: the matched node, or the whole path", SIM, False),
        ("--mamba-checkpoint-admission", choice(_choices("mamba_checkpoint_admission")),
         "which prefill chunks checkpoint (extra_buffer): all, or branch_and_end (Marconi: the branch "
         "point and the input's end only)", SIM, False),
        ("--mamba-flop-weight", float_in(0.0, 1e9),
         "flop_weighted: ticks of recency one doubling of saved compute is worth (0 = plain LRU)", SIM, False),
        ("--mamba-flop-crossover", int_in(1, 1 << 40),
         "flop_weighted: prefix length (tokens) where attention's quadratic cost equals the linear cost",
         SIM, False),
        ("--mamba-slot-headroom", choice(_choices("mamba_slot_headroom")),
         "state-slot eviction: exact (SGLang 0.5.23: the slots a request takes, when it takes them) or "
         "per_chunk (0.5.20: keep 3 free before every prefill chunk)", SIM, False),
        ("--mamba-kv-only-leaves", bool_value,
         "keep checkpoint-less ancestors of a deleted leaf as KV-only leaves (SGLang 0.5.23)", SIM, True),
        ("--mamba-decode-insert", bool_value,
         "insert each decode checkpoint into the tree at once (not SGLang: an opt-in policy)", SIM, True),
        ("--chunked-prefill-size", int_in(-1, MAX_SEQ_TOKENS), "tokens per prefill chunk (-1 = no chunking)",
         ALL, False),
        ("--page-size", int_in(1, 1 << 16), "tokens per KV page", ALL, False),
        ("--disable-overlap-schedule", bool_value, "no overlap scheduling (ping-pong P = 1)", ALL, True),
        ("--skip-decode-lock", bool_value,
         "one state slot less per request (SGLang's SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK: 5 -> 4 with extra_buffer)",
         ALL, True),
        ("--enable-unified-memory", bool_value,
         "KV and states share one byte budget (SGLang's unified memory pool): slots and KV tokens move with "
         "load; not with --adaptive-split in the simulator", ALL, True),
        ("--unified-memory-give-way", choice(_choices("unified_memory_give_way")),
         "unified memory: who gives way when the sides meet: sglang (the requester evicts its own, a state "
         "shortfall then KV), older_victim (the older LRU victim of the two), floor (each side keeps half "
         "its start-up share)", ALL, False),
        # the host tier (SGLang's HiCache; docs/host-tier.md): both sizes 0 = off
        ("--host-kv-tokens", int_in(0, 1 << 31),
         "host tier: rows of the host KV pool (with --host-state-slots; 0 = no host tier)", SIM, False),
        ("--host-state-slots", int_in(0, 1 << 24),
         "host tier: slots of the host state pool (with --host-kv-tokens; 0 = no host tier)", SIM, False),
        ("--host-write-policy", choice(_choices("host_write_policy")),
         "host tier: when a node gets its host copy: write_through (at insert), write_through_selective "
         "(at its Nth hit), write_back (at device eviction) or resumable (ours: at device eviction, "
         "checkpoints a later request can resume from first, others only into free host memory)", SIM, False),
        ("--host-path-cap", choice(_choices("host_path_cap")),
         "host tier: what the per-path cap (--mamba-max-states-per-path) does to a dropped checkpoint's host "
         "copy: keep or drop", SIM, False),
        ("--host-write-through-threshold", int_in(1, 1 << 20),
         "host tier: write_through_selective's hit count before a backup", SIM, False),
    ]  # fmt: skip
    out = []
    for flag, kind, text, commands, switch in rows:
        default = _config_default(flag[2:].replace("-", "_"))
        if default is MISSING:  # the table and CacheConfig disagree: a bug here, never a user's error
            raise AssertionError(f"flag {flag} names no CacheConfig field; rename it or add the field")
        out.append(
            Flag(flag, "config", kind, text, commands, "cache", default, switch=switch, env=_ENV.get(flag))
        )
    return out


# SGLang's environment variables that set a flag's default (an explicit flag wins), in the commands that
# model one deployment (a sweep's runs are set by its flags or its definition alone)
ENV_COMMANDS = frozenset({"simulate", "plan"})
_ENV = {
    "--skip-decode-lock": "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK",
    "--mamba-conv-dtype": "SGLANG_MAMBA_CONV_DTYPE",
}
# bench_serving's defaults of its random dataset (mamba_radix.sim.serving.RandomWorkload's, which a test
# holds equal) and its dataset names; written out so that --help imports no numpy
_DATASET_NAMES = ("random", "random-ids")
_COST_PRESET_NAMES = ("kimi-k3-8xh200", "qwen3-next-1xh200")  # shown when cost_model has none yet


def _cost_presets() -> dict[str, Any]:
    from mamba_radix import cost_model

    return dict(getattr(cost_model, "COST_PRESETS", {}))


def _cost_preset(text: str) -> str:
    """A name of :data:`mamba_radix.cost_model.COST_PRESETS`."""
    presets = _cost_presets()
    if not presets:
        raise argparse.ArgumentTypeError("this version has no cost presets")
    return choice(presets)(text)


_cost_preset.__name__ = "choice"


_SIM_BUDGET = "the model's deployment: kimi-k3 27.25, one TP8 rank"


def _other_flags() -> list[Flag]:
    from mamba_radix.capacity.memory import CONV_DTYPES, KV_CACHE_DTYPES, SSM_DTYPES
    from mamba_radix.capacity.models import PRESETS
    from mamba_radix.defaults import DEPLOYMENTS

    def per_model(attr: str, generic: str) -> str:
        listed = ", ".join(f"{m}: {getattr(d, attr)}" for m, d in DEPLOYMENTS.items())
        return f"the model's deployment ({listed}; others {generic})"

    slots = f"state slots ({'overrides the ratio'})"
    return [
        # model and deployment (the same defaults in plan and simulate: mamba_radix.defaults)
        Flag("--model", "deployment", str, f"model preset ({', '.join(PRESETS)}) or a JSON model file",
             ALL, "model", "kimi-k3", sweep=False, metavar="NAME"),
        Flag("--tp-size", "deployment", int_in(1, 1024), "tensor parallel size", ALL, "model",
             default_text=per_model("tp_size", "1"), sweep=False),
        Flag("--dcp-size", "plan", int_in(1, 1024), "decode context parallel size (shards KV tokens)", PLAN,
             "model", 1),
        Flag("--context-length", "plan", int_in(1, MAX_SEQ_TOKENS), "model context length (SGLang's estimate "
             "of max_running_requests)", PLAN, "model", default_text="the model's"),
        Flag("--kv-cache-dtype", "deployment", choice(["auto", *KV_CACHE_DTYPES]), "KV cache dtype", ALL,
             "model", default_text=per_model("kv_cache_dtype", "auto"), sweep=False),
        Flag("--mamba-ssm-dtype", "deployment", choice(SSM_DTYPES), "SSM state dtype", ALL, "model",
             default_text=per_model("mamba_ssm_dtype", "the model's own"), sweep=False),
        Flag("--mamba-conv-dtype", "deployment", choice(CONV_DTYPES), "conv state dtype", ALL, "model", "bfloat16",
             sweep=False, env=_ENV["--mamba-conv-dtype"]),
        Flag("--config", "launch", str, "SGLang launch settings, JSON (or YAML with PyYAML), as `sglang.launch_server "
             "--config`: each key sets its flag (enable_overlap_schedule: true is --disable-overlap-schedule false); "
             "keys that do not change the cache model are listed as ignored; flags given here override the file",
             ALL, "model", sweep=False, metavar="FILE"),
        # memory
        Flag("--memory-budget-gb", "budget", float_in(0.0, MAX_GIB, lo_open=True),
             "KV + state memory per rank in GiB (SGLang's GB)", ALL, "memory",
             default_text={"plan": "none: pools are sized from a budget, --max-mamba-cache-size or --max-total-tokens",
                           "simulate": _SIM_BUDGET, "sweep": _SIM_BUDGET}),
        Flag("--gpu-memory-gb", "plan", float_in(0.0, MAX_GIB, lo_open=True), "GPU memory (with --weights-gb)",
             PLAN, "memory"),
        Flag("--mem-fraction-static", "plan", float_in(0.0, 1.0, lo_open=True), "SGLang's static memory fraction",
             PLAN, "memory", 0.9),
        Flag("--weights-gb", "plan", float_in(0.0, MAX_GIB), "weights per GPU (with --gpu-memory-gb)", PLAN, "memory"),
        Flag("--mamba-full-memory-ratio", "budget", float_in(0.0, 1e3, lo_open=True),
             "state : KV memory ratio r (states get r/(1+r) of the budget)", ALL, "memory", 0.9),
        Flag("--max-mamba-cache-size", "budget", int_in(1, 1 << 22), slots, ALL, "memory"),
        Flag("--kv-tokens", "budget", int_in(1, 1 << 28), "KV pool size in tokens, exactly (with --state-slots; "
             "instead of a budget)", SIM, "memory"),
        Flag("--state-slots", "budget", int_in(1, 1 << 22), "state pool size in slots, exactly (with --kv-tokens)",
             SIM, "memory"),
        Flag("--max-total-tokens", "plan", int_in(1, 1 << 36), "cap (or, without a budget, size) of the KV pool",
             PLAN, "memory"),
        Flag("--max-running-requests", "options", int_in(1, 1 << 20), "cap on running requests (request rows)",
             ALL, "memory"),
        # engine
        Flag("--mode", "options", choice(["timed", "sequential"]),
             "timed (arrivals and concurrency) or sequential (one request at a time)", SIM, "engine", "timed"),
        Flag("--max-concurrency", "options", int_in(1, 1 << 20),
             "bench_serving's --max-concurrency: at most N requests outstanding (queued or running); a request "
             "that arrives while N are outstanding waits at the client until one finishes", SIM, "engine",
             default_text="no cap"),
        Flag("--log-every", "options", int_in(0, 1 << 31),
             "print SGLang's scheduler lines to stderr: a 'Decode batch' line every N decode steps and a "
             "'Prefill batch' line per prefill batch (0 = off)", frozenset({"simulate"}), "engine", 0, sweep=False),
        Flag("--cost-preset", "cost_preset", _cost_preset,
             f"cost model preset ({', '.join(_cost_presets() or _COST_PRESET_NAMES)}; mamba_radix.cost_model."
             "COST_PRESETS); the cost flags below override its fields", frozenset({"simulate"}), "engine",
             default_text="the CostModel defaults", sweep=False),
        Flag("--fit-cost-from", "cost_fit", str,
             "fit the cost model to an SGLang server log (its 'Decode batch' and 'Prefill batch' lines); the cost "
             "flags below override the fitted fields", frozenset({"simulate"}), "engine", sweep=False, metavar="FILE"),
        Flag("--arrival-time-scale", "options", float_in(0.0, 1e6, lo_open=True), "multiply trace timestamps by this",
             SIM, "engine", 1.0),
        Flag("--prefill-tokens-per-s", "cost", float_in(0.0, 1e12, lo_open=True), "cost model: prefill speed",
             SIM, "engine", default_text="cost:prefill_tokens_per_s"),
        Flag("--decode-step-s", "cost", float_in(0.0, 1e3), "cost model: seconds per decode step", SIM, "engine",
             default_text="cost:decode_step_s"),
        Flag("--decode-step-per-req-s", "cost", float_in(0.0, 1e3),
             "cost model: extra seconds per decode step per running request", SIM, "engine",
             default_text="cost:decode_step_per_req_s"),
        Flag("--host-link", "options", choice(_host_links()),
             "host tier: the host<->device link that times load-backs: pcie5-x16 (52 GB/s per direction, "
             "assumed achievable) or gh200-c2c (450 GB/s per direction); mamba_radix.cost_model.HOST_LINK_PRESETS",
             SIM, "cache", default_text="pcie5-x16", metavar="NAME"),
        Flag("--host-link-gbps", "options", float_in(0.0, 1e5, lo_open=True),
             "host tier: the link's GB/s per direction (overrides --host-link's number)", SIM, "cache",
             default_text="the link preset's"),
        Flag("--host-memory-ratio", "options", float_in(0.0, 1e3),
             "host tier: size both host pools at R x the device pools (KV tokens and state slots), instead of "
             "--host-kv-tokens / --host-state-slots (0 = no host tier)", SIM, "cache", metavar="R"),
        Flag("--host-split", "options", choice(_HOST_SPLIT_NAMES),
             "host tier: how the host bytes split between the host pools: ratio (each pool sized alone, as "
             "SGLang) or planned (the same bytes, one host state slot per KV tokens a host copy covers on the "
             "workload under the write policy: mamba_radix.capacity.host)", SIM, "cache", default_text="ratio", metavar="NAME"),
        Flag("--peer", "peer", _peer, "a peer preset: another system's cache rules as config changes "
             "(mamba_radix.peers; marconi-static is Marconi's admission with the static flop_weighted key, "
             "not the experiment's policy marconi), applied after the other flags; a flag it sets to another value "
             "is an error", SIM, "cache", metavar="NAME"),
        # plan only
        Flag("--disable-radix-cache", "plan", bool_value, "no prefix caching (one slot per request)", PLAN, "cache",
             False, switch=True),
        Flag("--speculative-num-draft-tokens", "plan", int_in(0, 1024), "verify tokens per step", SPEC,
             "speculative", 0),
        Flag("--enable-linear-replayssm-spec", "plan", bool_value, "allocate ReplaySSM rings", SPEC, "speculative",
             False, switch=True),
        Flag("--linear-replayssm-cache-len", "plan", int_in(1, 1 << 16), "ring length L (a power of two)", SPEC,
             "speculative", 16),
        Flag("--speculative-dspark-block-size", "plan", int_in(1, 1023),
             "DSpark's block size gamma: the verify window is 1 + gamma tokens, so it sets "
             "--speculative-num-draft-tokens to gamma + 1", SPEC, "speculative"),
        Flag("--input-len", "plan", int_in(1, MAX_SEQ_TOKENS), "input tokens per request", PLAN, "workload"),
        Flag("--output-len", "plan", int_in(1, MAX_SEQ_TOKENS), "output tokens per request", PLAN, "workload"),
        Flag("--trace", "plan", str, "JSONL trace (Mooncake block format); lengths only", PLAN, "workload",
             metavar="FILE"),
        Flag("--concurrency", "plan", int_in(1, 1 << 20), "target running requests", PLAN, "workload"),
        # simulate: bench_serving's random dataset (mamba_radix.sim.serving)
        Flag("--dataset-name", "workload", choice(_DATASET_NAMES),
             "replay bench_serving's random dataset (both names: unique random prompts) instead of a trace",
             LOAD, "workload", sweep=False, metavar="NAME"),
        Flag("--random-input-len", "workload", int_in(1, MAX_SEQ_TOKENS), "input tokens per request (the most)",
             LOAD, "workload", 1024, sweep=False),
        Flag("--random-output-len", "workload", int_in(1, MAX_SEQ_TOKENS), "output tokens per request (the most)",
             LOAD, "workload", 1024, sweep=False),
        Flag("--random-range-ratio", "workload", float_in(0.0, 1.0),
             "bench_serving's --random-range-ratio: lengths uniform over [max(1, floor(len x ratio)), len] "
             "(1 = every request exactly len)", frozenset({"simulate", "plan"}), "workload", 0.0),
        Flag("--num-prompts", "workload", int_in(1, 100_000), "requests", LOAD, "workload", 1000, sweep=False),
        Flag("--request-rate", "workload", rate_per_s, "requests sent per second (inf: all at time 0)", LOAD,
             "workload", math.inf, sweep=False, metavar="X"),
        Flag("--request-rate-distribution", "workload", choice(("poisson", "constant")),
             "gaps between sends: poisson (exponential, as bench_serving) or constant (1 / rate)", LOAD, "workload",
             "poisson", sweep=False),
    ]  # fmt: skip


def _checkpoint_flags() -> list[Flag]:
    """``--checkpoint-format`` and ``--checkpoint-slots``: CacheConfig fields (every command) once CacheConfig
    has them; before that the planner's alone (``simulate`` would build a config without the field: its
    parser does not offer the flags, so asking for one is a usage error, never a silent model-format run)."""
    from mamba_radix.capacity.formats import CHECKPOINT_FORMAT_NAMES

    in_config = _config_default("checkpoint_format") is not MISSING
    where, commands = ("config", ALL) if in_config else ("plan", PLAN)
    return [
        Flag("--checkpoint-format", where, choice(CHECKPOINT_FORMAT_NAMES),
             "how the tree's checkpoints are stored: model (the state pool's dtype, one pool), int8 or fp8_e4m3 "
             "(a quantized checkpoint pool; running requests keep the model dtype); the state budget is the same "
             "bytes either way (SGLang's --enable-int8-mamba-checkpoint adds its int8 pool beyond the budget)",
             commands, "memory", "model"),
        Flag("--checkpoint-slots", where, int_in(1, 1 << 22),
             "slots of the quantized checkpoint pool (SGLang's --int8-mamba-ckpt-size), taken from the state "
             "budget; the working slots get the rest", commands, "memory",
             default_text="twice the working slots, at equal bytes (SGLang's proportion)"),
    ]  # fmt: skip


def _planner_flags() -> list[Flag]:
    """Flags only ``plan`` has: deployment settings it checks against unified memory and checkpoint formats
    (no simulator models them), and the comparison table."""
    return [
        Flag("--enable-hierarchical-cache", "plan", bool_value,
             "SGLang's host tier (HiCache): plan only checks what it rules out (unified memory, quantized "
             "checkpoints)", PLAN, "cache", False, switch=True),
        Flag("--disaggregation-mode", "plan", choice(("null", "prefill", "decode")),
             "PD disaggregation role (null: none); plan only checks what it rules out (unified memory)", PLAN,
             "cache", "null"),
        Flag("--host-memory-gb", "plan", float_in(0.0, MAX_GIB, lo_open=True),
             "host memory for the host tier in GiB: print its split into host KV tokens and host state slots "
             "for the workload (the planner's rule, SGLang's --hicache-size split beside it)", PLAN, "memory"),
        Flag("--compare-memory-options", "plan", bool_value,
             "compare, at equal bytes, a static ratio (the given one and the workload's best), the adaptive "
             "split and the unified pool, each with every checkpoint format; needs a workload", PLAN, "workload",
             False, switch=True),
    ]  # fmt: skip


_TABLE: list[Flag] | None = None


def FLAGS() -> list[Flag]:
    """The table (built once: it reads CacheConfig, CostModel, the presets)."""
    global _TABLE
    if _TABLE is None:
        _TABLE = _cache_flags() + _other_flags() + _checkpoint_flags() + _planner_flags()
    return _TABLE


_GROUP_TITLES: dict[str, str | dict[str, str]] = {
    "model": "model and deployment",
    "memory": "memory (per rank; GB = GiB as in SGLang)",
    "cache": "cache",
    "engine": "engine and cost model",
    "speculative": {
        "plan": "speculative decoding",
        "simulate": "speculative decoding (sizes the pools only, as plan does: not simulated)",
    },
    "workload": {
        "plan": "workload (for the recommendation)",
        "simulate": "load test: bench_serving's random dataset (with --dataset-name random)",
    },
}


def _default_text(f: Flag, command: str) -> str | None:
    text = f.default_text.get(command) if isinstance(f.default_text, dict) else f.default_text
    if text and text.startswith("cost:"):
        return f"{_cost_default(text[5:]):g}"
    if text:
        return text
    if f.default is None:
        return None
    if isinstance(f.default, bool):
        return "true" if f.default else "false"
    return f"{f.default}"


def _env_text(f: Flag, command: str) -> str:
    """What the help adds for a flag an environment variable defaults: the variable, and its value now."""
    if f.env is None or command not in ENV_COMMANDS:
        return ""
    now = os.environ.get(f.env)
    return f"; ${f.env} sets the default (SGLang's: {'true/1/yes/y' if f.switch else 'a value'})" + (
        f", now {now!r}" if now is not None else ""
    )


def apply_env_defaults(args: argparse.Namespace, command: str, environ: Any = None) -> list[str]:
    """Fill each flag of ``command`` (one of :data:`ENV_COMMANDS`) that has an environment variable
    (``Flag.env``) and was not given from that variable, as SGLang reads it (a boolean as ``EnvBool``: :func:`env_bool`). An explicit flag wins.

    Side effect: sets attributes of ``args``. Returns warnings (a boolean variable SGLang would not read:
    it warns and keeps the default, so do we). Raises :class:`~mamba_radix.errors.ConfigError` for a value
    the flag refuses (``SGLANG_MAMBA_CONV_DTYPE=int4``). O(flags)."""
    from mamba_radix.errors import ConfigError

    env = os.environ if environ is None else environ
    warnings: list[str] = []
    if command not in ENV_COMMANDS:
        return warnings
    for f in FLAGS():
        if f.env is None or command not in f.commands or getattr(args, f.dest, None) is not None:
            continue
        text = env.get(f.env)
        if text is None:
            continue
        value: Any
        if f.switch:
            value = env_bool(text)
            if value is None:
                warnings.append(
                    f"${f.env}={text!r} is not a boolean (true, 1, yes, y / false, 0, no, n); "
                    f"{f.flag} keeps its default"
                )
                continue
        else:
            try:
                value = f.kind(text)
            except argparse.ArgumentTypeError as err:
                raise ConfigError(f"${f.env} (the default of {f.flag}): {err}") from None
        setattr(args, f.dest, [value] if command == "sweep" and f.sweep else value)
    return warnings


def add_flags(parser: argparse.ArgumentParser, command: str) -> dict[str, argparse._ArgumentGroup]:
    """Add the table's flags of ``command`` (``simulate``, ``sweep`` or ``plan``) to ``parser``, grouped.

    Every flag's argparse default is None (so the caller can tell a given flag from an absent one);
    the help says the default. Under ``sweep`` a sweepable flag takes a comma-separated list. Returns the
    argument groups by name (for the caller's own flags)."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    sweep = command == "sweep"
    for f in FLAGS():
        if command not in f.commands:
            continue
        if f.group not in groups:
            named = _GROUP_TITLES.get(f.group, f.group)
            title = named.get(command, f.group) if isinstance(named, dict) else named
            groups[f.group] = parser.add_argument_group(
                title
                + (
                    " (comma-separated lists sweep)"
                    if sweep and f.group in ("cache", "memory", "engine")
                    else ""
                )
            )
        listed = sweep and f.sweep
        kind = _list_of(f.kind) if listed else f.kind
        default = _default_text(f, command)
        help_text = f.help + (f" (default {default}{_env_text(f, command)})" if default is not None else "")
        extra: dict[str, Any] = {}
        if f.switch:  # alone it means true; an explicit value (or a list under sweep) still works
            extra = {"nargs": "?", "const": [True] if listed else True, "metavar": "BOOL"}
            help_text += "; a switch, or true/false"
        else:  # short placeholders: N (integer), X (number), NAME (a choice); lists under sweep
            mv = f.metavar or {"integer": "N", "number": "X", "choice": "NAME"}.get(f.kind.__name__)
            if mv:
                extra["metavar"] = f"{mv}[,{mv}...]" if listed else mv
        groups[f.group].add_argument(f.flag, dest=f.dest, type=kind, default=None, help=help_text, **extra)
    return groups


def _list_of(conv: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("needs at least one value")
        return [conv(t) for t in items]

    parse.__name__ = "list"
    return parse


# Python argument names a library message may use that are no flag's dest, and the flag of each
_EXTRA_NAMES = {
    "budget_gib": "--memory-budget-gb",
    # the planner's MemoryBudget(rest_gib) / MemoryBudget.from_gpu(gpu_memory_gib, ..., weights_gib) and
    # Workload.random_range(..., range_ratio)
    "rest_gib": "--memory-budget-gb",
    "gpu_memory_gib": "--gpu-memory-gb",
    "weights_gib": "--weights-gb",
    "range_ratio": "--random-range-ratio",
    "max_running_requests": "--max-running-requests",
    "overwrite": "--force",
    "backend": "--backend",
    "jobs": "--jobs",
}
# objects a message may name a field through (``cost.decode_step_s``): the flag sets the field itself
_HOLDERS = ("cost", "options", "config", "budget")


def _names() -> tuple[dict[str, str], frozenset[str]]:
    """Every Python argument name with a flag, the flag of each, and the flags that are switches."""
    names = {f.dest: f.flag for f in FLAGS()}
    names.update(_EXTRA_NAMES)
    switches = frozenset({f.flag for f in FLAGS() if f.switch} | {"--force"})
    return names, switches


_PATTERN: re.Pattern[str] | None = None


def _pattern(names: Iterable[str]) -> re.Pattern[str]:
    global _PATTERN
    if _PATTERN is None:
        alternatives = "|".join(sorted(map(re.escape, names), key=len, reverse=True))
        _PATTERN = re.compile(
            rf"(?<![\w./'\"-])(?P<holder>(?:{'|'.join(_HOLDERS)})\.)?(?P<name>{alternatives})"
            r"(?:=(?P<value>'[^']*'|\"[^\"]*\"|[^\s,;():'\"]+))?(?![\w-])"
        )
    return _PATTERN


def flag_message(message: str) -> str:
    """``message`` (a library error, in Python argument names) in the flags that set those arguments.

    - ``name=value`` becomes ``--flag value`` (a quoted string unquoted; a switch's ``=True`` is the
      flag alone, ``=False`` is ``--flag false``): ``page_size=1`` -> ``--page-size 1``,
      ``peer='marconi-static'`` -> ``--peer marconi-static``, ``overwrite=True`` -> ``--force``.
    - a bare name with an underscore becomes its flag: ``budget_gib`` -> ``--memory-budget-gb``;
      ``cost.decode_step_s`` -> ``--decode-step-s``, ``budget.rest_gib`` -> ``--memory-budget-gb``.
    - a bare name without one (``mode``, ``peer``) only as the subject of the message or of a clause
      after ``": "`` (``mode must be ...``): elsewhere it is a plain word ("the peer sets").

    Names no flag sets (``model_supports_extra_buffer``), quoted values (``got 'page_size'``) and words
    inside paths stay as they are. O(len(message) * flags); the pattern is compiled once."""
    names, switches = _names()
    pattern = _pattern(names)

    def sub(m: re.Match[str]) -> str:
        name, value, holder = m.group("name"), m.group("value"), m.group("holder")
        flag = names[name]
        if value is not None:
            if value[:1] in ("'", '"'):
                value = value[1:-1]
            if flag in switches and value in ("True", "False"):
                return flag if value == "True" else f"{flag} false"
            return f"{flag} {value}"
        start = m.start()
        subject = (start == 0 or message.endswith(": ", 0, start)) and message.startswith(" must ", m.end())
        if "_" in name or holder or subject:
            return flag
        return m.group(0)

    return pattern.sub(sub, message)
