"""The pools in SGLang's constructor and call forms, over the core pools (:mod:`mamba_radix.pools`).

Where SGLang's pools differ from ours only in form, this module maps: SGLang's
``HybridReqToTokenPool(size=, mamba_size=, max_context_len=, device=, cache_params=, mamba_layer_ids=,
enable_mamba_extra_buffer=, ...)``, its ``mamba_allocator`` / ``mamba_pool.mamba_cache.conv`` /
``.temporal`` views, ``free_mamba_cache(req, mamba_ping_pong_track_buffer_to_keep=entry)`` (an entry of the
ping-pong buffer, where the core takes the slot itself) and the allocators' ``(size, dtype, device,
kvcache, need_sort)`` forms. Requests may be SGLang-shaped (:class:`~mamba_radix.compat.sglang_req.Req`) or
core requests.

Deliberate differences (docs/compat-sglang.md): ``free(req)`` is refused while the request holds state
slots (SGLang leaks them); a request's ``mamba_pool_idx`` cannot be overwritten from outside; the
speculative-decoding conv-window buffers (``mamba_spec_state_size``) are not provided. The retraction
copies (``get_cpu_copy`` / ``load_cpu_copy`` of the state pool, the hybrid KV pool and the allocators) are
the core pools' (:mod:`mamba_radix.pools.cpu_copy`), in SGLang's forms; they validate before writing, where
SGLang asserts.

The core request pool is built with a :class:`~mamba_radix.config.CacheConfig` (strategy, ping-pong size),
which SGLang's form only gives in part before the cache exists (the page size and the chunk size are the
cache's). :meth:`HybridReqToTokenPool.bind_config` lets the compat cache complete it while the pool is
still unused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mamba_radix.config import CacheConfig
from mamba_radix.errors import InvalidArgument, InvalidIndex
from mamba_radix.pools import (
    HybridReqToTokenPool as CoreHybridReqToTokenPool,
)
from mamba_radix.pools import (
    MambaPool as CoreMambaPool,
)
from mamba_radix.pools import (
    PagedTokenToKVPoolAllocator as CorePagedAllocator,
)
from mamba_radix.pools import (
    TokenToKVPoolAllocator as CoreTokenAllocator,
)
from mamba_radix.pools._indices import IndexLike, as_index_tensor
from mamba_radix.pools.cpu_copy import HybridCpuCopy, MambaCpuCopy
from mamba_radix.pools.kv_storage import HybridLinearKVPool as CoreHybridLinearKVPool
from mamba_radix.pools.kv_storage import MHATokenToKVPool

from .sglang_req import as_core_req

__all__ = [
    "HybridLinearKVPool",
    "HybridReqToTokenPool",
    "MambaPool",
    "PagedTokenToKVPoolAllocator",
    "TokenToKVPoolAllocator",
    "state_shapes",
]

# state shapes for a pool built without SGLang's cache_params: small, and large enough for
# mamba_radix.state_stamp's stamps
_DEFAULT_CONV_SHAPES: tuple[tuple[int, ...], ...] = ((4, 4),)
_DEFAULT_TEMPORAL_SHAPE: tuple[int, ...] = (2, 4, 4)


def state_shapes(
    cache_params: Any,
) -> tuple[list[tuple[int, ...]], tuple[int, ...], list[torch.dtype] | torch.dtype, torch.dtype]:
    """Conv shapes, temporal shape and dtypes from SGLang's ``Mamba2CacheParams``-like object (``.shape.conv``,
    ``.shape.temporal``, ``.dtype.conv``, ``.dtype.temporal``), or the small defaults for ``None``. O(1)."""
    if cache_params is None:
        return list(_DEFAULT_CONV_SHAPES), _DEFAULT_TEMPORAL_SHAPE, torch.bfloat16, torch.float32
    shape = getattr(cache_params, "shape", None)
    conv, temporal = getattr(shape, "conv", None), getattr(shape, "temporal", None)
    if conv is None or temporal is None:
        raise InvalidArgument(
            "cache_params needs .shape.conv (a list of shapes) and .shape.temporal (a shape), as SGLang's "
            f"Mamba2CacheParams has; got {type(cache_params).__name__}"
        )
    dtype = getattr(cache_params, "dtype", None)
    conv_dtype = getattr(dtype, "conv", torch.bfloat16)
    temporal_dtype = getattr(dtype, "temporal", torch.float32)
    return [tuple(s) for s in conv], tuple(temporal), conv_dtype, temporal_dtype


class _StateTensors:
    """SGLang's ``mamba_pool.mamba_cache``: ``conv`` (one tensor per conv shape) and ``temporal``, each
    ``[num_layers, size + 1, ...]`` (slot 0 the padding sink), the core pool's own tensors."""

    def __init__(self, core: CoreMambaPool) -> None:
        self._core = core

    @property
    def conv(self) -> tuple[torch.Tensor, ...]:
        return self._core.conv

    @property
    def temporal(self) -> torch.Tensor:
        return self._core.temporal


