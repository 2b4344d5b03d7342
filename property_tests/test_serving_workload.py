"""bench_serving's random dataset and arrivals (:mod:`mamba_radix.sim.serving`): SGLang's length rule and
defaults, the same draws as bench_serving for a seed, the rate's two distributions, prompts that share no
prefix, and one-line refusals of bad values."""

from __future__ import annotations

import math
from dataclasses import fields

import numpy as np
import pytest

from mamba_radix.errors import InvalidArgument
from mamba_radix.sim.serving import (
    DATASET_NAMES,
    DEFAULT_SEED,
    RandomWorkload,
    arrival_times_s,
    random_lengths,
)


@pytest.mark.parametrize(
    ("full", "ratio"), [(16384, 0.0), (3072, 0.0), (100, 0.5), (100, 0.999), (7, 1.0), (1, 0.0)]
)
def test_lengths_follow_sglangs_range_rule(full: int, ratio: float) -> None:
    # [max(floor(full * ratio), 1), full], inclusive at both ends
    lengths = random_lengths(full, ratio, 2000, np.random.RandomState(0))
    low = max(int(full * ratio), 1)
    assert min(lengths) >= low and max(lengths) <= full
    if full - low >= 2:  # uniform: both ends of a wide range are reached
        assert min(lengths) < low + (full - low) / 10 and max(lengths) > full - (full - low) / 10


def test_ratio_one_is_every_request_at_full_length() -> None:
    reqs = RandomWorkload(300, 20, 50, random_range_ratio=1.0).requests()
    assert {(r.input_len, r.output_len) for r in reqs} == {(300, 20)}


def test_the_draws_are_bench_servings_for_the_seed() -> None:
    # bench_serving: np.random.seed(seed); input lengths; output lengths; then one exponential gap after
    # each request it sends (restated here from its sample_random_requests / get_request)
    n, rate = 40, 4.0
    np.random.seed(DEFAULT_SEED)
    in_lens = np.random.randint(1, 16384 + 1, size=n).tolist()
    out_lens = np.random.randint(1, 3072 + 1, size=n).tolist()
    sends, t = [], 0.0
    for _ in range(n):
        sends.append(t)
        t += np.random.exponential(1.0 / rate)
    reqs = RandomWorkload(16384, 3072, n, request_rate=rate).requests()
    assert [r.input_len for r in reqs] == in_lens
    assert [r.output_len for r in reqs] == out_lens
    assert [r.timestamp_ms for r in reqs] == pytest.approx([s * 1000 for s in sends], rel=1e-12, abs=1e-9)


def test_rates_infinite_constant_and_poisson() -> None:
    rng = np.random.RandomState(1)
    assert arrival_times_s(5, math.inf, "poisson", rng) == [0.0] * 5
    assert arrival_times_s(4, 2.0, "constant", rng) == [0.0, 0.5, 1.0, 1.5]
    assert arrival_times_s(0, 2.0, "poisson", rng) == []
    sends = arrival_times_s(20_001, 4.0, "poisson", np.random.RandomState(2))
    gaps = np.diff(sends)
    assert sends[0] == 0.0 and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() == pytest.approx(0.25, rel=0.05)  # exponential: std = mean


def test_the_default_rate_sends_everything_at_time_zero() -> None:
    reqs = RandomWorkload(64, 8, 10).requests()
    assert [r.timestamp_ms for r in reqs] == [0.0] * 10 and [r.index for r in reqs] == list(range(10))


def test_seeded_and_no_prompt_shares_a_prefix() -> None:
    a = RandomWorkload(256, 16, 200, request_rate=3.0, seed=7).requests()
    b = RandomWorkload(256, 16, 200, request_rate=3.0, seed=7).requests()
    c = RandomWorkload(256, 16, 200, request_rate=3.0, seed=8).requests()
    assert [(r.input_ids, r.output_ids, r.timestamp_ms) for r in a] == [
        (r.input_ids, r.output_ids, r.timestamp_ms) for r in b
    ]
    assert [r.input_ids for r in a] != [r.input_ids for r in c]
    # every prompt starts with its own token: the radix tree shares no edge between requests
    assert len({r.input_ids[0] for r in a}) == len(a)
    assert all(len(r.input_ids) == r.input_len and len(r.output_ids) == r.output_len for r in a)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"request_rate": 0.0}, "request_rate must be > 0"),
        ({"request_rate": -1.0}, "request_rate must be > 0"),
        ({"request_rate": math.nan}, "request_rate must be > 0"),
        ({"random_range_ratio": 1.5}, "random_range_ratio must be in [0, 1]"),
        ({"random_range_ratio": -0.1}, "random_range_ratio must be in [0, 1]"),
        ({"num_prompts": 0}, "num_prompts must be an int >= 1"),
        ({"random_input_len": 0}, "random_input_len must be an int >= 1"),
        ({"request_rate_distribution": "uniform"}, "request_rate_distribution must be one of"),
        ({"seed": 2**32}, "seed must be an int from 0"),
        ({"num_prompts": 100_000, "random_input_len": 10_000}, "exceed the limit"),
    ],
)
def test_bad_values_are_refused_before_any_work(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidArgument, match=None) as err:
        RandomWorkload(**kwargs)  # type: ignore[arg-type]
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_flag_tables_defaults_are_bench_servings() -> None:
    # flags.py writes the defaults out (so --help imports no numpy): they must be this module's
    from mamba_radix.flags import FLAGS

    table = {f.dest: f for f in FLAGS()}
    for field in fields(RandomWorkload):
        if field.name == "seed":
            continue
        assert table[field.name].default == field.default, field.name
    assert table["dataset_name"].kind("random") == "random"
    for name in DATASET_NAMES:
        assert table["dataset_name"].kind(name) == name
    assert table["random_range_ratio"].default == 0.0  # bench_serving's, not 1.0


def test_the_label_names_the_workload() -> None:
    label = RandomWorkload(16384, 3072, 128, request_rate=4.0).label
    assert label == "synthetic:random:in=16384,out=3072,n=128,ratio=0,rate=4,poisson:seed=42"
    assert "rate=inf" in RandomWorkload().label
