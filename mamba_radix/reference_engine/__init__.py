"""A small reference engine: real transformers hybrid model code served through our pools and cache.

- :mod:`~mamba_radix.reference_engine.models`: tiny random-weight Kimi Linear (KDA + MLA) and Qwen3-Next
  (Gated DeltaNet + GQA) models, and :meth:`HybridModel.forward_span`, which runs a span of tokens with the
  full-attention KV read from and written to our KV storage and the conv/recurrent state read from and
  written to :class:`~mamba_radix.pools.MambaPool` slots.
- :mod:`~mamba_radix.reference_engine.engine`: :class:`ReferenceEngine`, a serving loop (several requests in
  flight, chunked prefill, greedy decode) that drives only the cache's request lifecycle API;
  :func:`greedy_reference`, the cache-free oracle (plain transformers forwards of the whole sequence); and
  :func:`audit_checkpoints`, which probes every checkpoint in the tree against a from-scratch forward.

Needs the optional ``transformers`` dependency (the ``engine`` extra); importing this package without it
(or with transformers older than 5.23) raises :class:`ImportError` with the install command. The core
library never imports it.
"""

from __future__ import annotations

import os

# Nothing may be fetched from a hub: tiny configs are built in code, weights come from torch.manual_seed.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

try:
    import transformers  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "mamba_radix.reference_engine needs transformers>=5.23,<6: pip install 'mamba-radix[engine]'"
    ) from exc

from mamba_radix.reference_engine.engine import (
    CheckpointAudit,
    EngineStats,
    ForwardRecord,
    ReferenceEngine,
    audit_checkpoints,
    greedy_reference,
)
from mamba_radix.reference_engine.models import (
    LOGIT_ATOL,
    HybridModel,
    tiny_kimi_linear,
    tiny_model,
    tiny_qwen3_next,
)

__all__ = [
    "LOGIT_ATOL",
    "CheckpointAudit",
    "EngineStats",
    "ForwardRecord",
    "HybridModel",
    "ReferenceEngine",
    "audit_checkpoints",
    "greedy_reference",
    "tiny_kimi_linear",
    "tiny_model",
    "tiny_qwen3_next",
]
