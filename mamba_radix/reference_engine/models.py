"""Run a transformers hybrid model over a span of tokens with its caches living in OUR pools.

:meth:`HybridModel.forward_span` is the one model call an engine makes per prefill chunk or decode step:
given the tokens ``[start, end)``, the KV indices of the prefix ``[0, start)`` and of the new tokens, and
the state slot holding the recurrent/conv state at ``start``, it runs the unmodified transformers layers
and leaves the new tokens' KV in the KV storage, the state at ``end`` in the write slot and, when asked,
the state at an intermediate ``track_len`` in a track slot.

The bridge is :class:`PoolBackedCache`, duck-typing the part of transformers' ``Cache`` API these models
call: ``update`` for full attention (write the new K/V at our indices, return the whole prefix read back
from our storage) and ``get/update_conv_state``, ``get/update_recurrent_state`` for linear layers (a working
copy gathered from the slot with :func:`mamba_radix.state_ops.gather_slots`, scattered back with
:func:`~mamba_radix.state_ops.scatter_slots`).

State layout per linear layer (what a :class:`~mamba_radix.pools.MambaPool` slot holds):

- conv: the last ``kernel`` inputs of the causal conv, transformers' layout. SGLang keeps ``kernel - 1``
  (the oldest column never reaches an output), but CPU ``conv1d`` rounds a 1-output window differently
  from a 2-output one, so ``kernel - 1`` columns cost bit-exactness against transformers' own cache
  (measured: 1 ulp after a few decode steps). Kimi Linear keeps three conv tensors (q, k, v: its
  checkpoint has three short convs; transformers fuses them into one depthwise conv, so splitting the
  channels is exact); Qwen3-Next one (q, k, v fused).
- temporal: the delta-rule state ``[heads, k_head_dim, v_head_dim]`` in fp32.

Tolerance (:data:`LOGIT_ATOL`): see its comment. Everything runs in fp32 on the CPU; ``eager`` attention.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from mamba_radix import state_ops
from mamba_radix.errors import InvalidArgument
from mamba_radix.pools import HybridLinearKVPool, MambaPool, MHATokenToKVPool, MLATokenToKVPool

# Nothing may be fetched from a hub: tiny configs are built in code, weights come from torch.manual_seed.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import transformers  # after HF_HUB_OFFLINE is set

if tuple(int(p) for p in transformers.__version__.split(".")[:2] if p.isdigit()) < (5, 23):
    raise ImportError(
        f"mamba_radix.reference_engine needs transformers>=5.23,<6 (Kimi Linear, Qwen3-Next with the "
        f"cache API used here), found {transformers.__version__}: pip install 'mamba-radix[engine]'"
    )

__all__ = [
    "LOGIT_ATOL",
    "HybridModel",
    "PoolBackedCache",
    "SlotState",
    "tiny_kimi_linear",
    "tiny_model",
    "tiny_qwen3_next",
]

# Max |logit difference| allowed between two fp32 evaluations of the same tokens that differ only in how
# the work is split (chunk boundaries, track-point splits, recurrent decode vs the chunked kernel of a
# plain forward, a state restored from a checkpoint). Derivation: both sides compute the same real
# function and differ only in the rounding of reassociated sums (fp32 unit roundoff u = 2^-24 ~ 6.0e-8).
# The longest chain of roundings from a split point to a logit: 4 layers x (delta rule: a <= 64-step
# forward substitution and a 64-term matmul; attention over <= 128 keys; MLP 128 + 64 terms) + lm_head
# 64 terms, n ~ 4 * (64 + 64 + 128 + 192) + 64 ~ 1.9e3. Independent zero-mean roundings add like a random
# walk: sqrt(n) * u * max|logit| ~ 44 * 6.0e-8 * 0.7 ~ 1.8e-6 (|logit| <= 0.7 for the tiny models).
# LOGIT_ATOL = 1e-5 is 5.5x that. The all-roundings-aligned bound n * u * max|logit| ~ 8e-5 is not
# approached: over every forward of property_tests/test_reference_engine.py (462: chunks, track splits,
# decode steps, restores) and every checkpoint probe, the largest difference measured is 3.1e-7 (5 ulp
# of 0.6), 30x below the tolerance. The smallest planted-bug effect measured there (a checkpoint one grid
# step off) is 3.1e-4, 30x above it; a state one token off moves logits by >= 3e-2.
LOGIT_ATOL = 1e-5


@dataclass(frozen=True)
class _LayerMap:
    """Global layer ids by kind, and each layer's index inside its pool."""

    full: tuple[int, ...]
    linear: tuple[int, ...]


