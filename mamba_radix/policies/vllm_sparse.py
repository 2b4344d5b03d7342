"""vLLM's sparse retention with ``prefix_cache_retention_interval = 0`` (PRs #43447, #45845, #47782,
#52216; the junction admission of #37898), reimplemented from their descriptions.

At interval 0 vLLM keeps only "semantic" checkpoints: the latest replay boundary of a request (the state
at the end of what it computed, handed over when it finishes), the shared-prefix junctions (where a KV
match ran past the last cached state: our branch point) and the end of each prompt; the intermediate
states a long prefill passes through are not retained. States sit on the block grid.

:class:`SparseRetention` is that admission rule over our lifecycle: a hand-over is kept when it is the
branch point (``seq_len == req.mamba_branching_seqlen``), within one grid step of the prompt's end, or past
the prompt (a finish hand-over: decode boundaries are only tracked and the newest is handed over at
finish); intermediate prefill-chunk checkpoints are declined. Eviction is the config's LRU (vLLM frees a
chain's blocks tail first, our leaf-first ties).

What is and is not equivalent: vLLM's block grid is its attention block (hundreds to thousands of tokens,
sized so a KV page holds a state's bytes) and one LRU free queue serves KV and states together; here the
grid is ``mamba_checkpoint_grid`` (64 by default; use the ``vllm-align`` peer's page size for whole
blocks) and KV and states keep two pools. With a positive retention interval vLLM would also keep one
state every ``interval`` tokens; only interval 0 is modelled. O(1) per hand-over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from mamba_radix.policy import CachePolicy

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.request import Req

__all__ = ["SparseRetention"]


class SparseRetention(CachePolicy):
    """Keep only the latest replay boundary, junctions and prompt ends (vLLM, retention interval 0)."""

    name: ClassVar[str] = "vllm-sparse"

    def admit_checkpoint(self, req: Req, seq_len: int) -> bool:
        assert self.tree is not None
        input_len = len(req.origin_input_ids)
        if seq_len > input_len or seq_len == req.mamba_branching_seqlen:
            return True
        return input_len - seq_len < self.tree.config.mamba_checkpoint_grid