class MambaPool:
    """SGLang's state pool form over a core :class:`~mamba_radix.pools.MambaPool`: ``mamba_cache``,
    ``alloc(n)`` (a tensor of slots or ``None``), ``free``, ``available_size``, ``copy_from``. Built from
    SGLang's arguments (``size``, ``cache_params``, ``device``; the layer count from ``cache_params.layers``
    or ``num_layers``), or around an existing core pool with :meth:`of`."""

    def __init__(
        self,
        size: int,
        cache_params: Any = None,
        device: str | torch.device = "cpu",
        *,
        num_layers: int | None = None,
        spec_state_size: int = 0,
        enable_memory_saver: bool = False,
        speculative_num_draft_tokens: int | None = None,
    ) -> None:
        # spec_state_size and speculative_num_draft_tokens size SGLang's speculative conv-window buffers,
        # which are not mapped (docs/compat-sglang.md); enable_memory_saver chooses memory no call sees
        conv, temporal, conv_dtype, temporal_dtype = state_shapes(cache_params)
        layers = num_layers if num_layers is not None else len(getattr(cache_params, "layers", [0]) or [0])
        self.core = CoreMambaPool(size, layers, conv, temporal, conv_dtype, temporal_dtype, device=device)
        self.mamba_cache = _StateTensors(self.core)

    @classmethod
    def of(cls, core: CoreMambaPool) -> MambaPool:
        """The SGLang-form view of an existing core pool (no copy). O(1)."""
        view = cls.__new__(cls)
        view.core = core
        view.mamba_cache = _StateTensors(core)
        return view

    @property
    def size(self) -> int:
        return self.core.size

    @property
    def device(self) -> torch.device:
        return self.core.device

    def available_size(self) -> int:
        return self.core.available_size()

    def alloc(self, num_slots: int) -> torch.Tensor | None:
        """``num_slots`` free slots as an int64 tensor, or ``None`` (nothing taken). O(num_slots)."""
        return self.core.alloc(num_slots)

    def free(self, slots: IndexLike) -> None:
        """Free slots (a tensor, list or int). Refused (nothing freed) for a slot not allocated."""
        self.core.free(slots)

    def copy_from(self, src_slots: IndexLike, dst_slots: IndexLike) -> None:
        self.core.copy_from(src_slots, dst_slots)

    def clear(self) -> None:
        self.core.reset()

    def get_cpu_copy(self, indices: IndexLike) -> MambaCpuCopy:
        """SGLang's ``get_cpu_copy(indices)``: ``(conv_cpu, temporal_cpu)`` of allocated slots. See
        :meth:`mamba_radix.pools.MambaPool.get_cpu_copy`. O(k * bytes_per_slot)."""
        return self.core.get_cpu_copy(indices)

    def load_cpu_copy(self, mamba_cache_cpu: MambaCpuCopy | tuple | list, indices: IndexLike) -> None:
        """SGLang's ``load_cpu_copy(mamba_cache_cpu, indices)``: validated whole, then written. See
        :meth:`mamba_radix.pools.MambaPool.load_cpu_copy`. O(k * bytes_per_slot)."""
        self.core.load_cpu_copy(mamba_cache_cpu, indices)


