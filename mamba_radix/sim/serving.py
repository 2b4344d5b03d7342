"""SGLang's ``bench_serving`` load test as a trace: its random dataset and its request arrivals.

``python -m sglang.bench_serving --dataset-name random --random-input-len I --random-output-len O
--num-prompts N --request-rate R --max-concurrency C`` becomes :class:`RandomWorkload` (the requests, with
their arrival times) plus the engine's ``max_concurrency`` option (the client's semaphore, which the engine
models: :class:`~mamba_radix.sim.engine.EngineOptions`). ``mamba-radix simulate --dataset-name random``
takes the same flags.

What is the same as bench_serving (its ``sample_random_requests``, ``compute_random_lens`` and
``get_request``, restated here):

- Lengths. Each request's input and output lengths are drawn uniformly from the integers
  ``[max(floor(len * range_ratio), 1), len]``: with the default ratio 0.0 that is ``[1, len]`` (mean about
  ``len / 2``), with 1.0 every request is exactly ``len``. All input lengths are drawn first, then all
  output lengths.
- Arrivals. The first request is sent at time 0; after each request the client waits a gap before the
  next: with ``request_rate`` infinite (the default) no gap (all arrive at 0), otherwise an exponential gap
  of mean ``1 / rate`` (a Poisson process). ``rate_distribution="constant"`` (our addition, not a
  bench_serving flag) waits exactly ``1 / rate`` instead.
- The random numbers. bench_serving seeds numpy's global legacy generator with ``--seed`` (default 42),
  draws the input lengths, then the output lengths, then the gaps as it sends. Lengths and gaps here come
  from one ``numpy.random.RandomState(seed)`` in that same order, so for a given seed they are the ones
  bench_serving draws (the legacy generator's stream is fixed across numpy versions).

What differs, and why it matters little to the cache:

- Prompt content. bench_serving's ``random`` dataset cuts (or repeats) ShareGPT conversations to each
  length; ``random-ids`` uses runs of consecutive token ids. Neither shares prefixes between prompts
  beyond a few common leading tokens by chance (the cache flushes the warm-up request). Here every prompt
  is random token ids and no two prompts share even their first token, so the radix tree never shares an
  edge between requests: the load test measures capacity and concurrency, not reuse. Both dataset names
  give this same model.
- The tokenizer round trip. bench_serving sends text: it subtracts the tokenizer's special tokens (a BOS)
  from each input length, decodes the ids to text, and the server encodes that text again and adds the
  special tokens back. The server's prompt is therefore the drawn length give or take re-tokenization
  drift (decoded ids rarely re-encode to exactly as many tokens). We use the drawn length exactly.
- Timing. bench_serving's gaps are ``asyncio.sleep`` calls, late by the event loop's jitter; ours are
  exact. Output lengths are exact here, as with bench_serving's default ``ignore_eos``.

No side effects; :meth:`RandomWorkload.requests` is O(num_prompts * (input_len + output_len)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mamba_radix.errors import InvalidArgument
from mamba_radix.sim.synthetic import MAX_TOKENS
from mamba_radix.sim.traces import TraceRequest

__all__ = [
    "DATASET_NAMES",
    "DEFAULT_SEED",
    "MAX_PROMPTS",
    "RATE_DISTRIBUTIONS",
    "RandomWorkload",
    "arrival_times_s",
    "random_lengths",
]

# bench_serving's --dataset-name values this module models (both the same way: see the module docstring)
DATASET_NAMES = ("random", "random-ids")
RATE_DISTRIBUTIONS = ("poisson", "constant")
DEFAULT_SEED = 42  # bench_serving's --seed default
# token ids are drawn below this; every prompt starts with a different id, so at most this many prompts
_VOCAB = 1 << 17
MAX_PROMPTS = 100_000


def random_lengths(full_len: int, range_ratio: float, num: int, rng: np.random.RandomState) -> list[int]:
    """``num`` lengths uniform over the integers ``[max(floor(full_len * range_ratio), 1), full_len]``, as
    bench_serving's ``compute_random_lens`` draws them (one ``randint`` call on ``rng``). Side effect:
    advances ``rng``. O(num)."""
    low = max(int(full_len * range_ratio), 1)
    return [int(x) for x in rng.randint(low, full_len + 1, size=num)]


def arrival_times_s(
    num: int, request_rate: float, distribution: str, rng: np.random.RandomState
) -> list[float]:
    """Send times in seconds of ``num`` requests: the first at 0, then a gap after each (none when the rate
    is infinite; exponential of mean ``1 / rate`` for ``poisson``, drawn from ``rng``; exactly ``1 / rate``
    for ``constant``). Side effect: ``poisson`` advances ``rng`` by ``num - 1`` draws. O(num)."""
    if num <= 0:
        return []
    if math.isinf(request_rate):
        return [0.0] * num
    if distribution == "constant":
        gaps = np.full(num - 1, 1.0 / request_rate)
    else:
        # the vectorised draw is the same stream as bench_serving's one draw after each request
        gaps = rng.exponential(1.0 / request_rate, size=num - 1)
    return [0.0, *(float(t) for t in np.cumsum(gaps))]


@dataclass(frozen=True)
class RandomWorkload:
    """bench_serving's random dataset and request arrivals, with its flag defaults (``--random-input-len``
    1024, ``--random-output-len`` 1024, ``--num-prompts`` 1000, ``--random-range-ratio`` 0.0,
    ``--request-rate`` inf, ``--seed`` 42). Raises :class:`InvalidArgument` for a bad value (the message
    names the argument: the command line maps it to its flag)."""

    random_input_len: int = 1024
    random_output_len: int = 1024
    num_prompts: int = 1000
    random_range_ratio: float = 0.0
    request_rate: float = math.inf
    request_rate_distribution: str = "poisson"
    seed: int = DEFAULT_SEED

    def __post_init__(self) -> None:
        for name in ("random_input_len", "random_output_len", "num_prompts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"{name} must be an int >= 1, got {value!r}")
        if self.num_prompts > MAX_PROMPTS:
            raise InvalidArgument(f"num_prompts must be <= {MAX_PROMPTS:,}, got {self.num_prompts:,}")
        if not 0.0 <= self.random_range_ratio <= 1.0:
            raise InvalidArgument(f"random_range_ratio must be in [0, 1], got {self.random_range_ratio}")
        if not self.request_rate > 0:  # also refuses NaN
            raise InvalidArgument(f"request_rate must be > 0 (inf: all at time 0), got {self.request_rate}")
        if self.request_rate_distribution not in RATE_DISTRIBUTIONS:
            raise InvalidArgument(
                f"request_rate_distribution must be one of {', '.join(RATE_DISTRIBUTIONS)}, "
                f"got {self.request_rate_distribution!r}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise InvalidArgument(
                f"seed must be an int from 0 to 2**32 - 1 (numpy's legacy seed), got {self.seed!r}"
            )
        most = self.num_prompts * (self.random_input_len + self.random_output_len)
        if most > MAX_TOKENS:
            raise InvalidArgument(
                f"num_prompts x (random_input_len + random_output_len) = {most:,} token ids exceed the limit of "
                f"{MAX_TOKENS:,}; use fewer prompts or shorter lengths"
            )

    @property
    def label(self) -> str:
        """The run's ``trace`` name: ``synthetic:random:...:seed=S`` (the synthetic workloads' form)."""
        rate = "inf" if math.isinf(self.request_rate) else f"{self.request_rate:g}"
        return (
            f"synthetic:random:in={self.random_input_len},out={self.random_output_len},n={self.num_prompts},"
            f"ratio={self.random_range_ratio:g},rate={rate},{self.request_rate_distribution}:seed={self.seed}"
        )

    def requests(self) -> list[TraceRequest]:
        """The requests in send order, token format, ``timestamp_ms`` the send time. Lengths and gaps as
        bench_serving draws them for this seed; token ids from a separate generator (seeded by the same
        seed), every prompt starting with a different id. O(num_prompts * (input + output lengths))."""
        bench = np.random.RandomState(self.seed)
        in_lens = random_lengths(self.random_input_len, self.random_range_ratio, self.num_prompts, bench)
        out_lens = random_lengths(self.random_output_len, self.random_range_ratio, self.num_prompts, bench)
        sends_s = arrival_times_s(self.num_prompts, self.request_rate, self.request_rate_distribution, bench)
        ids = np.random.default_rng(self.seed)
        firsts = ids.choice(_VOCAB, size=self.num_prompts, replace=False)
        out: list[TraceRequest] = []
        for i, (n_in, n_out, t_s) in enumerate(zip(in_lens, out_lens, sends_s, strict=True)):
            prompt = ids.integers(0, _VOCAB, size=n_in)
            prompt[0] = firsts[i]
            output = ids.integers(0, _VOCAB, size=n_out)
            out.append(TraceRequest.from_tokens(i, t_s * 1000.0, prompt.tolist(), output.tolist()))
        return out