@contextmanager
def _torch_threads(num_threads: int | None) -> Iterator[None]:
    """Run the block with ``num_threads`` torch threads (``None``: as set), restoring the setting after."""
    if num_threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class HybridModel:
    """A transformers hybrid causal LM (Kimi Linear or Qwen3-Next), eval mode, fp32, with the pool shapes
    its caches need. Build one with :func:`tiny_kimi_linear` / :func:`tiny_qwen3_next`, or wrap any
    ``KimiLinearForCausalLM`` / ``Qwen3NextForCausalLM`` yourself.

    ``num_threads``: torch threads for this model's forwards, restored after each (``None``: leave
    torch's setting). The tiny models use 1: their ops are so small that a thread pool only adds
    synchronisation (100x slower on a busy 2-core machine, measured).
    """

    def __init__(self, model: Any, num_threads: int | None = None) -> None:
        if num_threads is not None and (
            isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1
        ):
            raise InvalidArgument(f"num_threads must be None or an int >= 1, got {num_threads!r}")
        self.num_threads = num_threads
        config = model.config
        if config.model_type not in ("kimi_linear", "qwen3_next"):
            raise InvalidArgument(
                f"HybridModel supports kimi_linear and qwen3_next, got model_type {config.model_type!r}"
            )
        if getattr(config, "_attn_implementation", "eager") != "eager":
            raise InvalidArgument(
                f"HybridModel needs attn_implementation='eager' (got {config._attn_implementation!r}): "
                "its attention mask is an additive float mask"
            )
        dtypes = {p.dtype for p in model.parameters()}
        if dtypes != {torch.float32}:
            raise InvalidArgument(
                "HybridModel runs fp32 (LOGIT_ATOL is derived for it); got parameters in "
                f"{sorted(map(str, dtypes))}: call model.float() first"
            )
        self.model = model.eval()
        self.config = config
        self.family: str = config.model_type
        types = list(config.layer_types)
        self.layers = _LayerMap(
            full=tuple(i for i, t in enumerate(types) if t == "full_attention"),
            linear=tuple(i for i, t in enumerate(types) if t == "linear_attention"),
        )
        if not self.layers.full or not self.layers.linear:
            raise InvalidArgument(f"a hybrid model needs both layer kinds, got layer_types {types}")
        self.vocab_size: int = config.vocab_size
        self.dtype = torch.float32
        kernel = config.linear_conv_kernel_dim
        if self.family == "kimi_linear":
            qkv = config.linear_num_heads * config.linear_head_dim
            self.conv_shapes: list[tuple[int, ...]] = [(qkv, kernel)] * 3
            self.temporal_shape: tuple[int, ...] = (
                config.linear_num_heads,
                config.linear_head_dim,
                config.linear_head_dim,
            )
        else:
            key_dim = config.linear_num_key_heads * config.linear_key_head_dim
            value_dim = config.linear_num_value_heads * config.linear_value_head_dim
            self.conv_shapes = [(2 * key_dim + value_dim, kernel)]
            self.temporal_shape = (
                config.linear_num_value_heads,
                config.linear_key_head_dim,
                config.linear_value_head_dim,
            )

    # ------------------------------------------------------------------------------------------- pools
    def new_kv_pool(self, num_tokens: int, page_size: int = 1) -> MHATokenToKVPool | MLATokenToKVPool:
        """Full-attention KV storage for ``num_tokens`` KV indices (+ the padding row/page), fp32:
        MLA latents for Kimi Linear, GQA keys/values for Qwen3-Next."""
        c = self.config
        if self.family == "kimi_linear":
            return MLATokenToKVPool(
                num_tokens, page_size, self.dtype, c.kv_lora_rank, c.qk_rope_head_dim, len(self.layers.full)
            )
        return MHATokenToKVPool(
            num_tokens, page_size, self.dtype, c.num_key_value_heads, c.head_dim, len(self.layers.full)
        )

    def new_mamba_pool(self, num_slots: int) -> MambaPool:
        """A :class:`MambaPool` of ``num_slots`` slots with this model's conv and temporal shapes, fp32."""
        return MambaPool(
            num_slots,
            len(self.layers.linear),
            self.conv_shapes,
            self.temporal_shape,
            conv_dtypes=self.dtype,
            temporal_dtype=self.dtype,
        )

    def pools_view(
        self, kv_pool: MHATokenToKVPool | MLATokenToKVPool, mamba_pool: MambaPool
    ) -> HybridLinearKVPool:
        """The by-global-layer-id view :meth:`forward_span` reads and writes."""
        return HybridLinearKVPool(kv_pool, self.layers.full, mamba_pool, self.layers.linear)

    # ----------------------------------------------------------------------------------------- forward
    @torch.no_grad()
    def forward_span(
        self,
        pools: HybridLinearKVPool,
        token_ids: Sequence[int],
        start: int,
        prefix_kv: torch.Tensor,
        new_kv: torch.Tensor,
        read_slot: int,
        write_slot: int,
        track_len: int | None = None,
        track_slot: int | None = None,
    ) -> torch.Tensor:
        """Run tokens ``token_ids`` (positions ``[start, start + n)``) and return their logits ``[n, vocab]``.

        Reads the prefix KV at ``prefix_kv`` (``start`` indices) and the state at ``start`` from
        ``read_slot``. Side effects: writes the new tokens' KV at ``new_kv`` (``n`` indices), the state at
        ``start + n`` into ``write_slot`` (may equal ``read_slot``) and, with ``track_slot``, the state at
        ``track_len`` (``start < track_len <= start + n``) into ``track_slot``. A track point inside the
        span runs it in two pieces, ``[start, track_len)`` then ``[track_len, end)``. Cost: one transformers
        forward per piece, attention O(n * (start + n)).
        """
        n = len(token_ids)
        end = start + n
        prefix_kv = torch.as_tensor(prefix_kv, dtype=torch.int64)
        new_kv = torch.as_tensor(new_kv, dtype=torch.int64)
        if n < 1 or start < 0 or prefix_kv.numel() != start or new_kv.numel() != n:
            raise InvalidArgument(
                f"forward_span needs n >= 1 tokens, start >= 0, {start} prefix KV indices and {n} new ones; "
                f"got n={n}, start={start}, {prefix_kv.numel()} prefix and {new_kv.numel()} new indices"
            )
        if (track_slot is None) != (track_len is None):
            raise InvalidArgument("pass track_len and track_slot together (or neither)")
        if track_len is not None and not start < track_len <= end:
            raise InvalidArgument(f"track_len {track_len} must lie in ({start}, {end}]")
        with _torch_threads(self.num_threads):
            return self._span(
                pools, token_ids, start, prefix_kv, new_kv, read_slot, write_slot, track_len, track_slot
            )

    def _span(
        self,
        pools: HybridLinearKVPool,
        token_ids: Sequence[int],
        start: int,
        prefix_kv: torch.Tensor,
        new_kv: torch.Tensor,
        read_slot: int,
        write_slot: int,
        track_len: int | None,
        track_slot: int | None,
    ) -> torch.Tensor:
        n = len(token_ids)
        state = SlotState.gather(self, pools.mamba_pool, read_slot)
        if start == 0 and not state.is_zero():
            # The kernels ignore the state at position 0 (as SGLang's do without an initial state), so a
            # slot the cache forgot to clear would go unnoticed: refuse it instead.
            raise InvalidArgument(
                f"slot {read_slot} holds a non-zero state for a span starting at position 0; a request "
                "without a hit must start from a cleared slot (MambaPool.clear)"
            )
        ids = torch.as_tensor(list(token_ids), dtype=torch.int64)
        cut = n if track_len is None else track_len - start
        logits = [self._piece(pools, state, ids[:cut], start, prefix_kv, new_kv[:cut])]
        if track_slot is not None:
            state.scatter(pools.mamba_pool, track_slot)
        if cut < n:
            done_kv = torch.cat([prefix_kv, new_kv[:cut]])
            logits.append(self._piece(pools, state, ids[cut:], start + cut, done_kv, new_kv[cut:]))
        state.scatter(pools.mamba_pool, write_slot)
        return torch.cat(logits)

    def _piece(
        self,
        pools: HybridLinearKVPool,
        state: SlotState,
        ids: torch.Tensor,
        start: int,
        prefix_kv: torch.Tensor,
        new_kv: torch.Tensor,
    ) -> torch.Tensor:
        n = ids.numel()
        cache = PoolBackedCache(self, pools, state, start, prefix_kv, new_kv)
        q_pos = torch.arange(start, start + n)
        k_pos = torch.arange(start + n)
        blocked = k_pos[None, :] > q_pos[:, None]
        mask = torch.zeros(n, start + n, dtype=self.dtype).masked_fill(blocked, torch.finfo(self.dtype).min)
        out = self.model(
            input_ids=ids[None],
            position_ids=q_pos[None],
            attention_mask={"full_attention": mask[None, None], "linear_attention": None},
            cache=cache,
            use_cache=True,
        )
        return out.logits[0]

    @torch.no_grad()
    def reference_logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        """A plain transformers forward of the whole sequence from scratch, no cache: ``[len, vocab]``."""
        ids = torch.as_tensor(list(token_ids), dtype=torch.int64)[None]
        with _torch_threads(self.num_threads):
            return self.model(input_ids=ids, use_cache=False).logits[0]


