"""One set of deployment defaults per model, shared by the planner (``plan``) and the simulator
(``simulate``, ``sweep``, experiments), so the same model gives the same bytes per slot and per token
everywhere unless a flag says otherwise.

A model's defaults are the deployment its numbers come from: Kimi K3 is the seeds' one rank of TP8 with a
bf16 MLA KV cache and bf16 KDA states (``--mamba-ssm-dtype bfloat16``: 27,648 B per KV token,
29,039,616 B per state slot) and a 27.25 GiB KV + state budget per rank. A model without an entry
(another preset, a JSON model file) gets TP 1, ``kv_cache_dtype`` ``auto`` and the model's own SSM dtype
(SGLang's behaviour without flags). No side effects; O(1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["DEPLOYMENTS", "GENERIC", "Deployment", "deployment_for"]


@dataclass(frozen=True)
class Deployment:
    """Defaults of one model's deployment. ``mamba_ssm_dtype`` None = the model's own default;
    ``memory_budget_gib``: the KV + state memory per rank the simulator assumes without a budget flag."""

    tp_size: int = 1
    kv_cache_dtype: str = "auto"
    mamba_ssm_dtype: str | None = None
    mamba_conv_dtype: str = "bfloat16"
    memory_budget_gib: float = 27.25
    # SGLang's --mamba-full-memory-ratio default (state : KV memory)
    mamba_full_memory_ratio: float = 0.9


GENERIC = Deployment()

DEPLOYMENTS: dict[str, Deployment] = {
    # the seeds: one TP8 rank, 974,656 bf16 MLA tokens (25.10 GiB) + 80 bf16 state slots (2.16 GiB)
    "kimi-k3": Deployment(tp_size=8, kv_cache_dtype="bfloat16", mamba_ssm_dtype="bfloat16"),
}


def deployment_for(model: str, **overrides: object) -> Deployment:
    """The defaults of ``model`` (a preset name or a JSON file: :data:`GENERIC` unless listed), with
    every override that is not None applied."""
    base = DEPLOYMENTS.get(model, GENERIC)
    given = {k: v for k, v in overrides.items() if v is not None}
    return replace(base, **given) if given else base  # type: ignore[arg-type]
