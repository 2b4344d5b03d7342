"""Byte math: what one KV token, one state slot and one ReplaySSM ring entry cost on one GPU.

Everything here is exact integer arithmetic on tensor shapes, the way SGLang sizes its pools; the figures
in the seeds fall out of it (the tests in ``property_tests/test_capacity_seeds.py`` check each one).

Units: every ``*_bytes`` value is a count of bytes. SGLang's logs print ``GB`` meaning GiB (``1 << 30``
bytes) and the seeds print ``MB``/``KB`` meaning MiB/KiB; :data:`GIB`, :data:`MIB` and :data:`KIB` make that
explicit, and :func:`gib`/:func:`mib`/:func:`kib` convert.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from mamba_radix.capacity.models import GQAAttention, LinearAttention, Mamba2Mixer, MLAAttention, ModelSpec
from mamba_radix.errors import ConfigError

__all__ = [
    "CONV_DTYPES",
    "GIB",
    "KIB",
    "KV_CACHE_DTYPES",
    "MIB",
    "SSM_DTYPES",
    "KVTokenBytes",
    "Parallelism",
    "ReplayRingBytes",
    "StateSlotBytes",
    "check_ring_len",
    "gib",
    "kib",
    "kv_pool_bytes",
    "kv_token_bytes",
    "mib",
    "replay_ring_bytes",
    "resolve_kv_cache_dtype",
    "state_slot_bytes",
    "torch_dtype_name",
]

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30  # SGLang's "GB" in its allocation logs

# Element sizes in bytes of the dtypes each flag accepts (SGLang's spellings).
KV_CACHE_DTYPES: dict[str, int] = {
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "float32": 4,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
SSM_DTYPES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
CONV_DTYPES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}
_TORCH_NAMES = {
    "bfloat16": "torch.bfloat16",
    "bf16": "torch.bfloat16",
    "float16": "torch.float16",
    "fp16": "torch.float16",
    "float32": "torch.float32",
    "fp8_e4m3": "torch.float8_e4m3fn",
    "fp8_e5m2": "torch.float8_e5m2",
}


def _bytes(num_bytes: object) -> float:
    if isinstance(num_bytes, bool) or not isinstance(num_bytes, (int, float, Fraction)):
        raise ConfigError(f"a byte count must be a number, got {type(num_bytes).__name__} {num_bytes!r}")
    return float(num_bytes)


def gib(num_bytes: int | float | Fraction) -> float:
    return _bytes(num_bytes) / GIB


def mib(num_bytes: int | float | Fraction) -> float:
    return _bytes(num_bytes) / MIB


def kib(num_bytes: int | float | Fraction) -> float:
    return _bytes(num_bytes) / KIB


def torch_dtype_name(dtype: str) -> str:
    """The torch name SGLang prints in its KV log (``fp8_e4m3`` -> ``torch.float8_e4m3fn``)."""
    if not isinstance(dtype, str):
        raise ConfigError(f"a dtype name must be a string, got {dtype!r}")
    return _TORCH_NAMES.get(dtype, dtype)


def _dtype_size(dtype: str, table: dict[str, int], name: str) -> int:
    if not isinstance(dtype, str) or dtype not in table:
        raise ConfigError(f"{name}={dtype!r} is not a known dtype; use one of {', '.join(table)}")
    return table[dtype]


def resolve_kv_cache_dtype(kv_cache_dtype: str, model: ModelSpec) -> str:
    """``auto`` means the model's dtype, as in SGLang; anything else must be a known KV dtype."""
    dtype = model.model_dtype if kv_cache_dtype == "auto" else kv_cache_dtype
    _dtype_size(dtype, KV_CACHE_DTYPES, "kv_cache_dtype")
    return dtype


MAX_PARALLEL = 1 << 16  # GPUs in one TP group: far beyond any deployment, keeps divisor lists short


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