class SlotState:
    """The recurrent/conv state of one request between slot reads and writes: per linear layer ``j`` a conv
    window ``conv[j]`` ``[1, conv_dim, kernel]`` (the pool's conv tensors concatenated on channels) and
    the delta-rule state ``temporal[j]`` ``[1, heads, dk, dv]``. The model reads and overwrites these."""

    def __init__(self, model: HybridModel, conv: list[torch.Tensor], temporal: list[torch.Tensor]) -> None:
        self.model = model
        self.conv = conv
        self.temporal = temporal

    @classmethod
    def gather(cls, model: HybridModel, pool: MambaPool, slot: int) -> SlotState:
        """Copy slot ``slot`` out of the pool (one :func:`state_ops.gather_slots` over all layers)."""
        out = [torch.empty((t.shape[0], 1, *t.shape[2:]), dtype=t.dtype) for t in pool.tensors]
        state_ops.gather_slots(pool.tensors, torch.tensor([slot]), out)
        *convs, temporal = out
        num_layers = temporal.shape[0]
        conv = [torch.cat([c[j] for c in convs], dim=1) for j in range(num_layers)]
        return cls(model, conv, [temporal[j].clone() for j in range(num_layers)])

    def is_zero(self) -> bool:
        """Whether every conv window and recurrent state is all zeros."""
        return all(not bool(t.any()) for t in (*self.conv, *self.temporal))

    def scatter(self, pool: MambaPool, slot: int) -> None:
        """Write this state into slot ``slot`` (one :func:`state_ops.scatter_slots`)."""
        widths = [shape[0] for shape in self.model.conv_shapes]
        per_layer = [torch.split(c, widths, dim=1) for c in self.conv]
        convs = [torch.stack([parts[i] for parts in per_layer]) for i in range(len(widths))]
        temporal = torch.stack(self.temporal)
        state_ops.scatter_slots(pool.tensors, torch.tensor([slot]), [*convs, temporal])