def _core_state_pool(mamba_pool: Any) -> CoreMambaPool | None:
    """The core pool behind an SGLang-form or core state pool (``None`` stays ``None``). O(1)."""
    if mamba_pool is None or isinstance(mamba_pool, CoreMambaPool):
        return mamba_pool
    if isinstance(mamba_pool, MambaPool):
        return mamba_pool.core
    raise InvalidArgument(
        f"mamba_pool must be a MambaPool (SGLang form or core), got {type(mamba_pool).__name__}"
    )


class HybridLinearKVPool:
    """SGLang's ``HybridLinearKVPool(size, dtype, page_size, head_num, head_dim, full_attention_layer_ids,
    device, enable_memory_saver, mamba_pool)``: the full-attention KV buffers of a hybrid model by global
    layer id (:attr:`full_kv_pool`, a core :class:`~mamba_radix.pools.kv_storage.MHATokenToKVPool` of one
    layer per full-attention id). The linear layers' states are the state pool's (``mamba_pool``, kept as
    given). A layer id that is not a full-attention one is refused (:class:`InvalidArgument`).
    O(size * layers) to build."""

    def __init__(
        self,
        size: int,
        dtype: torch.dtype,
        page_size: int,
        head_num: int,
        head_dim: int,
        full_attention_layer_ids: Sequence[int],
        device: str | torch.device = "cpu",
        enable_memory_saver: bool = False,
        mamba_pool: Any = None,
        enable_kvcache_transpose: bool = False,
    ) -> None:
        # enable_memory_saver and enable_kvcache_transpose choose the buffers' memory and layout, which
        # no cache call sees: accepted (earlier releases pass the latter) and not kept
        ids = list(full_attention_layer_ids)
        self.full_kv_pool = MHATokenToKVPool(size, page_size, dtype, head_num, head_dim, len(ids), device)
        self.full_attention_layer_id_mapping = {layer: i for i, layer in enumerate(ids)}
        self.mamba_pool = mamba_pool
        self.size, self.page_size, self.device = size, page_size, self.full_kv_pool.device

    def _full_layer(self, layer_id: int) -> int:
        if layer_id not in self.full_attention_layer_id_mapping:
            raise InvalidArgument(
                f"layer {layer_id!r} is not a full-attention layer "
                f"({sorted(self.full_attention_layer_id_mapping)}); linear layers live in the state pool"
            )
        return self.full_attention_layer_id_mapping[layer_id]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.full_kv_pool.get_key_buffer(self._full_layer(layer_id))

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.full_kv_pool.get_value_buffer(self._full_layer(layer_id))

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.full_kv_pool.get_kv_buffer(self._full_layer(layer_id))

    def _state_pool(self, mamba_indices: IndexLike | None) -> CoreMambaPool | None:
        """The core state pool when ``mamba_indices`` are given; refused when there is none. O(1)."""
        if mamba_indices is None:
            return None
        core = _core_state_pool(self.mamba_pool)
        if core is None:
            raise InvalidArgument(
                "mamba_indices given but this pool was built without mamba_pool; pass mamba_pool= to it"
            )
        return core

    def get_cpu_copy(
        self, indices: IndexLike, mamba_indices: IndexLike | None = None, req_pool_index: Any = None
    ) -> HybridCpuCopy:
        """SGLang's ``get_cpu_copy``: ``(kv_cpu, mamba_cpu)``, the full-attention KV at ``indices`` and,
        with ``mamba_indices``, those state slots (else ``None``). ``req_pool_index`` keys SGLang pools
        that store data per request; none here does, so it is accepted and not used. No side effects.
        O(k * bytes_per_token + s * bytes_per_slot)."""
        state = self._state_pool(mamba_indices)
        mamba = None if state is None else state.get_cpu_copy(mamba_indices)  # slots refused first
        return HybridCpuCopy(self.full_kv_pool.get_cpu_copy(indices), mamba)

    def load_cpu_copy(
        self,
        kv_cache_cpu: HybridCpuCopy | tuple | list,
        indices: IndexLike,
        mamba_indices: IndexLike | None = None,
        req_pool_index: Any = None,
    ) -> None:
        """SGLang's ``load_cpu_copy``: the KV part into ``indices`` and, with ``mamba_indices``, the
        state part into those slots (without them a copied state is not loaded, as in SGLang). Both parts
        are validated before either is written (a copy without state but ``mamba_indices`` given is
        refused). O(k * bytes_per_token + s * bytes_per_slot)."""
        if not isinstance(kv_cache_cpu, (tuple, list)) or len(kv_cache_cpu) != 2:
            raise InvalidArgument(
                f"a hybrid copy is the (kv, mamba) pair get_cpu_copy returns, got {type(kv_cache_cpu).__name__}"
            )
        kv, mamba = kv_cache_cpu
        state = self._state_pool(mamba_indices)
        self.full_kv_pool.check_cpu_copy(kv, indices)
        if state is not None:
            if mamba is None:
                raise InvalidArgument(
                    "the copy holds no state (made without mamba_indices); load it with mamba_indices=None"
                )
            state.check_cpu_copy(mamba, mamba_indices)
        self.full_kv_pool.load_cpu_copy(kv, indices)
        if state is not None:
            state.load_cpu_copy(mamba, mamba_indices)


