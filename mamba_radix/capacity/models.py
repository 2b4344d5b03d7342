"""Model specs for the capacity planner: what a hybrid model's layers are made of.

A hybrid model is a sequence of two kinds of layer (DESIGN.md §1):

- ``F``: full attention, one KV entry per token (:class:`GQAAttention` for MHA/GQA, :class:`MLAAttention`);
- ``L``: a linear/recurrent mixer with a fixed-size state per request (:class:`LinearAttention` for
  Gated DeltaNet and KDA, :class:`Mamba2Mixer` for Mamba2).

:class:`ModelSpec` ties them together with a layer pattern such as ``"LLLF*23+F"``. Presets live in
:data:`PRESETS`; any other model can be described in Python or in a JSON file (:func:`load_model`).
Only shapes live here; bytes are computed in :mod:`mamba_radix.capacity.memory`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mamba_radix.errors import ConfigError

__all__ = [
    "PRESETS",
    "GQAAttention",
    "LinearAttention",
    "MLAAttention",
    "Mamba2Mixer",
    "ModelSpec",
    "expand_layer_pattern",
    "load_model",
    "model_from_dict",
]

LinearKind = Literal["gdn", "kda"]


# Upper bounds that keep byte counts and pattern expansion finite and quick; far beyond any real model.
MAX_DIM = 1 << 24  # heads, head dims, ranks, kernel sizes
MAX_LAYERS = 100_000
MAX_CONTEXT_LEN = 2**31 - 1


def _positive(name: str, value: object, owner: str, maximum: int = MAX_DIM) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{owner}: {name} must be a positive integer, got {value!r}")
    if value > maximum:
        raise ConfigError(f"{owner}: {name} must be <= {maximum:,}, got {value:,}")


@dataclass(frozen=True)
class GQAAttention:
    """Full attention with separate K and V per KV head (MHA when ``num_kv_heads == num_q_heads``).

    Per token and layer the cache holds ``2 * num_kv_heads * head_dim`` elements (K and V).
    """

    num_q_heads: int
    num_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        for name in ("num_q_heads", "num_kv_heads", "head_dim"):
            _positive(name, getattr(self, name), "full attention (GQA)")
        if self.num_q_heads % self.num_kv_heads != 0:
            raise ConfigError(
                f"full attention (GQA): num_q_heads ({self.num_q_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )

    @property
    def kind(self) -> str:
        return "mha" if self.num_kv_heads == self.num_q_heads else "gqa"


@dataclass(frozen=True)
class MLAAttention:
    """Multi-head latent attention (DeepSeek style): one compressed latent per token and layer.

    Per token and layer the cache holds ``kv_lora_rank + qk_rope_head_dim`` elements; it has a single
    "KV head", so tensor parallelism replicates it on every GPU (seed 000: "同一个请求每个GPU的KV cache是一模
    一样的").
    """

    num_q_heads: int
    kv_lora_rank: int
    qk_rope_head_dim: int

    def __post_init__(self) -> None:
        for name in ("num_q_heads", "kv_lora_rank", "qk_rope_head_dim"):
            _positive(name, getattr(self, name), "full attention (MLA)")

    @property
    def kind(self) -> str:
        return "mla"

    @property
    def num_kv_heads(self) -> int:
        return 1


@dataclass(frozen=True)
class LinearAttention:
    """A gated-delta-rule linear attention layer: Gated DeltaNet (``gdn``) or Kimi Delta Attention (``kda``).

    State per request and layer (SGLang's ``Mamba2StateShape`` / ``KimiLinearStateShape``):

    - conv window: ``conv_kernel - 1`` past inputs of the q, k and v projections, i.e.
      ``[conv_kernel - 1, 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim]``;
    - temporal state: ``[num_v_heads, head_v_dim, head_k_dim]``.

    KDA has as many key heads as value heads and a per-K-channel gate (which matters for the ReplaySSM
    ``g`` ring); GDN's gate is one scalar per head.
    """

    kind: LinearKind
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int = 4

    def __post_init__(self) -> None:
        if self.kind not in ("gdn", "kda"):
            raise ConfigError(f"linear layer kind must be gdn, kda or mamba2, got {self.kind!r}")
        for name in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "conv_kernel"):
            _positive(name, getattr(self, name), f"linear layer ({self.kind})")
        if self.conv_kernel < 2:
            raise ConfigError(f"linear layer ({self.kind}): conv_kernel must be >= 2, got {self.conv_kernel}")
        if self.num_v_heads % self.num_k_heads != 0:
            raise ConfigError(
                f"linear layer ({self.kind}): num_v_heads ({self.num_v_heads}) must be a multiple of "
                f"num_k_heads ({self.num_k_heads})"
            )
        if self.kind == "kda" and (
            self.num_k_heads != self.num_v_heads or self.head_k_dim != self.head_v_dim
        ):
            raise ConfigError("linear layer (kda): KDA has equal key/value heads and head dims")


@dataclass(frozen=True)
class Mamba2Mixer:
    """A Mamba2 SSM layer.

    State per request and layer: conv window ``[conv_kernel - 1, num_heads * head_dim + 2 * n_groups *
    state_size]`` (x, B and C go through the short conv) and temporal state ``[num_heads, head_dim,
    state_size]``.
    """

    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int = 1
    conv_kernel: int = 4

    def __post_init__(self) -> None:
        for name in ("num_heads", "head_dim", "state_size", "n_groups", "conv_kernel"):
            _positive(name, getattr(self, name), "linear layer (mamba2)")
        if self.conv_kernel < 2:
            raise ConfigError(f"linear layer (mamba2): conv_kernel must be >= 2, got {self.conv_kernel}")

    @property
    def kind(self) -> str:
        return "mamba2"


FullAttention = GQAAttention | MLAAttention
LinearMixer = LinearAttention | Mamba2Mixer

_PATTERN_PART = re.compile(r"^([FL]+)(?:\*(\d+))?$")


def expand_layer_pattern(pattern: str) -> str:
    """Expand a compact layer pattern into one character per layer.

    ``F`` is a full-attention layer, ``L`` a linear one; parts joined by ``+`` may repeat with ``*n``:
    ``"LLLF*23+F"`` is Kimi K3's 93 layers (seed 000: "93层 = 23模块x (3 linear + 1 MLA) + 最后一层 MLA").
    """
    if not isinstance(pattern, str):
        raise ConfigError(f"layer pattern must be a string like 'LLLF*12', got {type(pattern).__name__}")
    text = pattern.replace(" ", "").upper()
    if not text:
        raise ConfigError("layer pattern is empty; write it like 'LLLF*12' (L = linear, F = full attention)")
    layers: list[str] = []
    total = 0
    for part in text.split("+"):
        match = _PATTERN_PART.match(part)
        if match is None:
            raise ConfigError(
                f"layer pattern part {part!r} in {pattern!r} is not valid; write parts like 'LLLF*12' "
                "joined by '+' (L = linear, F = full attention)"
            )
        repeat = int(match.group(2) or 1)
        if repeat < 1:
            raise ConfigError(f"layer pattern part {part!r}: the repeat count must be >= 1")
        total += len(match.group(1)) * repeat
        if total > MAX_LAYERS:  # checked before the string is built: "LF*10**12" must not allocate
            raise ConfigError(f"layer pattern {pattern!r} has more than {MAX_LAYERS:,} layers")
        layers.append(match.group(1) * repeat)
    return "".join(layers)


@dataclass(frozen=True)
class ModelSpec:
    """One hybrid model: its layer pattern, its full-attention and linear layers, and defaults.

    ``default_ssm_dtype`` is what SGLang uses when ``--mamba-ssm-dtype`` is not given (the model config);
    ``context_len`` feeds SGLang's estimate of ``max_running_requests``.
    """

    name: str
    layer_pattern: str
    full_attention: FullAttention
    linear: LinearMixer
    context_len: int = 262_144
    default_ssm_dtype: str = "float32"
    model_dtype: str = "bfloat16"
    layers: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ConfigError(f"model name must be a string, got {self.name!r}")
        for what, value, kinds in (
            ("full_attention", self.full_attention, (GQAAttention, MLAAttention)),
            ("linear", self.linear, (LinearAttention, Mamba2Mixer)),
        ):
            if not isinstance(value, kinds):
                raise ConfigError(f"model {self.name!r}: {what} must be one of {[k.__name__ for k in kinds]}")
        for what, value in (("default_ssm_dtype", self.default_ssm_dtype), ("model_dtype", self.model_dtype)):
            if not isinstance(value, str):
                raise ConfigError(f"model {self.name!r}: {what} must be a dtype name, got {value!r}")
        object.__setattr__(self, "layers", expand_layer_pattern(self.layer_pattern))
        if self.num_full_layers == 0:
            raise ConfigError(f"model {self.name!r}: the layer pattern has no full-attention layer (F)")
        if self.num_linear_layers == 0:
            raise ConfigError(f"model {self.name!r}: the layer pattern has no linear layer (L); not a hybrid")
        _positive("context_len", self.context_len, f"model {self.name!r}", MAX_CONTEXT_LEN)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_full_layers(self) -> int:
        return self.layers.count("F")

    @property
    def num_linear_layers(self) -> int:
        return self.layers.count("L")


# Kimi K3, every number from the seeds: 93 layers = 23 x (3 KDA + 1 MLA) + 1 MLA -> 69 KDA + 24 MLA;
# MLA as DeepSeek V3.1 (kv_lora_rank 512 + qk_rope_head_dim 64 = 576 elements per token and layer);
# KDA 96 heads of dim 128 (K = V = 128), short-conv kernel 4. The q head count of MLA is not in the seeds
# and does not enter the KV size; 64 is DeepSeek V3's and only bounds the TP sizes accepted.
KIMI_K3 = ModelSpec(
    name="kimi-k3",
    layer_pattern="LLLF*23+F",
    full_attention=MLAAttention(num_q_heads=64, kv_lora_rank=512, qk_rope_head_dim=64),
    linear=LinearAttention(kind="kda", num_k_heads=96, num_v_heads=96, head_k_dim=128, head_v_dim=128),
)

# Qwen3-Next-80B-A3B (DESIGN.md §8): 48 layers, 3 Gated DeltaNet + 1 full attention, repeated 12 times;
# full attention 16 q / 2 kv heads of dim 256; GDN 16 key heads, 32 value heads, head dims 128, kernel 4.
# SSM state defaults to float32 (SGLang reference §6.1: "Qwen3-Next defaults to float32").
QWEN3_NEXT_80B_A3B = ModelSpec(
    name="qwen3-next-80b-a3b",
    layer_pattern="LLLF*12",
    full_attention=GQAAttention(num_q_heads=16, num_kv_heads=2, head_dim=256),
    linear=LinearAttention(kind="gdn", num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128),
)

PRESETS: dict[str, ModelSpec] = {m.name: m for m in (KIMI_K3, QWEN3_NEXT_80B_A3B)}


def _build(cls: type, data: dict[str, Any], what: str) -> Any:
    try:
        return cls(**data)
    except TypeError as exc:
        raise ConfigError(f"model file: bad {what} fields {sorted(data)}: {exc}") from None


def model_from_dict(data: dict[str, Any]) -> ModelSpec:
    """Build a :class:`ModelSpec` from plain data (the JSON model-file format).

    Example::

        {"name": "my-hybrid", "layer_pattern": "LLLF*8",
         "full_attention": {"kind": "gqa", "num_q_heads": 32, "num_kv_heads": 4, "head_dim": 128},
         "linear": {"kind": "mamba2", "num_heads": 64, "head_dim": 64, "state_size": 128, "n_groups": 8}}

    ``full_attention.kind`` is ``mha``/``gqa`` or ``mla``; ``linear.kind`` is ``gdn``, ``kda`` or ``mamba2``.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"model file: must hold one JSON object, got {type(data).__name__}")
    data = dict(data)
    try:
        full, linear = data.pop("full_attention"), data.pop("linear")
    except KeyError as exc:
        raise ConfigError(f"model file: missing section {exc.args[0]!r}") from None
    for what, section in (("full_attention", full), ("linear", linear)):
        if not isinstance(section, dict):
            raise ConfigError(f"model file: {what} must be an object of fields, got {type(section).__name__}")
    full, linear = dict(full), dict(linear)
    full_kind = str(full.pop("kind", "gqa")).lower()
    if full_kind in ("mha", "gqa"):
        full_spec = _build(GQAAttention, full, "full_attention")
    elif full_kind == "mla":
        full_spec = _build(MLAAttention, full, "full_attention")
    else:
        raise ConfigError(f"model file: full_attention.kind must be mha, gqa or mla, got {full_kind!r}")
    linear_kind = str(linear.pop("kind", "")).lower()
    if linear_kind == "mamba2":
        linear_spec = _build(Mamba2Mixer, linear, "linear")
    elif linear_kind in ("gdn", "kda"):
        if linear_kind == "kda" and "num_heads" in linear:
            if "head_dim" not in linear:
                raise ConfigError("model file: linear (kda) with num_heads needs head_dim too")
            heads, dim = linear.pop("num_heads"), linear.pop("head_dim")
            linear.update(num_k_heads=heads, num_v_heads=heads, head_k_dim=dim, head_v_dim=dim)
        linear_spec = _build(LinearAttention, {"kind": linear_kind, **linear}, "linear")
    else:
        raise ConfigError(f"model file: linear.kind must be gdn, kda or mamba2, got {linear_kind!r}")
    return _build(ModelSpec, {**data, "full_attention": full_spec, "linear": linear_spec}, "model")


def load_model(name_or_path: str) -> ModelSpec:
    """A preset by name (``kimi-k3``, ``qwen3-next-80b-a3b``) or a model described in a JSON file."""
    if not isinstance(name_or_path, str):
        raise ConfigError(
            f"model must be a preset name or a .json path (str), got {type(name_or_path).__name__}"
        )
    key = name_or_path.lower()
    if key in PRESETS:
        return PRESETS[key]
    path = Path(name_or_path)
    if path.suffix == ".json" and path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"model={name_or_path!r}: not valid JSON ({exc})") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"model={name_or_path!r}: not UTF-8 text (byte {exc.start}); not a model file"
            ) from None
        except RecursionError:
            raise ConfigError(f"model={name_or_path!r}: JSON nested too deeply; not a model file") from None
        except ValueError as exc:  # an integer literal past the digit limit
            raise ConfigError(f"model={name_or_path!r}: not valid JSON ({exc})") from None
        except OSError as exc:
            raise ConfigError(f"model={name_or_path!r}: cannot read ({exc.strerror or exc})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"model={name_or_path!r}: the file must hold one JSON object")
        data.setdefault("name", path.stem)
        return model_from_dict(data)
    raise ConfigError(
        f"model={name_or_path!r} is neither a preset ({', '.join(PRESETS)}) nor a JSON model file; "
        "pick a preset or describe the model in a .json file"
    )