class PoolBackedCache:
    """Duck-types the slice of transformers' ``Cache`` API that Kimi Linear and Qwen3-Next layers call,
    backed by our pools for one forward piece over positions ``[start, start + len(new_kv))``.

    Full attention: :meth:`update` writes the new K/V (MLA: compressed KV and rope key) at ``new_kv`` in
    the KV storage and returns the K/V of every position ``[0, end)`` read back from it, so attention sees
    exactly what the storage holds at our indices. Linear layers: the conv/recurrent getters return the
    working state (``None`` at position 0, where transformers' fresh cache has none and the slot is
    zero), the updaters overwrite it in place.
    """

    def __init__(
        self,
        model: HybridModel,
        pools: HybridLinearKVPool,
        state: SlotState,
        start: int,
        prefix_kv: torch.Tensor,
        new_kv: torch.Tensor,
    ) -> None:
        self._model = model
        self._pools = pools
        self._state = state
        self._start = start
        self._new_kv = new_kv
        self._all_kv = torch.cat([prefix_kv, new_kv])
        self._linear_index = {g: j for j, g in enumerate(model.layers.linear)}

    # full attention ---------------------------------------------------------------------------------
    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new tokens' K/V at our indices; return the K/V of the whole prefix + span."""
        pools = self._pools
        if self._model.family == "kimi_linear":
            # key_states: compressed KV [1, 1, n, kv_lora_rank]; value_states: rope key [1, 1, n, rope]
            latent = torch.cat([key_states, value_states], dim=-1)[0].transpose(0, 1)  # [n, 1, r + rope]
            pools.set_kv_buffer(layer_idx, self._new_kv, latent.contiguous(), None)
            stored = pools.get_key_buffer(layer_idx)[self._all_kv].transpose(0, 1)[None]  # [1, 1, m, r+rope]
            rank = key_states.shape[-1]
            return stored[..., :rank].contiguous(), stored[..., rank:].contiguous()
        # GQA keys/values [1, kv_heads, n, head_dim] -> storage rows [n, kv_heads, head_dim]
        pools.set_kv_buffer(
            layer_idx,
            self._new_kv,
            key_states[0].transpose(0, 1).contiguous(),
            value_states[0].transpose(0, 1).contiguous(),
        )
        k_buf, v_buf = pools.get_kv_buffer(layer_idx)
        keys = k_buf[self._all_kv].transpose(0, 1)[None].contiguous()
        values = v_buf[self._all_kv].transpose(0, 1)[None].contiguous()
        return keys, values

    # linear layers ----------------------------------------------------------------------------------
    def _j(self, layer_idx: int) -> int:
        if layer_idx not in self._linear_index:
            raise InvalidArgument(f"layer {layer_idx} is not a linear-attention layer of this model")
        return self._linear_index[layer_idx]

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        """The conv window at the piece start, ``[1, conv_dim, kernel]`` (the decode path updates it in
        place); ``None`` at position 0, as transformers' fresh cache says (the slot is zero there)."""
        j = self._j(layer_idx)
        return None if self._start == 0 else self._state.conv[j]

    def update_conv_state(
        self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs: Any
    ) -> torch.Tensor:
        """Prefill: return the window followed by the new inputs (the causal conv's left context) and
        keep the last ``kernel`` inputs as the new window. At position 0 the window is all zeros and,
        as transformers does for a fresh cache, only a too-short input is zero-padded: the conv then
        runs over the same length as a plain forward and rounds bit for bit like it."""
        j = self._j(layer_idx)
        window = self._state.conv[j]
        kernel = window.shape[-1]
        new = conv_states.to(window.dtype)
        if self._start == 0:
            full = (
                new if new.shape[-1] >= kernel else torch.nn.functional.pad(new, (kernel - new.shape[-1], 0))
            )
        else:
            full = torch.cat([window, new], dim=-1)
        window.copy_(full[..., -kernel:])
        return full

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        """The delta-rule state at the piece start; ``None`` at position 0 (the kernels start from zero)."""
        j = self._j(layer_idx)
        return None if self._start == 0 else self._state.temporal[j]

    def update_recurrent_state(
        self, recurrent_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs: Any
    ) -> torch.Tensor:
        target = self._state.temporal[self._j(layer_idx)]
        if recurrent_states.shape != target.shape:  # copy_ would broadcast a wrong shape silently
            raise InvalidArgument(
                f"layer {layer_idx} returned a recurrent state of shape {tuple(recurrent_states.shape)}; "
                f"the MambaPool slot holds {tuple(target.shape)} (check the model config's linear heads)"
            )
        target.copy_(recurrent_states)
        return target

    def is_recording_past(self, layer_idx: int) -> bool:
        return False

    def has_previous_state(self, layer_idx: int | None = None, state_idx: int | None = None) -> bool:
        return True

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._start


