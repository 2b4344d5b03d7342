"""Shared by the policy and fast-path tests: prompts driven through the cache's lifecycle, as an engine would."""

from __future__ import annotations

from mamba_radix import MambaRadixCache, Req
from mamba_radix.state_stamp import fingerprint, write_stamp


def serve_prompt(cache: MambaRadixCache, prompt: list[int], rid: int, chunk: int = 64) -> None:
    """Admit ``prompt`` as request ``rid``, prefill it in chunks of ``chunk`` tokens (stamping the live and
    tracked slots as the model would write them), then finish it (its checkpoints go to the tree)."""
    req = Req(rid=rid, origin_input_ids=prompt)
    assert cache.admit(req, max_new_tokens=1)
    prefill(cache, req, chunk)
    cache.finish(req)


def prefill(cache: MambaRadixCache, req: Req, chunk: int) -> None:
    """Prefill admitted ``req``'s prompt in chunks of ``chunk`` tokens, stamping the live and tracked slots
    as the model would write them; the request stays running (the last commit hands its prompt over)."""
    prompt = req.origin_input_ids
    while req.kv_len < len(prompt):
        plan = cache.extend(req, min(chunk, len(prompt) - req.kv_len))
        assert plan is not None
        write_stamp(cache.mamba_pool, plan.live_slot, fingerprint(prompt[: plan.end]), plan.end)
        if plan.track_slot is not None:
            write_stamp(
                cache.mamba_pool, plan.track_slot, fingerprint(prompt[: plan.track_len]), plan.track_len
            )
        cache.commit(plan, finished=plan.end == len(prompt))
