"""Mooncake-format block traces (Kimi / Moonshot AI, FAST'25 release).

One JSON object per line::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52,
     "hash_ids": [46, 47, ..., 2354]}

`timestamp` is the arrival time in ms, the lengths are token counts and
`hash_ids` are prefix-block hashes of 512 tokens (equal id = equal prefix up to
that block; the last block is usually partial). The trace becomes a block-level
`Trace` (`unit_tokens=512`):

* input units are the hash ids themselves;
* output units are fresh negative ids, `ceil(output_length / 512)` per request,
  unique across the trace and below every input id, so an answer never matches
  any cached block (the data says nothing about what answers share);
* the format has no session ids; `load_mooncake` infers them (`sessions`):
  request j is the next turn of the latest earlier request i whose prompt,
  but for its last (partial) block, is a prefix of j's prompt, provided that
  prefix holds a block first seen in i (so j carries on i's own conversation,
  not a system prompt many requests share), and i has no next turn yet.
  `session_id` is the index of the session's first request, `turn_id` counts
  from 0. On the bundled conversation trace this finds 3,305 next turns; the
  smallest gap between a turn and the next is 6 s, the median 126 s, and the
  median next prompt is 28 tokens longer than the previous prompt plus its
  answer (the user's new message). With `sessions=False` every request is
  its own session (`session_id` = request index, `turn_id` = 0).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from ..progress import track
from ..trace import Trace, TraceRequest
from ._io import Fields, PathLike, TraceFormatError, data_file, json_lines

BLOCK_TOKENS = 512
# Output ids are made, one per unit, when the trace loads: a typo such as 1e18 would
# take all memory. 2**24 units (8.6 billion tokens in 512-token blocks) is far beyond
# any answer and still only 134 MB of ids.
MAX_OUTPUT_UNITS = 1 << 24
BUNDLED_FILE = ("mooncake", "conversation_trace.jsonl.gz")
BUNDLED_SOURCE = (
    "Mooncake FAST'25 conversation_trace.jsonl (kvcache-ai/Mooncake@3b5a594, "
    "FAST25-release/traces/; Apache-2.0; Qin et al., FAST'25)"
)


class _Row(NamedTuple):
    ts: float
    input_length: int
    output_length: int
    hash_ids: array[int]


def _parse_row(path: PathLike, line: int, obj: dict[str, object], block: int, check: bool) -> _Row:
    f = Fields(path, line, obj)
    row = _Row(
        f.number("timestamp") / 1000.0,
        f.integer("input_length", minimum=1),
        f.integer("output_length", maximum=MAX_OUTPUT_UNITS * block),
        f.int_array("hash_ids", nonempty=True),
    )
    n = len(row.hash_ids)
    if check and not (n - 1) * block < row.input_length <= n * block:
        raise TraceFormatError(
            path,
            line,
            f"{n} hash_ids do not cover input_length={row.input_length} "
            f"in blocks of {block} tokens (expected ceil(input_length/{block}) ids)",
        )
    return row


def load_mooncake(
    path: PathLike,
    *,
    name: str | None = None,
    block_tokens: int = BLOCK_TOKENS,
    check_lengths: bool = True,
    limit: int | None = None,
    source: str | None = None,
    sessions: bool = True,
) -> Trace:
    """Load a Mooncake-format JSONL file (optionally `.gz`) as a block-level Trace.

    `check_lengths` requires `len(hash_ids) == ceil(input_length / block_tokens)`
    on every line; `limit` keeps only the first `limit` requests; `sessions`
    infers each request's session and turn (module docstring). Raises
    TraceFormatError (a ValueError) naming the line of a malformed record.
    """
    if block_tokens < 1:
        raise ValueError("block_tokens must be >= 1")
    rows: list[_Row] = []
    lines: list[int] = []
    for line, obj in track(json_lines(path), f"loading {Path(path).name}", unit=" lines"):
        if limit is not None and len(rows) >= limit:
            break
        rows.append(_parse_row(path, line, obj, block_tokens, check_lengths))
        lines.append(line)
    if not rows:
        raise TraceFormatError(path, 1, "file has no records")
    next_out = _first_output_id(path, rows, lines, block_tokens)
    turns = infer_sessions([r.hash_ids for r in rows]) if sessions else None
    requests = []
    for i, r in enumerate(rows):
        n_out = -(-r.output_length // block_tokens)
        out = array("q", range(next_out, next_out - n_out, -1))
        next_out -= n_out
        sid, turn = turns[i] if turns is not None else (i, 0)
        requests.append(
            TraceRequest(sid, turn, r.ts, r.hash_ids, out, r.input_length, r.output_length)
        )
    return Trace(
        name=name or Path(path).name.removesuffix(".gz").removesuffix(".jsonl"),
        requests=requests,
        unit_tokens=block_tokens,
        source=source or f"Mooncake-format JSONL {path}",
        meta={"format": "mooncake", "path": str(path), "block_tokens": block_tokens},
    )


def infer_sessions(prompts: Sequence[array[int]]) -> list[tuple[int, int]]:
    """(session id, turn id) of each prompt, in order (see the module docstring)."""
    seen: set[int] = set()
    ends: dict[int, int] = {}  # last block of a prompt's full blocks -> latest such prompt
    taken: set[int] = set()  # prompts that have their next turn
    out: list[tuple[int, int]] = []
    for j, h in enumerate(prompts):
        i = _previous_turn(prompts, ends, taken, h)
        out.append((j, 0) if i < 0 else (out[i][0], out[i][1] + 1))
        taken.add(i)
        full = len(h) - 1
        if full and any(b not in seen for b in h[:full]):
            ends[h[full - 1]] = j
        seen.update(h)
    return out


def _previous_turn(
    prompts: Sequence[array[int]], ends: dict[int, int], taken: set[int], h: array[int]
) -> int:
    """The longest-prefix, latest earlier prompt whose full blocks are a prefix
    of `h` and that has no next turn yet; -1 if none."""
    for length in range(len(h) - 1, 0, -1):
        i = ends.get(h[length - 1], -1)
        same = i >= 0 and len(prompts[i]) - 1 == length and prompts[i][:length] == h[:length]
        if same and i not in taken:
            return i
    return -1


def _first_output_id(path: PathLike, rows: list[_Row], lines: list[int], block: int) -> int:
    """The first of the fresh output ids, counting down below every input id;
    TraceFormatError naming the lowest id's line when they would leave 64 bits."""
    lowest = min(range(len(rows)), key=lambda i: min(rows[i].hash_ids))
    first = min(-1, min(rows[lowest].hash_ids) - 1)
    outputs = sum(-(-r.output_length // block) for r in rows)
    if first - outputs + 1 < -(2**63):
        raise TraceFormatError(
            path,
            lines[lowest],
            f"hash id {min(rows[lowest].hash_ids)} leaves no room below it for the trace's "
            f"{outputs} fresh output block ids (64-bit)",
        )
    return first


def load_bundled_mooncake(limit: int | None = None) -> Trace:
    """The bundled Mooncake `conversation_trace.jsonl` (12,031 requests, about 1 h)."""
    return load_mooncake(
        data_file(*BUNDLED_FILE), name="mooncake", limit=limit, source=BUNDLED_SOURCE
    )
