"""The session workload (:mod:`mamba_radix.sim.sessions`): session inference on a hand-made block trace,
the generator's determinism and session ids, and its reuse-by-age curve against the fit."""

from __future__ import annotations

import pytest

from mamba_radix.errors import InvalidArgument
from mamba_radix.sim.sessions import FITTED, REUSE_AGES, infer_sessions, reuse_by_age, session_chat
from mamba_radix.sim.traces import TraceRequest

# the generator's curve against FITTED.reuse_cdf, at every age of REUSE_AGES (6,000 requests, seeds 0-1:
# measured max differences 0.038 and 0.038)
CURVE_TOLERANCE = 0.06


def _block(index: int, blocks: list[int]) -> TraceRequest:
    return TraceRequest(
        index, float(index), input_len=len(blocks) * 4 - 1, output_len=1, block_ids=blocks, block_size=4
    )


def test_a_request_extending_an_earlier_ones_full_blocks_continues_its_session() -> None:
    reqs = [
        _block(0, [0, 1, 2, 3]),  # a session
        _block(1, [0, 4, 5]),  # another
        _block(2, [0, 1, 2, 6, 7]),  # extends request 0's full blocks [0, 1, 2]
        _block(3, [0, 8]),  # shares only the common block: a new session
        _block(4, [0, 1, 2, 6, 9]),  # extends request 2's full blocks (deeper than request 0's)
        _block(5, [0, 4, 5, 10]),  # request 1's last (partial) block is not a full one: [0, 4] matches
    ]
    assert infer_sessions(reqs) == [-1, -1, 0, -1, 2, 1]


def test_the_generator_is_seeded_and_every_continuation_keeps_its_session_id() -> None:
    a, b = session_chat(seed=3, num_requests=400), session_chat(seed=3, num_requests=400)
    assert [(r.block_ids, r.input_len, r.output_len, r.session_id) for r in a] == [
        (r.block_ids, r.input_len, r.output_len, r.session_id) for r in b
    ]
    assert len(a) == 400 and [r.index for r in a] == list(range(400))
    assert all(a[i].timestamp_ms <= a[i + 1].timestamp_ms for i in range(399))
    parents = infer_sessions(a)
    assert sum(p >= 0 for p in parents) > 20  # 400 requests are two minutes: few think times fit
    assert all(a[i].session_id == a[p].session_id for i, p in enumerate(parents) if p >= 0)
    assert all(r.block_ids and r.block_ids[0] == 0 for r in a)  # the shared first block
    assert all(0 < r.input_len - (len(r.block_ids or ()) - 1) * r.block_size <= r.block_size for r in a)
    with pytest.raises(InvalidArgument):
        session_chat(num_requests=0)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_generators_reuse_by_age_curve_matches_the_fit(seed: int) -> None:
    reqs = session_chat(seed=seed, num_requests=6000)
    curve = reuse_by_age(infer_sessions(reqs))
    assert max(abs(a - b) for a, b in zip(curve, FITTED.reuse_cdf, strict=True)) <= CURVE_TOLERANCE
    # S-shaped: almost no reuse within 50 requests, half of it by a few hundred
    assert curve[REUSE_AGES.index(50)] < 0.05 and 0.3 < curve[REUSE_AGES.index(400)] < 0.6


def test_the_fitted_continuation_chances_give_the_traces_share_of_continuations() -> None:
    reqs = session_chat(seed=0, num_requests=3000)
    share = sum(p >= 0 for p in infer_sessions(reqs)) / len(reqs)
    assert 0.25 < share < 0.40  # the trace: 3,974 of 12,031 (0.33)
