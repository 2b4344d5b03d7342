"""``strip_thinking_cache`` for hybrid models: a finished request whose output (reasoning and answer) the
next turn drops from its prompt leaves only its prompt in the cache, with a state that belongs there.

SGLang's option (server argument ``strip_thinking_cache``, #22373) reports the request's committed length
as the prompt's length at finish, so the KV past the prompt is freed; but the state the hybrid cache then
attaches to that prompt-length node is the request's newest one, taken *after* the output. A later request
that matches the prompt restores a state that summarises tokens it never had. Here the newest checkpoint
the request holds goes to the tree only if it lies within the prompt (``checkpoint_len <= prompt length``:
a prefill checkpoint, or a decode one that did not get past the prompt); otherwise nothing is inserted at
finish, and the prompt stays cached up to the checkpoint its prefill already handed to the tree
(``cache_protected_len``), with that checkpoint's own state. KV past the inserted checkpoint is freed, as at
every finish (no state exists there).

Checkpoints a request handed over during decode (``mamba_decode_insert``) are in the tree already; they
hold states that match their own prefixes (prompt plus output), so nothing wrong is restored, but the
output is not stripped from the cache. The functions below work on the core cache and core requests; the
SGLang-form cache (:class:`mamba_radix.compat.sglang.MambaRadixCache`) applies them when built with
``strip_thinking_cache=True`` to requests with ``reasoning_tokens > 0``.
"""

from __future__ import annotations

from mamba_radix.cache import MambaRadixCache
from mamba_radix.request import Req

__all__ = ["finish_stripping_output", "insert_keeps_prompt_state"]


def insert_keeps_prompt_state(cache: MambaRadixCache, req: Req, is_insert: bool = True) -> bool:
    """Whether finishing running ``req`` with ``is_insert`` may insert its newest checkpoint when its
    output is to be stripped: only if that checkpoint ends within the prompt. A request with an
    uncommitted plan keeps ``is_insert`` (the lifecycle refuses such an insert; stripping must not turn a
    refusal into an abort). No side effects (it reads the buffer strategy's checkpoint length). O(1)."""
    if not is_insert or req.pending_plan is not None:
        return is_insert
    cache_len = cache.buffer.checkpoint_len(req, None)
    return cache_len is not None and cache_len <= len(req.origin_input_ids)


def finish_stripping_output(cache: MambaRadixCache, req: Req) -> None:
    """:meth:`MambaRadixCache.finish` of ``req`` with its output stripped from the cache: the newest
    checkpoint is inserted only if it ends within the prompt (:func:`insert_keeps_prompt_state`), the rest
    freed, the row freed. Raises what :meth:`~MambaRadixCache.finish` raises, nothing changed.
    O(new tokens + path nodes * log n)."""
    cache.finish(req, insert_keeps_prompt_state(cache, req))
