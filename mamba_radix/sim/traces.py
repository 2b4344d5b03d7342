"""Request traces: the two file formats, streaming loaders and the request record the engine replays.

Formats (one JSON object per line; blank lines are skipped):

- **block** (Mooncake FAST'25): ``{"timestamp": ms, "input_length": int, "output_length": int,
  "hash_ids": [int, ...]}``. Block id ``b`` expands deterministically to the tokens
  ``b * block_size + j`` for ``j = 0 .. block_size - 1``. The trace carries no output identity, so
  outputs get fresh ids above :data:`OUTPUT_TOKEN_BASE`, unique per request and never equal to an input
  token. Two block conventions (``block_convention``):

  - ``ceil`` (Mooncake): ``len(hash_ids) == ceil(input_length / block_size)``; the partial tail block
    has an id, and the last block is cut so the input has exactly ``input_length`` tokens;
  - ``floor``: ``len(hash_ids) == input_length // block_size``, one id per full block; the
    ``input_length % block_size`` tail tokens have no id and become fresh tokens, unique to the request
    (as a tail nobody else can match should be);
  - ``auto`` (the default): each row is classified by its count; a row whose ``input_length`` is a
    multiple of ``block_size`` fits both and expands the same under both; the first row that fits only
    one decides the file, and a later row fitting only the other is an error. Mooncake traces come out
    ``ceil``, exactly as before.

  Block ids may be any integer in ``0 .. 2**63 - 1``. Ids up to ``2**31 - 1`` expand as above; a larger
  id (whose tokens would not fit int64) is given, per loader, the next number of a dense range starting
  at ``2**60 // block_size``, in order of first appearance: equal ids still give equal tokens and
  different ids different ones, within one load of a trace.
- **token**: ``{"timestamp": ms, "session_id"?: any, "input_ids": [int, ...], "output_ids": [int, ...]}``.

Loaders stream: a row is parsed, validated and expanded only when the engine asks for the next request,
so the 12,031-request Mooncake conversation trace (about 145M input tokens) never sits in memory at once.
Bad rows raise :class:`~mamba_radix.errors.TraceFormatError` with the file, the 1-based line and the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from mamba_radix.errors import InvalidArgument, TraceFileError, TraceFormatError
from mamba_radix.jsonl import iter_json_objects

__all__ = [
    "BLOCK_CONVENTIONS",
    "DEFAULT_BLOCK_SIZE",
    "MAX_TOKEN_ID",
    "OUTPUT_TOKEN_BASE",
    "BlockConvention",
    "TraceFormat",
    "TraceRequest",
    "TraceSummary",
    "detect_format",
    "expand_blocks",
    "expand_blocks_array",
    "iter_block_trace",
    "iter_token_trace",
    "iter_trace",
    "output_token_ids",
    "scan_trace",
    "write_token_trace",
]

TraceFormat = Literal["block", "token"]
BlockConvention = Literal["ceil", "floor", "auto"]
BLOCK_CONVENTIONS: tuple[str, ...] = ("auto", "ceil", "floor")
DEFAULT_BLOCK_SIZE = 512
# Token id layout of a block trace (all below 2**63, so every id fits int64):
#   [0, 2**40)              blocks with ids < 2**31 (block sizes are bounded so that b * block_size < 2**40)
#   2**40 + i * 2**24 + j   output token j of request i (a 2**24-wide window per request)
#   2**56 + i * bs + j      fresh tail token j of request i (floor convention; tail < block_size)
#   ~2**60 + k * bs + j     block number k of the ids >= 2**31, numbered densely per loader
OUTPUT_TOKEN_BASE = 1 << 40
_OUTPUT_WINDOW = 1 << 24
_MAX_DIRECT_BLOCK_ID = (1 << 31) - 1
_TAIL_TOKEN_BASE = 1 << 56
_LARGE_BLOCK_BASE = 1 << 60
MAX_TOKEN_ID = (1 << 63) - 1  # the largest block id or token id a trace may hold
_MAX_BLOCK_ID = MAX_TOKEN_ID
_MAX_OUTPUT_LEN = _OUTPUT_WINDOW - 1
_MAX_BLOCK_SIZE = OUTPUT_TOKEN_BASE // (_MAX_DIRECT_BLOCK_ID + 1)


@dataclass
class TraceRequest:
    """One request of a trace.

    Block-format requests stay compact (``block_ids`` + lengths) until :attr:`input_ids` /
    :attr:`output_ids` expand them, O(tokens) per call, so a long waiting queue costs little memory.
    Token-format requests carry their ids (``tokens_in`` / ``tokens_out``). ``index`` is the 0-based
    position in the trace; ``line`` the 1-based line it came from (0 if generated). ``tail_len``: input
    tokens after the last block that no block id covers (floor convention), expanded as fresh ids.
    """

    index: int
    timestamp_ms: float
    input_len: int
    output_len: int
    session_id: Any = None
    block_ids: list[int] | None = None
    block_size: int = DEFAULT_BLOCK_SIZE
    line: int = 0
    tokens_in: list[int] | None = None
    tokens_out: list[int] | None = None
    extra_key: str | None = None
    tail_len: int = 0

    @classmethod
    def from_tokens(
        cls,
        index: int,
        timestamp_ms: float,
        input_ids: list[int],
        output_ids: list[int],
        session_id: Any = None,
        line: int = 0,
    ) -> TraceRequest:
        return cls(
            index=index,
            timestamp_ms=timestamp_ms,
            input_len=len(input_ids),
            output_len=len(output_ids),
            session_id=session_id,
            line=line,
            tokens_in=input_ids,
            tokens_out=output_ids,
        )

    @property
    def input_ids(self) -> list[int]:
        """The input tokens (a new list for block requests, the stored one for token requests)."""
        if self.tokens_in is not None:
            return self.tokens_in
        assert self.block_ids is not None
        tokens = expand_blocks(self.block_ids, self.input_len - self.tail_len, self.block_size)
        if self.tail_len:
            start = _TAIL_TOKEN_BASE + self.index * self.block_size
            tokens.extend(range(start, start + self.tail_len))
        return tokens

    @property
    def output_ids(self) -> list[int]:
        if self.tokens_out is not None:
            return self.tokens_out
        return output_token_ids(self.index, self.output_len)

    def input_array(self) -> np.ndarray:
        """The input tokens as an int64 array (a new array; for block requests built without a Python
        list, O(input_len) vectorised)."""
        if self.tokens_in is not None:
            return np.asarray(self.tokens_in, dtype=np.int64)
        assert self.block_ids is not None
        blocks = expand_blocks_array(self.block_ids, self.input_len - self.tail_len, self.block_size)
        if not self.tail_len:
            return blocks
        start = _TAIL_TOKEN_BASE + self.index * self.block_size
        return np.concatenate([blocks, np.arange(start, start + self.tail_len, dtype=np.int64)])

    def output_array(self) -> np.ndarray:
        """The output tokens as an int64 array (a new array). O(output_len)."""
        if self.tokens_out is not None:
            return np.asarray(self.tokens_out, dtype=np.int64)
        start = OUTPUT_TOKEN_BASE + self.index * _OUTPUT_WINDOW
        return np.arange(start, start + self.output_len, dtype=np.int64)

    def to_token_row(self) -> dict[str, Any]:
        """The token-format JSON object of this request."""
        row: dict[str, Any] = {"timestamp": self.timestamp_ms}
        if self.session_id is not None:
            row["session_id"] = self.session_id
        row["input_ids"] = self.input_ids
        row["output_ids"] = self.output_ids
        return row


def expand_blocks(
    block_ids: Sequence[int], input_length: int, block_size: int = DEFAULT_BLOCK_SIZE
) -> list[int]:
    """The token ids of a block-format input: block ``b`` -> ``b*block_size .. b*block_size+block_size-1``,
    cut to ``input_length``. ``(b + 1) * block_size`` must fit int64 (the loaders renumber larger ids).
    O(input_length)."""
    _check_expandable(block_ids, block_size)
    tokens: list[int] = []
    for b in block_ids:
        start = b * block_size
        tokens.extend(range(start, start + block_size))
    del tokens[input_length:]
    return tokens


def expand_blocks_array(
    block_ids: Sequence[int], input_length: int, block_size: int = DEFAULT_BLOCK_SIZE
) -> np.ndarray:
    """:func:`expand_blocks` as an int64 array, vectorised. O(input_length)."""
    _check_expandable(block_ids, block_size)
    blocks = np.asarray(block_ids, dtype=np.int64)
    return (blocks[:, None] * block_size + np.arange(block_size, dtype=np.int64)).ravel()[:input_length]


def _check_expandable(block_ids: Sequence[int], block_size: int) -> None:
    """Raise :class:`InvalidArgument` unless every block's tokens fit int64. O(len(block_ids))."""
    if block_ids and (min(block_ids) < 0 or (max(block_ids) + 1) * block_size > MAX_TOKEN_ID + 1):
        raise InvalidArgument(
            f"block ids must be >= 0 with (id + 1) * block_size <= 2**63; got ids {min(block_ids)}.."
            f"{max(block_ids)} at block size {block_size} (the trace loaders renumber larger ids)"
        )