# the KV storages whose copies take state slots too (SGLang's hybrid pool form and the core's)
_HYBRID_STORAGES = (HybridLinearKVPool, CoreHybridLinearKVPool)


class TokenToKVPoolAllocator:
    """SGLang's ``TokenToKVPoolAllocator(size, dtype, device, kvcache, need_sort)`` over a core allocator
    (:attr:`core`; ``dtype`` belongs to the KV storage, which no cache call sees: not kept; ``kvcache`` is
    kept as ``_kvcache``, SGLang's name, for the retraction copies the allocator forwards to it). SGLang hands a token-granular allocator to a paged cache too (its tree then allocates whole
    pages itself); the core takes a paged allocator for ``page_size > 1``, so the cache rebinds an unused
    one to a paged core allocator of the same size (:meth:`bind_page_size`). The SGLang-facing calls are
    here; any other attribute is the core allocator's."""

    def __init__(
        self,
        size: int,
        dtype: Any = None,
        device: str | torch.device = "cpu",
        kvcache: Any = None,
        need_sort: bool = True,
        *,
        page_size: int = 1,
    ) -> None:
        self._need_sort = need_sort
        self._kvcache = kvcache
        self.core: CoreTokenAllocator | CorePagedAllocator = (
            CoreTokenAllocator(size, device, need_sort=need_sort)
            if page_size == 1
            else CorePagedAllocator(size, page_size, device, need_sort=need_sort)
        )

    def bind_page_size(self, page_size: int) -> None:
        """Rebuild the core allocator for ``page_size`` (same size, device and order) while no index is
        allocated; :class:`InvalidArgument`, nothing changed, once one is. O(size)."""
        if page_size == self.core.page_size:
            return
        self.check_bind_page_size(page_size)
        size, device = self.core.size, self.core.device
        self.core = (
            CoreTokenAllocator(size, device, need_sort=self._need_sort)
            if page_size == 1
            else CorePagedAllocator(size, page_size, device, need_sort=self._need_sort)
        )

    def check_bind_page_size(self, page_size: int) -> None:
        """Raise :class:`InvalidArgument` if :meth:`bind_page_size` would refuse. No side effects. O(1)."""
        if page_size != self.core.page_size and self.core.available_size() != self.core.size:
            raise InvalidArgument(
                f"the KV allocator (page_size={self.core.page_size}) is in use and the cache pages by "
                f"{page_size}; build the cache before allocating, or use PagedTokenToKVPoolAllocator"
            )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "core":
            raise AttributeError(name)
        return getattr(self.core, name)

    def available_size(self) -> int:
        return self.core.available_size()

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """``num_tokens`` KV indices (paged: a multiple of the page size), or ``None``. O(num_tokens)."""
        return self.core.alloc(num_tokens)

    def free(self, indices: IndexLike) -> None:
        """Free KV indices; refused (nothing freed) for an index not allocated. O(len)."""
        self.core.free(indices)

    def _copy_storage(self, indices: IndexLike, mamba_indices: IndexLike | None) -> tuple[Any, dict]:
        """The KV storage a retraction copy goes to and the keywords it takes, after checking that every
        index in ``indices`` is allocated here (:class:`~mamba_radix.errors.InvalidIndex` otherwise: the
        storage alone cannot tell a freed row from a live one). O(k)."""
        storage = self._kvcache
        if storage is None:
            raise InvalidArgument(
                "this allocator was built without kvcache, so it has no KV to copy; pass kvcache= (the KV "
                "storage, e.g. HybridLinearKVPool) to its constructor"
            )
        idx = as_index_tensor(indices, self.core.device, "KV index")
        if not self.core.all_allocated(idx):
            raise InvalidIndex(
                "a KV index given to get_cpu_copy / load_cpu_copy is not allocated; pass indices this "
                "allocator handed out and has not freed"
            )
        if isinstance(storage, _HYBRID_STORAGES):
            return storage, {"mamba_indices": mamba_indices}
        if mamba_indices is not None:
            raise InvalidArgument(
                f"mamba_indices given but the KV storage ({type(storage).__name__}) holds no state; build "
                "the allocator over a HybridLinearKVPool with mamba_pool="
            )
        return storage, {}

    def get_cpu_copy(
        self, indices: IndexLike, mamba_indices: IndexLike | None = None, req_pool_index: Any = None
    ) -> Any:
        """SGLang's ``get_cpu_copy``, forwarded to the KV storage (``kvcache``) after checking the indices
        are allocated; the storage's form (a hybrid pool: ``(kv_cpu, mamba_cpu)``). ``req_pool_index`` is
        accepted and not used (no storage here keys data by request). No side effects. O(k)."""
        storage, kwargs = self._copy_storage(indices, mamba_indices)
        return storage.get_cpu_copy(indices, **kwargs)

    def load_cpu_copy(
        self,
        kv_cache_cpu: Any,
        indices: IndexLike,
        mamba_indices: IndexLike | None = None,
        req_pool_index: Any = None,
    ) -> None:
        """SGLang's ``load_cpu_copy``, forwarded to the KV storage after checking the indices are
        allocated; validated whole before anything is written. O(k)."""
        storage, kwargs = self._copy_storage(indices, mamba_indices)
        storage.load_cpu_copy(kv_cache_cpu, indices, **kwargs)


