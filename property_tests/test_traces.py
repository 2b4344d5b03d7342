"""Trace loaders (block and token formats), every trace-format error, synthetic generators, the ideal."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from mamba_radix.errors import InvalidArgument, TraceFileError, TraceFormatError
from mamba_radix.sim.ideal import BlockPrefixIdeal, TokenPrefixIdeal
from mamba_radix.sim.synthetic import GENERATORS
from mamba_radix.sim.traces import (
    OUTPUT_TOKEN_BASE,
    TraceRequest,
    detect_format,
    expand_blocks,
    expand_blocks_array,
    iter_block_trace,
    iter_token_trace,
    iter_trace,
    scan_trace,
    write_token_trace,
)

REPO = Path(__file__).resolve().parents[1]
CONVERSATION = REPO / "experiments" / "traces" / "mooncake_conversation_trace.jsonl"


def _write(tmp_path: Path, rows: list[object], name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _block(ts: float = 0, il: int = 5, ol: int = 2, ids: list[int] | None = None) -> dict[str, object]:
    return {
        "timestamp": ts,
        "input_length": il,
        "output_length": ol,
        "hash_ids": ids if ids is not None else [7, 8],
    }


# ----------------------------------------------------------------------------------------- block format
def test_block_expansion_is_deterministic_and_cut_to_input_length(tmp_path: Path) -> None:
    path = _write(tmp_path, [_block(0, 5, 2, [7, 8]), _block(10, 4, 3, [7])])
    a, b = list(iter_block_trace(path, block_size=4))
    assert a.input_ids == [28, 29, 30, 31, 32]  # block 7 -> 28..31, block 8 cut to one token
    assert b.input_ids == [28, 29, 30, 31]
    assert a.input_ids[:4] == b.input_ids  # equal block ids at equal depth share the tokens
    assert expand_blocks([7, 8], 5, 4) == a.input_ids


def test_block_outputs_are_fresh_and_never_collide(tmp_path: Path) -> None:
    path = _write(tmp_path, [_block(0, 5, 3, [7, 8]), _block(0, 5, 3, [7, 8])])
    a, b = list(iter_block_trace(path, block_size=4))
    assert len(a.output_ids) == 3 and len(set(a.output_ids) | set(b.output_ids)) == 6
    assert min(a.output_ids + b.output_ids) >= OUTPUT_TOKEN_BASE > max(a.input_ids)


def test_block_requests_stay_compact_until_expanded(tmp_path: Path) -> None:
    path = _write(tmp_path, [_block(0, 5, 2, [7, 8])])
    (req,) = iter_block_trace(path, block_size=4)
    assert req.tokens_in is None and req.block_ids == [7, 8] and req.input_len == 5 and req.output_len == 2


def test_limit_and_blank_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, [_block(0), "", _block(1), _block(2)])
    assert [r.line for r in iter_block_trace(path, 4, limit=2)] == [1, 3]


def test_bundled_conversation_trace_streams() -> None:
    summary = scan_trace(CONVERSATION, limit=50)
    reqs = list(iter_trace(CONVERSATION, limit=50))
    assert summary.num_requests == 50 == len(reqs)
    assert summary.input_tokens == sum(r.input_len for r in reqs) == sum(len(r.input_ids) for r in reqs[:50])
    assert reqs[0].input_ids[:512] == reqs[1].input_ids[:512]  # both start with block 0


# -------------------------------------------------------------------------------------------- errors
BLOCK_ERRORS = [
    ("{not json", None, "invalid JSON"),
    ("[1, 2]", None, "JSON object"),
    ({"input_length": 5, "output_length": 1, "hash_ids": [1, 2]}, "timestamp", "missing"),
    (_block(ts=-1), "timestamp", ">= 0"),
    (_block(ts="soon"), "timestamp", "number"),  # type: ignore[arg-type]
    ({"timestamp": 0, "output_length": 1, "hash_ids": [1]}, "input_length", "missing"),
    (_block(il=0), "input_length", ">= 1"),
    (_block(il=True), "input_length", "integer"),  # type: ignore[arg-type]
    (_block(il=4.5), "input_length", "integer"),  # type: ignore[arg-type]
    (_block(ol=-2), "output_length", ">= 0"),
    ({"timestamp": 0, "input_length": 5, "output_length": 1}, "hash_ids", "missing"),
    (_block(ids="abc"), "hash_ids", "list"),  # type: ignore[arg-type]
    (_block(ids=[]), "hash_ids", "has 0 blocks"),
    (_block(ids=[1, -3]), "hash_ids", "item 1"),
    (_block(ids=[1, 2**63]), "hash_ids", "largest allowed"),
    (_block(il=5, ids=[1]), "hash_ids", "needs"),
    (_block(il=5, ids=[1, 2, 3]), "hash_ids", "needs"),
]


@pytest.mark.parametrize(("row", "field", "words"), BLOCK_ERRORS)
def test_every_block_format_error_names_file_line_and_field(
    tmp_path: Path, row: object, field: str | None, words: str
) -> None:
    path = _write(tmp_path, [_block(0), row])
    with pytest.raises(TraceFormatError) as info:
        list(iter_block_trace(path, block_size=4))
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), 2, field)
    assert words in str(err) and f"{path}:2" in str(err)
    with pytest.raises(TraceFormatError):  # the cheap scan validates the same way
        scan_trace(path, "block", 4)


def test_timestamp_going_backwards_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path, [_block(5), _block(3)])
    with pytest.raises(TraceFormatError, match="backwards") as info:
        list(iter_block_trace(path, 4))
    assert (info.value.line, info.value.field) == (2, "timestamp")


TOKEN_ERRORS = [
    ({"timestamp": 0, "output_ids": [1]}, "input_ids", "missing"),
    ({"timestamp": 0, "input_ids": [], "output_ids": [1]}, "input_ids", "empty"),
    ({"timestamp": 0, "input_ids": [1, "x"], "output_ids": []}, "input_ids", "item 1"),
    ({"timestamp": 0, "input_ids": [1, 2]}, "output_ids", "missing"),
    ({"timestamp": 0, "input_ids": [1], "output_ids": [-1]}, "output_ids", "item 0"),
    ({"input_ids": [1], "output_ids": []}, "timestamp", "missing"),
]


@pytest.mark.parametrize(("row", "field", "words"), TOKEN_ERRORS)
def test_every_token_format_error(tmp_path: Path, row: dict[str, object], field: str, words: str) -> None:
    good = {"timestamp": 0, "input_ids": [1, 2], "output_ids": [3]}
    path = _write(tmp_path, [good, good, row])
    with pytest.raises(TraceFormatError) as info:
        list(iter_token_trace(path))
    assert (info.value.line, info.value.field) == (3, field) and words in str(info.value)


def test_empty_and_unknown_traces(tmp_path: Path) -> None:
    empty = _write(tmp_path, ["", ""], "empty.jsonl")
    with pytest.raises(TraceFormatError, match="no requests"):
        detect_format(empty)
    with pytest.raises(TraceFormatError, match="no requests"):
        list(iter_block_trace(empty))
    unknown = _write(tmp_path, [{"timestamp": 0, "prompt": "hi"}], "unknown.jsonl")
    with pytest.raises(TraceFormatError, match="unknown row format") as info:
        list(iter_trace(unknown))
    assert info.value.line == 1


def test_token_format_round_trip_and_detection(tmp_path: Path) -> None:
    reqs = GENERATORS["chat"](seed=3, num_sessions=2, turns=2)
    path = tmp_path / "chat.jsonl"
    assert write_token_trace(reqs, path) == len(reqs)
    assert detect_format(path) == "token"
    back = list(iter_trace(path))
    assert [(r.input_ids, r.output_ids, r.session_id) for r in back] == [
        (r.input_ids, r.output_ids, r.session_id) for r in reqs
    ]


# --------------------------------------------------------------------------------------- synthetic
@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_generators_are_seeded_and_sorted(name: str) -> None:
    a, b, c = GENERATORS[name](seed=1), GENERATORS[name](seed=1), GENERATORS[name](seed=2)
    assert [(r.timestamp_ms, r.input_ids, r.output_ids) for r in a] == [
        (r.timestamp_ms, r.input_ids, r.output_ids) for r in b
    ]
    assert [r.input_ids for r in a] != [r.input_ids for r in c]
    assert [r.timestamp_ms for r in a] == sorted(r.timestamp_ms for r in a)
    assert [r.index for r in a] == list(range(len(a)))


def test_chat_turns_resend_history_and_outputs() -> None:
    reqs = GENERATORS["chat"](seed=0, num_sessions=1, turns=3)
    for prev, nxt in itertools.pairwise(reqs):
        history = prev.input_ids + prev.output_ids
        assert nxt.input_ids[: len(history)] == history


# ------------------------------------------------------------------------------------------- ideal
def test_block_ideal_counts_partial_last_blocks_and_the_last_token() -> None:
    ideal = BlockPrefixIdeal(block_size=4)

    def req(i: int, il: int, ids: list[int]) -> TraceRequest:
        return TraceRequest(index=i, timestamp_ms=0, input_len=il, output_len=1, block_ids=ids, block_size=4)

    assert ideal.observe(req(0, 6, [1, 2])) == 0
    assert ideal.observe(req(1, 6, [1, 2])) == 5  # identical input: capped at input_len - 1
    assert ideal.observe(req(2, 8, [1, 2])) == 6  # earlier inputs cover only 6 tokens of block 2
    assert ideal.observe(req(3, 12, [1, 2, 3])) == 8
    assert ideal.observe(req(4, 9, [1, 9, 3])) == 4


def test_token_ideal_is_the_longest_previous_prefix() -> None:
    ideal = TokenPrefixIdeal()
    seq = [TraceRequest.from_tokens(i, 0, inp, out) for i, (inp, out) in enumerate(
        [([1, 2, 3, 4], [9, 8]), ([1, 2, 5], [7]), ([1, 2, 3, 4, 9, 8, 6], [1]), ([7], [1])]
    )]  # fmt: skip
    assert [ideal.observe(r) for r in seq] == [0, 2, 5, 0]  # output 9 is cached, its last token 8 is not


def test_token_arrays_equal_the_token_lists(tmp_path: Path) -> None:
    """The engine builds its fingerprints from the arrays and the cache's keys from the lists: the two
    must be the same tokens, in both formats."""
    block = _write(tmp_path, [_block(0, 5, 3, [7, 8]), _block(1, 4, 0, [9])], "b.jsonl")
    token = _write(tmp_path, [{"timestamp": 0, "input_ids": [3, 1, 2], "output_ids": [9]}], "t.jsonl")
    for req in [*iter_block_trace(block, block_size=4), *iter_token_trace(token)]:
        assert req.input_array().tolist() == req.input_ids
        assert req.output_array().tolist() == req.output_ids
        assert req.input_array().dtype.name == req.output_array().dtype.name == "int64"
    assert expand_blocks_array([7, 8], 5, 4).tolist() == expand_blocks([7, 8], 5, 4)


# ----------------------------------------------------------------------------------- block conventions
def test_auto_convention_reads_mooncake_traces_as_ceil_exactly_as_before(tmp_path: Path) -> None:
    rows = [r for _, r in zip(range(300), map(json.loads, CONVERSATION.open()), strict=False)]
    path = _write(tmp_path, rows)
    auto = list(iter_block_trace(path, limit=300))
    ceil = list(iter_block_trace(path, limit=300, block_convention="ceil"))
    assert [r.input_array().tolist() for r in auto] == [r.input_array().tolist() for r in ceil]
    assert all(r.tail_len == 0 for r in auto)
    assert scan_trace(path, block_convention="auto") == scan_trace(path, block_convention="ceil")
    with pytest.raises(TraceFormatError, match="fits block_convention 'ceil', not 'floor'") as info:
        list(iter_block_trace(path, block_convention="floor"))
    assert (info.value.line, info.value.field) == (1, "hash_ids")


def test_floor_convention_gives_the_untracked_tail_fresh_tokens(tmp_path: Path) -> None:
    # one id per full block of 4; tails of 2 and 3 tokens carry no id
    path = _write(tmp_path, [_block(0, 6, 1, [7]), _block(1, 7, 1, [7]), _block(2, 8, 1, [7, 9])])
    a, b, c = list(iter_trace(path, block_size=4))
    assert a.input_ids[:4] == b.input_ids[:4] == c.input_ids[:4] == [28, 29, 30, 31]
    assert (len(a.input_ids), len(b.input_ids), c.input_ids[4:]) == (6, 7, [36, 37, 38, 39])
    tails = a.input_ids[4:] + b.input_ids[4:]
    assert len(set(tails)) == 5 and not set(tails) & set(c.input_ids)  # fresh: unique to each request
    assert min(tails) > max(a.output_ids + b.output_ids + c.output_ids)  # not an output id either
    for r in (a, b, c):
        assert r.input_array().tolist() == r.input_ids
    assert scan_trace(path, block_size=4).input_tokens == 21


def test_floor_convention_accepts_a_short_input_without_ids(tmp_path: Path) -> None:
    path = _write(tmp_path, [_block(0, 3, 1, [])])
    (r,) = list(iter_trace(path, block_size=4))
    assert len(r.input_ids) == 3 and r.tail_len == 3


@pytest.mark.parametrize(
    ("rows", "line", "words"),
    [
        ([_block(0, 5, 1, [1, 2]), _block(1, 5, 1, [3])], 2, "line 1 fits only 'ceil'"),
        # a whole number of blocks fits both and decides nothing
        (
            [_block(0, 8, 1, [1, 2]), _block(1, 5, 1, [3]), _block(2, 6, 1, [3, 4])],
            3,
            "line 2 fits only 'floor'",
        ),
        ([_block(0, 9, 1, [1])], 1, "needs ceil(9/4) = 3"),
    ],
)
def test_a_file_fitting_neither_or_mixing_conventions_is_one_error_naming_the_line(
    tmp_path: Path, rows: list[object], line: int, words: str
) -> None:
    path = _write(tmp_path, rows)
    for load in (lambda: list(iter_trace(path, block_size=4)), lambda: scan_trace(path, block_size=4)):
        with pytest.raises(TraceFormatError) as info:
            load()
        err = info.value
        assert (err.path, err.line, err.field) == (str(path), line, "hash_ids")
        assert words in str(err) and "\n" not in str(err)


def test_block_ids_up_to_2_63_minus_1_expand_to_int64_tokens(tmp_path: Path) -> None:
    big = 2**63 - 1
    path = _write(
        tmp_path, [_block(0, 8, 1, [big, 5]), _block(1, 8, 1, [big, 2**40]), _block(2, 8, 1, [5, big])]
    )
    a, b, c = list(iter_trace(path, block_size=4))
    assert a.input_ids[:4] == b.input_ids[:4] == c.input_ids[4:]  # equal ids, equal tokens
    assert a.input_ids[4:] == list(range(20, 24)) and b.input_ids[4:] != a.input_ids[4:]
    assert max(a.input_ids + b.input_ids) <= 2**63 - 1
    assert a.input_array().tolist() == a.input_ids
    with pytest.raises(TraceFormatError, match="largest allowed"):
        list(iter_trace(_write(tmp_path, [_block(0, 4, 1, [2**63])], "over.jsonl"), block_size=4))


# ------------------------------------------------------------------------------ unreadable trace files
@pytest.mark.parametrize(
    ("content", "line", "words"),
    [
        (b'{"timestamp": 0, "input_ids": [1], "output_ids": []}\n{"x": "\xff\xfe"}\n', 2, "not UTF-8"),
        (b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8, 1, "binary file"),
        (b"[" * 100_000 + b"]" * 100_000 + b"\n", 1, "nested too deeply"),
        (b'{"timestamp": 0, "input_length": ' + b"9" * 5000 + b"}\n", 1, "invalid JSON value"),
        (b'{"timestamp": 1e400, "input_ids": [1], "output_ids": []}\n', 1, "finite number"),
        (
            b'{"timestamp": 0, "input_ids": [1, 1180591620717411303424], "output_ids": []}\n',
            1,
            "largest allowed",
        ),
    ],
)
def test_unreadable_rows_are_trace_format_errors_with_file_and_line(
    tmp_path: Path, content: bytes, line: int, words: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError) as info:
        list(iter_trace(path, fmt="token" if b"input_ids" in content else "auto"))
    assert (info.value.path, info.value.line) == (str(path), line)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_folder_or_a_missing_file_is_a_trace_file_error(tmp_path: Path) -> None:
    for path, words in ((tmp_path, "is a folder"), (tmp_path / "nope.jsonl", "no such file")):
        for load in (
            lambda p=path: list(iter_trace(p)),
            lambda p=path: scan_trace(p),
            lambda p=path: detect_format(p),
        ):
            with pytest.raises(TraceFileError, match=words) as info:
                load()
            assert isinstance(info.value, OSError) and info.value.line == 0
    with pytest.raises(TraceFileError, match="cannot be written"):
        write_token_trace([], tmp_path)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_size": 0},
        {"block_size": 1.5},
        {"block_size": 2**20},
        {"limit": -1},
        {"block_convention": "round"},
    ],
)
def test_bad_loader_arguments_are_refused_at_the_call(tmp_path: Path, kwargs: dict[str, object]) -> None:
    path = tmp_path / "never-read.jsonl"  # does not exist: the arguments are refused before any read
    with pytest.raises(InvalidArgument):
        iter_block_trace(path, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        scan_trace(path, "block", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("chat", {"seed": -1}),
        ("chat", {"vocab": 0}),
        ("chat", {"turns": 1.5}),
        ("chat", {"session_rate_per_s": 0}),
        ("chat", {"output_len": 10**12}),
        ("tree", {"depth": 50}),
        ("agent", {"steps": 10**9}),
        ("system-prompt", {"num_prompts": 0}),
    ],
)
def test_synthetic_generators_refuse_bad_or_huge_arguments_at_once(
    name: str, kwargs: dict[str, object]
) -> None:
    with pytest.raises(InvalidArgument):
        GENERATORS[name](**kwargs)
