"""The neutral token-level trace format, and format detection for trace files.

Schema ``mambaradix-trace`` version 2 (docs/models-and-traces.md). An optional
first line names the schema and may carry the trace's source and license::

    {"schema": "mambaradix-trace", "version": 2, "source": "...", "license": "..."}

then one request per line (the Marconi trace layout)::

    {"session_id": 0, "turn_id": 0, "ts": 0.0,
     "input_tokens": [1, 3, 1763, ...], "output_tokens": [1228, 2]}

`session_id` is an integer or a string, `turn_id` counts a session's turns,
`ts` is the arrival time in seconds, and the token lists are token ids (any
tokenizer: equal prefixes must be equal ids): one unit per token
(`unit_tokens=1`). Version 2 adds two optional fields (null reads as absent): ``think_s``, the
seconds between the previous turn's answer and this turn's arrival, and
``duration_s``, the seconds from this request's arrival to its last output
token as recorded (the next turn's think time is then its arrival gap minus
this). A file without the header line is version 1: the same records without
the optional fields, read as before. Files ending in `.gz` are read and
written gzip-compressed.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Literal

from ..progress import track
from ..sessions import previous_turns
from ..trace import Trace, TraceRequest
from ._io import Fields, PathLike, TraceFormatError, first_record, json_lines, open_text
from .mooncake import load_mooncake

Format = Literal["mooncake", "neutral"]
_MOONCAKE_KEYS = frozenset({"hash_ids", "input_length"})
SCHEMA = "mambaradix-trace"
VERSION = 2
"""The newest schema version this reader knows (a file without a header is version 1)."""


def read_header(path: PathLike, line: int, obj: dict[str, object]) -> dict[str, object]:
    """A header line's fields; TraceFormatError naming the line for another
    schema or a version this reader does not know."""
    if obj.get("schema") != SCHEMA:
        raise TraceFormatError(path, line, f"'schema' must be {SCHEMA!r}, got {obj['schema']!r}")
    version = Fields(path, line, obj).integer("version", minimum=1)
    if version > VERSION:
        raise TraceFormatError(
            path, line, f"'version' {version} is newer than this mambaradix reads ({VERSION})"
        )
    for key in ("source", "license"):
        if not isinstance(obj.get(key, ""), str):
            raise TraceFormatError(path, line, f"{key!r} must be a string, got {obj[key]!r}")
    return obj


def parse_record(f: Fields) -> tuple[TraceRequest, float | None]:
    """One neutral record, and its recorded duration (None when it has none)."""
    inp = f.int_array("input_tokens", nonempty=True)
    out = f.int_array("output_tokens", nonempty=False)
    think = f.number("think_s") if f.obj.get("think_s") is not None else None  # null: absent
    duration = f.number("duration_s") if f.obj.get("duration_s") is not None else None
    req = TraceRequest(
        f.session("session_id"),
        f.integer("turn_id"),
        f.number("ts"),
        inp,
        out,
        len(inp),
        len(out),
        think,
    )
    return req, duration


def load_jsonl(path: PathLike, *, name: str | None = None) -> Trace:
    """Load a neutral-format JSONL file as a token-level Trace.

    Raises TraceFormatError (a ValueError) naming the line of a malformed record.
    """
    rows: list[tuple[TraceRequest, float | None]] = []
    header: dict[str, object] = {}
    for line, obj in track(json_lines(path), f"loading {Path(path).name}", unit=" lines"):
        if not rows and not header and "schema" in obj:
            header = read_header(path, line, obj)
            continue
        rows.append(parse_record(Fields(path, line, obj)))
    if not rows:
        raise TraceFormatError(path, 1, "file has no records")
    rows.sort(key=lambda row: row[0].ts)  # the order Trace keeps
    trace = Trace(
        name=name or Path(path).name.removesuffix(".gz").removesuffix(".jsonl"),
        requests=[r for r, _ in rows],
        unit_tokens=1,
        source=str(header.get("source") or f"neutral JSONL {path}"),
        meta={"format": "neutral", "path": str(path), "version": header.get("version", 1)},
    )
    _thinks_from_durations(trace, [d for _, d in rows])
    return trace


def _thinks_from_durations(trace: Trace, durations: list[float | None]) -> None:
    """A turn without ``think_s`` whose previous turn has ``duration_s``: its
    think time is its arrival gap minus that duration (at least 0)."""
    reqs = trace.requests
    for j, i in enumerate(previous_turns(trace)):
        took = durations[i] if i >= 0 else None
        if took is not None and reqs[j].think_s is None:
            reqs[j] = replace(reqs[j], think_s=max(0.0, reqs[j].ts - reqs[i].ts - took))


def save_jsonl(trace: Trace, path: PathLike) -> None:
    """Write a token-level trace (`unit_tokens == 1`) in the neutral format
    (version 2: a header line with its source; ``think_s`` where recorded).

    Block traces (Mooncake) cannot be written: the format has no block size and
    their token counts differ from their unit counts.
    """
    if trace.unit_tokens != 1:
        raise ValueError(
            f"save_jsonl writes token-level traces only; {trace.name!r} has "
            f"unit_tokens={trace.unit_tokens}"
        )
    with open_text(path, "wt") as f:
        header = {"schema": SCHEMA, "version": VERSION, "source": trace.source}
        f.write(json.dumps(header) + "\n")
        for r in trace.requests:
            if r.input_tokens != len(r.input_units) or r.output_tokens != len(r.output_units):
                raise ValueError(
                    f"request {r.session_id}/{r.turn_id}: token counts differ from its "
                    "token lists, which the neutral format cannot express"
                )
            rec: dict[str, object] = {
                "session_id": r.session_id,
                "turn_id": r.turn_id,
                "ts": r.ts,
                "input_tokens": r.input_units.tolist(),
                "output_tokens": r.output_units.tolist(),
            }
            if r.think_s is not None:
                rec["think_s"] = r.think_s
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")


def detect_format(path: PathLike) -> Format:
    """Tell a Mooncake file from a neutral one by the fields of its first record.

    `hash_ids` / `input_length` mean Mooncake; an `input_tokens` list means
    neutral. Anything else raises TraceFormatError naming the first line.
    """
    line, obj = first_record(path)
    if _MOONCAKE_KEYS & obj.keys():
        return "mooncake"
    if isinstance(obj.get("input_tokens"), list) or "schema" in obj:
        return "neutral"
    raise TraceFormatError(
        path,
        line,
        "unknown trace format: expected Mooncake fields (hash_ids, input_length, "
        "output_length, timestamp) or neutral fields (session_id, turn_id, ts, "
        f"input_tokens list, output_tokens list); found {sorted(obj)}",
    )


def load_trace(path: PathLike, *, name: str | None = None) -> Trace:
    """Load a JSONL trace in either format (see `detect_format`)."""
    if detect_format(path) == "mooncake":
        return load_mooncake(path, name=name)
    return load_jsonl(path, name=name)