# SGLang's class name, a factory here: a paged allocator is the wrapper with page_size > 1
def PagedTokenToKVPoolAllocator(
    size: int,
    page_size: int,
    dtype: Any = None,
    device: str | torch.device = "cpu",
    kvcache: Any = None,
    need_sort: bool = True,
) -> TokenToKVPoolAllocator:
    """SGLang's ``PagedTokenToKVPoolAllocator(size, page_size, dtype, device, kvcache, need_sort)``: the
    allocator over a paged core allocator. O(size / page_size)."""
    return TokenToKVPoolAllocator(size, dtype, device, kvcache, need_sort, page_size=page_size)


class HybridReqToTokenPool:
    """SGLang's ``HybridReqToTokenPool`` form over the core one (:attr:`core`). The strategy comes from
    ``enable_mamba_extra_buffer`` (and ``enable_mamba_extra_buffer_lazy``), or from ``config``; overlap
    scheduling (ping-pong of two) unless ``enable_overlap_schedule=False``, as SGLang's default."""

    def __init__(
        self,
        *,
        size: int,
        mamba_size: int,
        max_context_len: int,
        device: str | torch.device = "cpu",
        cache_params: Any = None,
        mamba_layer_ids: Sequence[int] | None = None,
        enable_mamba_extra_buffer: bool = False,
        enable_mamba_extra_buffer_lazy: bool = False,
        enable_overlap_schedule: bool = True,
        mamba_spec_state_size: int = 0,
        speculative_num_draft_tokens: int | None = None,
        enable_memory_saver: bool = False,
        config: CacheConfig | None = None,
    ) -> None:
        if config is None:
            strategy = (
                "extra_buffer_lazy"
                if enable_mamba_extra_buffer_lazy
                else "extra_buffer"
                if enable_mamba_extra_buffer
                else "no_buffer"
            )
            config = CacheConfig(
                mamba_radix_cache_strategy=strategy, disable_overlap_schedule=not enable_overlap_schedule
            )
        num_layers = len(mamba_layer_ids) if mamba_layer_ids else None
        self.mamba_pool = MambaPool(mamba_size, cache_params, device, num_layers=num_layers)
        self.mamba_allocator = self.mamba_pool  # SGLang 0.5.23 reaches the slot allocator by this name
        self._rows, self._max_context_len, self._device = size, max_context_len, device
        self.core = CoreHybridReqToTokenPool(size, max_context_len, self.mamba_pool.core, config, device)

    @property
    def config(self) -> CacheConfig:
        return self.core.config

    def bind_config(self, config: CacheConfig) -> None:
        """Rebuild the core pool with ``config`` (the cache's: its page size, chunk size, strategy), over
        the same state pool. Only while unused: no row held and no slot allocated, else
        :class:`InvalidArgument` and nothing changed. O(size)."""
        if config == self.core.config:
            return
        self.check_bind_config(config)
        self.core = CoreHybridReqToTokenPool(
            self._rows, self._max_context_len, self.mamba_pool.core, config, self._device
        )

    def check_bind_config(self, config: CacheConfig) -> None:
        """Raise :class:`InvalidArgument` if :meth:`bind_config` would refuse. No side effects. O(1)."""
        in_use = self.core.available_size() != self.core.size or self.mamba_pool.core.used
        if config != self.core.config and in_use:
            raise InvalidArgument(
                "the request pool is in use (rows or state slots taken) and was built for another config; "
                "build the cache right after its pools, or pass config= to the pool"
            )

    # ---------------------------------------------------------------------------------------- rows
    @property
    def size(self) -> int:
        return self.core.size

    @property
    def req_to_token(self) -> torch.Tensor:
        return self.core.req_to_token

    @property
    def device(self) -> torch.device:
        return self.core.device

    def available_size(self) -> int:
        return self.core.available_size()

    def write(self, index: tuple[int, slice], values: torch.Tensor) -> None:
        """SGLang's ``write((row, slice(start, end)), values)``: KV indices into a request row (the core's
        ``write(row, start, values)``). Refused for a row not allocated or a slice out of the row."""
        row, span = index
        if not isinstance(span, slice) or span.step not in (None, 1):
            raise InvalidArgument(f"write takes (row, slice(start, end)), got {index!r}")
        start = span.start or 0
        stop = span.stop if span.stop is not None else start + len(values)
        if stop - start != len(values):
            raise InvalidArgument(f"write: slice {span} does not fit {len(values)} values")
        self.core.write(row, start, values)

    def alloc(self, reqs: list[Any]) -> list[int] | None:
        """Admit ``reqs`` (rows, live slots, track buffers), transactionally: ``None`` and nothing taken
        when short. See :meth:`mamba_radix.pools.HybridReqToTokenPool.alloc`. O(len(reqs) * P)."""
        if not isinstance(reqs, (list, tuple)):
            raise InvalidArgument(f"alloc takes a list of requests, got {type(reqs).__name__}")
        return self.core.alloc([as_core_req(r) for r in reqs])

    def free(self, req: Any) -> None:
        """Free the request row; refused while the request holds state slots (SGLang would leak them)."""
        self.core.free(as_core_req(req) if not isinstance(req, (int, list, tuple, range)) else req)

    def free_mamba_cache(self, req: Any, mamba_ping_pong_track_buffer_to_keep: int | None = None) -> None:
        """Free the request's state slots but the ping-pong entry ``mamba_ping_pong_track_buffer_to_keep``
        (an entry index, SGLang's form: that slot is the tree's now). Refused, nothing freed, for an entry
        out of range or empty. O(P)."""
        core = as_core_req(req)
        keep = None
        if mamba_ping_pong_track_buffer_to_keep is not None:
            buffer = core.mamba_ping_pong_track_buffer or []
            entry = mamba_ping_pong_track_buffer_to_keep
            if type(entry) is not int or not 0 <= entry < len(buffer) or buffer[entry] < 0:
                raise InvalidArgument(
                    f"request {core.rid!r}: ping-pong entry {entry!r} holds no slot (buffer {buffer})"
                )
            keep = buffer[entry]
        self.core.free_mamba_cache(core, keep=keep)

    def clear(self) -> None:
        self.core.clear()