# --------------------------------------------------------------------------------------------- configs
def tiny_kimi_linear(seed: int = 0, vocab_size: int = 128) -> HybridModel:
    """Kimi Linear, 4 layers (3 KDA + 1 MLA), hidden 64, dense MLPs (no MoE routing: a routing tie flipped
    by rounding would break the tolerance argument), random weights from ``torch.manual_seed(seed)``."""
    config = transformers.KimiLinearConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        kv_lora_rank=16,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        mlp_layer_types=["dense"] * 4,
        linear_attn_config={"head_dim": 16, "num_heads": 2, "short_conv_kernel_size": 4},
        num_local_experts=4,
        num_experts_per_tok=2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        max_position_embeddings=4096,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    return HybridModel(transformers.KimiLinearForCausalLM(config).float(), num_threads=1)


def tiny_qwen3_next(seed: int = 0, vocab_size: int = 128) -> HybridModel:
    """Qwen3-Next, 4 layers (3 Gated DeltaNet + 1 gated GQA), hidden 64, dense MLPs, random weights from
    ``torch.manual_seed(seed)``. Two key heads shared by four value heads, as in the real model."""
    config = transformers.Qwen3NextConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        num_experts=0,
        mlp_only_layers=[0, 1, 2, 3],
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        max_position_embeddings=4096,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    return HybridModel(transformers.Qwen3NextForCausalLM(config).float(), num_threads=1)


def tiny_model(family: str, seed: int = 0) -> HybridModel:
    """:func:`tiny_kimi_linear` or :func:`tiny_qwen3_next` by name (``"kimi_linear"``, ``"qwen3_next"``)."""
    if family == "kimi_linear":
        return tiny_kimi_linear(seed)
    if family == "qwen3_next":
        return tiny_qwen3_next(seed)
    raise InvalidArgument(f"unknown model family {family!r}; use 'kimi_linear' or 'qwen3_next'")