@dataclass(frozen=True)
class Parallelism:
    """Tensor parallel size and decode-context-parallel size (DCP shards each request's KV tokens).

    TP splits the heads of every layer. A full-attention layer has fewer KV heads than query heads (MLA has a
    single latent "head"), so past ``num_kv_heads`` GPUs TP *replicates* the KV cache: with MLA every GPU
    holds the whole KV of every request. DCP spends that replication: each of ``dcp_size`` GPUs that would
    hold the same KV keeps 1/dcp_size of the tokens instead. It must therefore divide the replication factor.
    """

    tp_size: int = 1
    dcp_size: int = 1

    def __post_init__(self) -> None:
        for name, value in (("tp_size", self.tp_size), ("dcp_size", self.dcp_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
            if value > MAX_PARALLEL:
                raise ConfigError(f"{name} must be <= {MAX_PARALLEL}, got {value!r}")
        if self.tp_size % self.dcp_size != 0:
            raise ConfigError(
                f"dcp_size={self.dcp_size} must divide tp_size={self.tp_size}; "
                f"use one of {_divisors(self.tp_size)}"
            )

    def split(self, count: int, what: str, model: ModelSpec) -> int:
        """``count / tp_size``, or a ConfigError naming the heads TP does not divide."""
        if count % self.tp_size != 0:
            raise ConfigError(
                f"tp_size={self.tp_size} does not divide the {count} {what} of {model.name}; "
                f"use a tp_size that divides {count} ({_divisors(count)})"
            )
        return count // self.tp_size

    def kv_heads_per_gpu(self, model: ModelSpec) -> tuple[int, int]:
        """(KV heads each GPU stores, how many GPUs hold the same KV heads) for the full-attention layers."""
        attn = model.full_attention
        self.split(attn.num_q_heads, "query heads of the full-attention layers", model)
        kv_heads = attn.num_kv_heads
        if kv_heads >= self.tp_size:
            return self.split(kv_heads, "KV heads of the full-attention layers", model), 1
        if self.tp_size % kv_heads != 0:
            raise ConfigError(
                f"tp_size={self.tp_size} is neither a divisor nor a multiple of the {kv_heads} KV heads of "
                f"{model.name}; use a tp_size that divides or is a multiple of {kv_heads}"
            )
        return 1, self.tp_size // kv_heads

    def check_dcp(self, model: ModelSpec) -> int:
        """The KV replication factor under TP; raises if ``dcp_size`` does not divide it."""
        _, replication = self.kv_heads_per_gpu(model)
        if replication % self.dcp_size != 0:
            raise ConfigError(
                f"dcp_size={self.dcp_size} must divide the KV replication factor {replication} of "
                f"{model.name} at tp_size={self.tp_size} (each KV head is held by {replication} GPU(s)); "
                f"use a dcp_size in {_divisors(replication)}"
            )
        return replication


@dataclass(frozen=True)
class KVTokenBytes:
    """Full-attention KV bytes per token on one GPU.

    ``row_bytes`` is one row of the token pool on one GPU (all full layers); with DCP a GPU stores only
    every ``dcp_size``-th token of a request, so a request's token costs ``row_bytes / dcp_size`` per GPU
    (``bytes_per_token``, exact as a fraction).
    """

    dtype: str
    num_full_layers: int
    elements_per_layer: int  # per token and layer on one GPU
    element_bytes: int
    dcp_size: int
    replication: int  # GPUs holding the same KV heads under TP (before DCP spends it)

    @property
    def row_bytes(self) -> int:
        return self.num_full_layers * self.elements_per_layer * self.element_bytes

    @property
    def bytes_per_token(self) -> Fraction:
        return Fraction(self.row_bytes, self.dcp_size)


def _check_model_par(model: object, par: object) -> None:
    if not isinstance(model, ModelSpec):
        raise ConfigError(
            f"model must be a ModelSpec (e.g. load_model('kimi-k3')), got {type(model).__name__}"
        )
    if not isinstance(par, Parallelism):
        raise ConfigError(f"parallelism must be a Parallelism, got {type(par).__name__}")


def kv_token_bytes(model: ModelSpec, par: Parallelism, kv_cache_dtype: str) -> KVTokenBytes:
    """KV bytes per token per GPU for ``model`` under ``par`` with ``kv_cache_dtype`` (``auto`` allowed).

    MLA: ``kv_lora_rank + qk_rope_head_dim`` elements per layer, every token quantised alike in fp8
    (seed 000: 24 x 576 x 2 = 27 KiB per token in bf16, 13.5 KiB in fp8). GQA/MHA: K and V for each KV head
    the GPU holds.
    """
    _check_model_par(model, par)
    dtype = resolve_kv_cache_dtype(kv_cache_dtype, model)
    kv_heads, _ = par.kv_heads_per_gpu(model)
    replication = par.check_dcp(model)
    attn = model.full_attention
    if isinstance(attn, MLAAttention):
        elements = attn.kv_lora_rank + attn.qk_rope_head_dim
    else:
        assert isinstance(attn, GQAAttention)
        elements = 2 * kv_heads * attn.head_dim
    return KVTokenBytes(
        dtype=dtype,
        num_full_layers=model.num_full_layers,
        elements_per_layer=elements,
        element_bytes=KV_CACHE_DTYPES[dtype],
        dcp_size=par.dcp_size,
        replication=replication,
    )


def kv_pool_bytes(kv: KVTokenBytes, num_tokens: int, page_size: int = 1) -> int:
    """Bytes of a token pool of ``num_tokens`` on one GPU: SGLang allocates ``num_tokens + page_size`` rows
    (the first page is the padding sink)."""
    for name, value, low in (("num_tokens", num_tokens, 0), ("page_size", page_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
    return (num_tokens + page_size) * kv.row_bytes


@dataclass(frozen=True)
class StateSlotBytes:
    """Bytes of one state slot on one GPU, over all linear layers: conv window and temporal state apart.

    ``conv_shape`` and ``temporal_shape`` are per layer and per GPU (heads already divided by TP).
    """

    num_linear_layers: int
    conv_shape: tuple[int, ...]
    temporal_shape: tuple[int, ...]
    conv_dtype: str
    ssm_dtype: str

    @property
    def conv_bytes(self) -> int:
        return self.num_linear_layers * _prod(self.conv_shape) * CONV_DTYPES[self.conv_dtype]

    @property
    def temporal_bytes(self) -> int:
        return self.num_linear_layers * _prod(self.temporal_shape) * SSM_DTYPES[self.ssm_dtype]

    @property
    def slot_bytes(self) -> int:
        return self.conv_bytes + self.temporal_bytes

    def pool_conv_bytes(self, num_slots: int) -> int:
        """Conv bytes of a pool of ``num_slots`` usable slots: SGLang allocates ``num_slots + 1`` (slot 0 is
        the padding sink; seed 000: "实际分配的slot为size + 1")."""
        return (num_slots + 1) * self.conv_bytes

    def pool_temporal_bytes(self, num_slots: int) -> int:
        return (num_slots + 1) * self.temporal_bytes


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def state_slot_bytes(
    model: ModelSpec, par: Parallelism, ssm_dtype: str | None = None, conv_dtype: str = "bfloat16"
) -> StateSlotBytes:
    """Per-slot state bytes on one GPU (``ssm_dtype`` None = the model's default, as SGLang).

    GDN/KDA (seed 000, TP8 Kimi K3): conv ``[conv_kernel - 1, 2 * Hk * Dk + Hv * Dv]`` = ``[3, 4608]`` and
    temporal ``[Hv, Dv, Dk]`` = ``[12, 128, 128]`` per layer; x 69 layers x 2 bytes = 1.82 MB and 25.9 MB.
    Mamba2: conv ``[conv_kernel - 1, H * P + 2 * G * N]``, temporal ``[H, P, N]``; a single group is
    replicated on every GPU.
    """
    _check_model_par(model, par)
    ssm = ssm_dtype if ssm_dtype is not None else model.default_ssm_dtype
    _dtype_size(ssm, SSM_DTYPES, "mamba_ssm_dtype")
    _dtype_size(conv_dtype, CONV_DTYPES, "mamba_conv_dtype")
    mixer = model.linear
    if isinstance(mixer, LinearAttention):
        what = f"{mixer.kind} layers"
        hk = par.split(mixer.num_k_heads, f"key heads of the {what}", model)
        hv = par.split(mixer.num_v_heads, f"value heads of the {what}", model)
        channels = 2 * hk * mixer.head_k_dim + hv * mixer.head_v_dim
        conv_shape = (mixer.conv_kernel - 1, channels)
        temporal_shape = (hv, mixer.head_v_dim, mixer.head_k_dim)
    else:
        assert isinstance(mixer, Mamba2Mixer)
        heads = par.split(mixer.num_heads, "heads of the mamba2 layers", model)
        # A single group is replicated on every GPU rather than split.
        groups = 1 if mixer.n_groups == 1 else par.split(mixer.n_groups, "groups of the mamba2 layers", model)
        channels = heads * mixer.head_dim + 2 * groups * mixer.state_size
        conv_shape = (mixer.conv_kernel - 1, channels)
        temporal_shape = (heads, mixer.head_dim, mixer.state_size)
    return StateSlotBytes(
        num_linear_layers=model.num_linear_layers,
        conv_shape=conv_shape,
        temporal_shape=temporal_shape,
        conv_dtype=conv_dtype,
        ssm_dtype=ssm,
    )


RING_NAMES: tuple[str, ...] = ("d", "k", "g", "rawv", "rawk", "beta")


def check_ring_len(cache_len: int, verify_tokens: int | None) -> None:
    """``cache_len`` (``linear_replayssm_cache_len``) must be a power of two and at least twice the verify window
    (seed 001: DSpark gamma 7 -> 1 anchor + 7 drafts = 8 verify tokens -> L >= 16)."""
    if not isinstance(cache_len, int) or isinstance(cache_len, bool) or cache_len < 1:
        raise ConfigError(f"linear_replayssm_cache_len must be a positive integer, got {cache_len!r}")
    # the smallest length the verify window allows (a power of two >= 2 x the window), so a hint never
    # names a length the next check refuses
    need = 1 if verify_tokens is None else 1 << max(0, (2 * verify_tokens - 1).bit_length())
    if cache_len & (cache_len - 1):
        lower = 1 << (cache_len.bit_length() - 1)
        options = [n for n in (lower, lower * 2) if n >= need] or [need]
        raise ConfigError(
            f"linear_replayssm_cache_len={cache_len} is not a power of two; use {' or '.join(map(str, options))}"
        )
    if verify_tokens is not None and cache_len < 2 * verify_tokens:
        raise ConfigError(
            f"linear_replayssm_cache_len={cache_len} must be >= 2 x the {verify_tokens} verify tokens "
            f"(speculative_num_draft_tokens={verify_tokens}); use {need}"
        )


@dataclass(frozen=True)
class ReplayRingBytes:
    """ReplaySSM ring buffers of one slot on one GPU, over all linear layers.

    Per layer and slot (``H`` = value heads per GPU, ``L`` = ring length): ``d``, ``k``, ``rawv``, ``rawk``
    are ``[H, L, head_dim]`` in the conv/activation dtype; ``g`` is ``[H, L, head_k_dim]`` in fp32 for KDA
    (a per-K-channel gate) but ``[H, L]`` for GDN (one scalar per head); ``beta`` is ``[H, L]`` in fp32.
    (Seed 000: "69 × 81 × 12 × 16 × 128 × 2 = 274,710,528 bytes" for d at 80 slots.) For GDN, whose key and
    value heads differ, the rings are taken per value head, which is how the recurrence runs; the seeds only
    measure KDA.
    """

    cache_len: int
    num_linear_layers: int
    shapes: dict[str, tuple[int, ...]]
    element_bytes: dict[str, int]

    def ring_bytes(self, name: str) -> int:
        return self.num_linear_layers * _prod(self.shapes[name]) * self.element_bytes[name]

    @property
    def slot_bytes(self) -> int:
        return sum(self.ring_bytes(name) for name in RING_NAMES)

    def pool_bytes(self, name: str, num_slots: int) -> int:
        """Bytes of ring ``name`` for ``num_slots`` usable slots (``num_slots + 1`` allocated)."""
        return (num_slots + 1) * self.ring_bytes(name)


def replay_ring_bytes(
    model: ModelSpec,
    par: Parallelism,
    cache_len: int = 16,
    verify_tokens: int | None = None,
    conv_dtype: str = "bfloat16",
) -> ReplayRingBytes:
    """Ring buffers allocated by ``--enable-linear-replayssm-spec`` (validated ring length)."""
    _check_model_par(model, par)
    check_ring_len(cache_len, verify_tokens)
    _dtype_size(conv_dtype, CONV_DTYPES, "mamba_conv_dtype")
    mixer = model.linear
    if not isinstance(mixer, LinearAttention):
        raise ConfigError(
            f"enable_linear_replayssm_spec=True needs GDN or KDA linear layers; {model.name} has {mixer.kind}; "
            "leave enable_linear_replayssm_spec off"
        )
    heads = par.split(mixer.num_v_heads, f"value heads of the {mixer.kind} layers", model)
    length = cache_len
    gate = (heads, length, mixer.head_k_dim) if mixer.kind == "kda" else (heads, length)
    shapes = {
        "d": (heads, length, mixer.head_v_dim),
        "k": (heads, length, mixer.head_k_dim),
        "g": gate,
        "rawv": (heads, length, mixer.head_v_dim),
        "rawk": (heads, length, mixer.head_k_dim),
        "beta": (heads, length),
    }
    act = CONV_DTYPES[conv_dtype]
    sizes = {"d": act, "k": act, "g": 4, "rawv": act, "rawk": act, "beta": 4}
    return ReplayRingBytes(
        cache_len=cache_len,
        num_linear_layers=model.num_linear_layers,
        shapes=shapes,
        element_bytes=sizes,
    )
