"""The scheduler's view of a simulated run: SGLang's ``Decode batch`` and ``Prefill batch`` log lines.

SGLang's scheduler logs a ``Decode batch`` line every ``decode_log_interval`` decode steps and a
``Prefill batch`` line for every prefill batch. For a hybrid (Mamba) model the fields are, in order
(restated from its metrics reporter and pool-stats observer):

- decode: ``#running-req``, ``#full token``, ``full token usage``, ``mamba num``, ``mamba usage``,
  ``gen throughput (token/s)``, ``#queue-req``;
- prefill: ``#new-seq``, ``#new-token``, ``#cached-token``, ``full token usage``, ``mamba usage``,
  ``#running-req``, ``#queue-req``, ``input throughput (token/s)``.

Meanings, as SGLang computes them: ``#full token`` = KV pool size - (free + evictable tree tokens), i.e.
the KV held by running requests and by tree nodes they lock; ``mamba num`` = state pool size - (free +
evictable checkpoints), i.e. slots in use by running requests (live and track slots) and by locked
checkpoints; the usages divide by the pool sizes. ``gen throughput`` = decode tokens generated since the
previous decode line / the time since it (prefill batches in between count in that time);
``input throughput`` = the batch's new tokens / the time since the previous prefill line. Not written:
fields a simulator has no value for (``#pending-token``, ``cuda graph``, the speculative and
disaggregation fields); a parser that skips unknown fields (SGLang's own ``log_parser`` does) reads these
lines as SGLang's.

:class:`SchedulerLog` keeps the two throughputs' running counts and writes the lines; the engine
supplies the pool values (:meth:`mamba_radix.sim.engine.Engine` says how a line inside a decode jump is
computed). No side effects beyond calling the ``write`` it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["PoolView", "SchedulerLog", "decode_batch_line", "prefill_batch_line"]


@dataclass(frozen=True)
class PoolView:
    """Pool usage as SGLang's log reports it (see the module docstring)."""

    full_tokens: int
    full_capacity_tokens: int
    mamba_slots: int
    mamba_capacity_slots: int

    @property
    def full_usage(self) -> float:
        return self.full_tokens / self.full_capacity_tokens if self.full_capacity_tokens else 0.0

    @property
    def mamba_usage(self) -> float:
        return self.mamba_slots / self.mamba_capacity_slots if self.mamba_capacity_slots else 0.0


def decode_batch_line(running: int, pools: PoolView, gen_tokens_per_s: float, queue: int) -> str:
    """One ``Decode batch`` line in SGLang's field order. O(1)."""
    return (
        f"Decode batch, #running-req: {running}, #full token: {pools.full_tokens}, "
        f"full token usage: {pools.full_usage:.2f}, mamba num: {pools.mamba_slots}, "
        f"mamba usage: {pools.mamba_usage:.2f}, gen throughput (token/s): {gen_tokens_per_s:.2f}, "
        f"#queue-req: {queue}"
    )


def prefill_batch_line(
    new_seqs: int,
    new_tokens: int,
    cached_tokens: int,
    pools: PoolView,
    running: int,
    queue: int,
    input_tokens_per_s: float,
) -> str:
    """One ``Prefill batch`` line in SGLang's field order. O(1)."""
    return (
        f"Prefill batch, #new-seq: {new_seqs}, #new-token: {new_tokens}, #cached-token: {cached_tokens}, "
        f"full token usage: {pools.full_usage:.2f}, mamba usage: {pools.mamba_usage:.2f}, "
        f"#running-req: {running}, #queue-req: {queue}, input throughput (token/s): {input_tokens_per_s:.2f}"
    )


class SchedulerLog:
    """The throughput counts between lines and the writer. ``every_steps``: a decode line at every
    global decode step that is a multiple of it (SGLang's ``decode_log_interval``)."""

    def __init__(self, every_steps: int, write: Callable[[str], None]) -> None:
        self.every_steps = every_steps
        self.write = write
        self._decode_line_s = 0.0  # simulated time of the previous decode line (or the run's start)
        self._decode_line_step = 0  # global decode step counted into the generated tokens so far
        self._generated_tokens = 0  # decode tokens generated since the previous decode line
        self._prefill_line_s = 0.0

    def prefill(
        self,
        now_s: float,
        new_seqs: int,
        new_tokens: int,
        cached_tokens: int,
        pools: PoolView,
        running: int,
        queue: int,
    ) -> None:
        """Write the line of a prefill batch scheduled at ``now_s`` (before it runs, as SGLang logs it). O(1)."""
        gap_s = now_s - self._prefill_line_s
        self._prefill_line_s = now_s
        rate = new_tokens / gap_s if gap_s > 0 else 0.0
        self.write(prefill_batch_line(new_seqs, new_tokens, cached_tokens, pools, running, queue, rate))

    def decode_run(
        self,
        first_step: int,
        last_step: int,
        start_s: float,
        step_s: float,
        batch: int,
        line_at: Callable[[int, float], tuple[PoolView, int]],
    ) -> None:
        """Steps ``first_step + 1 .. last_step`` run with ``batch`` requests, each ``step_s`` long, from
        ``start_s``: count their tokens and write a line at every multiple of ``every_steps``.
        ``line_at(step, time_s)`` gives the pools and the queue at that step. O(lines + 1)."""
        every = self.every_steps
        step = (first_step // every + 1) * every
        while step <= last_step:
            time_s = start_s + (step - first_step) * step_s
            self._generated_tokens += (step - max(self._decode_line_step, first_step)) * batch
            gap_s = time_s - self._decode_line_s
            rate = self._generated_tokens / gap_s if gap_s > 0 else 0.0
            pools, queue = line_at(step, time_s)
            self.write(decode_batch_line(batch, pools, rate, queue))
            self._decode_line_s, self._decode_line_step, self._generated_tokens = time_s, step, 0
            step += every
        self._generated_tokens += (last_step - max(self._decode_line_step, first_step)) * batch
        self._decode_line_step = last_step