def output_token_ids(request_index: int, output_length: int) -> list[int]:
    """Fresh output ids for request ``request_index`` (never an input id, never another request's)."""
    start = OUTPUT_TOKEN_BASE + request_index * _OUTPUT_WINDOW
    return list(range(start, start + output_length))


# ------------------------------------------------------------------------------------------ validation
def _empty_trace(path: object) -> TraceFormatError:
    """The error for a trace file without a single request (every loader's)."""
    return TraceFormatError(str(path), 0, None, "the trace has no requests")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    """A JSON number: an int (any size: math.isfinite would overflow on a huge one) or a finite float."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


class _RowReader:
    """Iterates (line number, JSON object) over a file, checking the JSON and the timestamp order."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.prev_timestamp = -math.inf
        self.convention: str | None = None  # block convention the file has shown (auto), or None
        self.convention_line = 0  # the row that decided it
        self._large_ids: dict[int, int] = {}  # block id >= 2**31 -> its dense number

    def rows(self) -> Iterator[tuple[int, dict[str, Any]]]:
        return iter_json_objects(self.path)

    def error(self, line: int, fld: str | None, message: str) -> TraceFormatError:
        return TraceFormatError(self.path, line, fld, message)

    def require(self, row: dict[str, Any], line: int, name: str) -> Any:
        if name not in row:
            raise self.error(line, name, "missing")
        return row[name]

    def timestamp(self, row: dict[str, Any], line: int) -> float:
        ts = self.require(row, line, "timestamp")
        if not _is_number(ts) or ts < 0:
            raise self.error(line, "timestamp", f"must be a finite number >= 0 (ms), got {ts!r}")
        try:
            ts = float(ts)  # an int too large for a float (JSON has no bound) is refused here, typed
        except OverflowError:
            raise self.error(
                line,
                "timestamp",
                f"must be a finite number >= 0 (ms); got an integer of {len(str(ts))} digits",
            ) from None
        if ts < self.prev_timestamp:
            raise self.error(
                line, "timestamp", f"goes backwards ({ts} < {self.prev_timestamp}); sort the trace"
            )
        self.prev_timestamp = ts
        return ts

    def int_field(self, row: dict[str, Any], line: int, name: str, minimum: int) -> int:
        value = self.require(row, line, name)
        if not _is_int(value) or value < minimum:
            raise self.error(line, name, f"must be an integer >= {minimum}, got {value!r}")
        return value

    def id_list(
        self, row: dict[str, Any], line: int, name: str, *, non_empty: bool, maximum: int | None
    ) -> list[int]:
        value = self.require(row, line, name)
        if not isinstance(value, list):
            raise self.error(line, name, f"must be a list of integers, got {type(value).__name__}")
        if non_empty and not value:
            raise self.error(line, name, "must not be empty")
        for pos, item in enumerate(value):
            if not _is_int(item) or item < 0:
                raise self.error(line, name, f"item {pos} must be an integer >= 0, got {item!r}")
            if maximum is not None and item > maximum:
                raise self.error(line, name, f"item {pos} is {item}, above the largest allowed id {maximum}")
        return value

    def block_convention(
        self, line: int, input_length: int, num_blocks: int, block_size: int, asked: str
    ) -> str:
        """The convention this row follows (``ceil`` or ``floor``; rows that fit both count as the file's
        choice so far), or a :class:`TraceFormatError` on ``hash_ids`` naming what it needs. O(1)."""
        ceil_n = -(-input_length // block_size)
        floor_n = input_length // block_size
        fits = [c for c, n in (("ceil", ceil_n), ("floor", floor_n)) if n == num_blocks]
        needs = (
            f"input_length {input_length} needs ceil({input_length}/{block_size}) = {ceil_n} "
            f"(block_convention 'ceil') or {input_length}//{block_size} = {floor_n} ('floor')"
        )
        if not fits:
            raise self.error(line, "hash_ids", f"has {num_blocks} blocks but {needs}")
        if asked != "auto":
            if asked not in fits:
                raise self.error(
                    line,
                    "hash_ids",
                    f"has {num_blocks} blocks, which fits block_convention {fits[0]!r}, not {asked!r}: "
                    f"{needs}",
                )
            return asked
        if len(fits) == 2:  # a whole number of blocks: both expand the same
            return self.convention or "ceil"
        if self.convention is None:
            self.convention, self.convention_line = fits[0], line
        elif self.convention != fits[0]:
            raise self.error(
                line,
                "hash_ids",
                f"has {num_blocks} blocks, which fits only block_convention {fits[0]!r}, but line "
                f"{self.convention_line} fits only {self.convention!r}: {needs}; one file uses one convention",
            )
        return fits[0]

    def dense_block_ids(self, hash_ids: list[int], block_size: int) -> list[int]:
        """``hash_ids`` with ids above 2**31 - 1 renumbered into the dense range (see the module
        docstring); the list itself when none is. O(len(hash_ids))."""
        if not hash_ids or max(hash_ids) <= _MAX_DIRECT_BLOCK_ID:
            return hash_ids
        base = _LARGE_BLOCK_BASE // block_size
        numbers = self._large_ids
        out = []
        for b in hash_ids:
            if b > _MAX_DIRECT_BLOCK_ID:
                k = numbers.get(b)
                if k is None:
                    k = numbers[b] = len(numbers)
                b = base + k
            out.append(b)
        return out


# ------------------------------------------------------------------------------------------- loaders
def _check_loader_args(block_size: object, limit: object, block_convention: object = "auto") -> None:
    """Refuse bad loader arguments up front (InvalidArgument, before the file is opened)."""
    if (
        isinstance(block_size, bool)
        or not isinstance(block_size, int)
        or not 1 <= block_size <= _MAX_BLOCK_SIZE
    ):
        raise InvalidArgument(f"block size must be an int in 1..{_MAX_BLOCK_SIZE}, got {block_size!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise InvalidArgument(f"limit must be None or an int >= 0, got {limit!r}")
    if block_convention not in BLOCK_CONVENTIONS:
        raise InvalidArgument(
            f"block_convention must be one of {', '.join(BLOCK_CONVENTIONS)}, got {block_convention!r}"
        )


def _parse_block_row(
    reader: _RowReader, line: int, row: dict[str, Any], block_size: int, block_convention: str = "auto"
) -> tuple[float, int, int, list[int], int]:
    """Validate one block-format row: (timestamp, input_length, output_length, hash_ids, tail_len)."""
    ts = reader.timestamp(row, line)
    input_length = reader.int_field(row, line, "input_length", 1)
    output_length = reader.int_field(row, line, "output_length", 0)
    if output_length > _MAX_OUTPUT_LEN:
        raise reader.error(line, "output_length", f"must be <= {_MAX_OUTPUT_LEN}, got {output_length}")
    hash_ids = reader.id_list(row, line, "hash_ids", non_empty=False, maximum=_MAX_BLOCK_ID)
    convention = reader.block_convention(line, input_length, len(hash_ids), block_size, block_convention)
    tail_len = input_length % block_size if convention == "floor" else 0
    return ts, input_length, output_length, hash_ids, tail_len


def iter_block_trace(
    path: str | Path,
    block_size: int = DEFAULT_BLOCK_SIZE,
    limit: int | None = None,
    block_convention: BlockConvention = "auto",
) -> Iterator[TraceRequest]:
    """Stream a block-format (Mooncake) trace, expanding one request at a time.

    ``block_convention``: ``ceil``, ``floor`` or ``auto`` (see the module docstring).
    Side effects: reads the file lazily. Complexity: O(input + output tokens) per request.
    Raises :class:`InvalidArgument` for a bad ``block_size`` / ``limit`` / ``block_convention`` (at the
    call), :class:`TraceFormatError` on the first bad row (rows before it have been yielded).
    """
    _check_loader_args(block_size, limit, block_convention)
    return _iter_block_trace(path, block_size, limit, block_convention)


def _iter_block_trace(
    path: str | Path, block_size: int, limit: int | None, block_convention: str
) -> Iterator[TraceRequest]:
    reader = _RowReader(path)
    index = 0
    for line, row in reader.rows():
        if limit is not None and index >= limit:
            return
        ts, input_length, output_length, hash_ids, tail_len = _parse_block_row(
            reader, line, row, block_size, block_convention
        )
        yield TraceRequest(
            index=index,
            timestamp_ms=ts,
            input_len=input_length,
            output_len=output_length,
            block_ids=reader.dense_block_ids(hash_ids, block_size),
            block_size=block_size,
            line=line,
            tail_len=tail_len,
        )
        index += 1
    if index == 0:
        raise _empty_trace(path)


def iter_token_trace(path: str | Path, limit: int | None = None) -> Iterator[TraceRequest]:
    """Stream a token-format trace. Same error rules as :func:`iter_block_trace`; token ids must be in
    ``0..2**63-1``. O(tokens) per row."""
    _check_loader_args(DEFAULT_BLOCK_SIZE, limit)
    return _iter_token_trace(path, limit)


def _iter_token_trace(path: str | Path, limit: int | None) -> Iterator[TraceRequest]:
    reader = _RowReader(path)
    index = 0
    for line, row in reader.rows():
        if limit is not None and index >= limit:
            return
        ts = reader.timestamp(row, line)
        input_ids = reader.id_list(row, line, "input_ids", non_empty=True, maximum=MAX_TOKEN_ID)
        output_ids = reader.id_list(row, line, "output_ids", non_empty=False, maximum=MAX_TOKEN_ID)
        yield TraceRequest.from_tokens(index, ts, input_ids, output_ids, row.get("session_id"), line)
        index += 1
    if index == 0:
        raise _empty_trace(path)


def detect_format(path: str | Path) -> TraceFormat:
    """``block`` if the first row has ``hash_ids``, ``token`` if it has ``input_ids``. Reads one row."""
    reader = _RowReader(path)
    for line, row in reader.rows():
        if "hash_ids" in row:
            return "block"
        if "input_ids" in row:
            return "token"
        raise TraceFormatError(
            str(path), line, None, "unknown row format: expected 'hash_ids' (block) or 'input_ids' (token)"
        )
    raise _empty_trace(path)


def _check_format(fmt: object) -> None:
    if fmt not in ("auto", "block", "token"):
        raise InvalidArgument(f"unknown trace format {fmt!r}; use block, token or auto")


def iter_trace(
    path: str | Path,
    fmt: TraceFormat | Literal["auto"] = "auto",
    block_size: int = DEFAULT_BLOCK_SIZE,
    limit: int | None = None,
    block_convention: BlockConvention = "auto",
) -> Iterator[TraceRequest]:
    """Stream any trace; ``auto`` detects the format from the first row. ``block_convention`` applies to
    block traces (see the module docstring)."""
    _check_format(fmt)
    _check_loader_args(block_size, limit, block_convention)
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt == "block":
        return iter_block_trace(path, block_size=block_size, limit=limit, block_convention=block_convention)
    return iter_token_trace(path, limit=limit)


@dataclass(frozen=True)
class TraceSummary:
    """Totals of a trace, from one cheap pass that does not expand blocks."""

    num_requests: int
    input_tokens: int
    output_tokens: int
    max_seq_len: int
    duration_ms: float


def scan_trace(
    path: str | Path,
    fmt: TraceFormat | Literal["auto"] = "auto",
    block_size: int = DEFAULT_BLOCK_SIZE,
    limit: int | None = None,
    block_convention: BlockConvention = "auto",
) -> TraceSummary:
    """Count requests and tokens and find the longest sequence (sizes the request table).

    Validates every row like the loaders do. Block format: O(rows), without expanding blocks.
    """
    _check_format(fmt)
    _check_loader_args(block_size, limit, block_convention)
    if fmt == "auto":
        fmt = detect_format(path)
    n = in_tok = out_tok = max_len = 0
    first_ts = last_ts = 0.0
    if fmt == "block":
        reader = _RowReader(path)
        for line, row in reader.rows():
            if limit is not None and n >= limit:
                break
            ts, il, ol, _, _ = _parse_block_row(reader, line, row, block_size, block_convention)
            first_ts = ts if n == 0 else first_ts
            last_ts = ts
            n, in_tok, out_tok, max_len = n + 1, in_tok + il, out_tok + ol, max(max_len, il + ol)
    else:
        for req in iter_trace(path, fmt, block_size, limit, block_convention):
            first_ts = req.timestamp_ms if n == 0 else first_ts
            last_ts = req.timestamp_ms
            n += 1
            in_tok += req.input_len
            out_tok += req.output_len
            max_len = max(max_len, req.input_len + req.output_len)
    if n == 0:
        raise _empty_trace(path)
    return TraceSummary(n, in_tok, out_tok, max_len, last_ts - first_ts)


def write_token_trace(requests: Sequence[TraceRequest] | Iterator[TraceRequest], path: str | Path) -> int:
    """Write requests as a token-format trace. Side effect: creates/overwrites ``path``. Returns the count.
    Raises :class:`~mamba_radix.errors.TraceFileError` if ``path`` cannot be opened for writing."""
    count = 0
    try:
        with open(path, "w", encoding="utf-8") as f:
            for req in requests:
                f.write(json.dumps(req.to_token_row(), separators=(",", ":")) + "\n")
                count += 1
    except TraceFormatError:  # from a streaming loader feeding ``requests``: its own error
        raise
    except OSError as exc:
        raise TraceFileError(str(path), f"cannot be written ({exc.strerror or exc})") from None
    return count
