"""The neutral token-level trace format, and format detection for trace files.

One request per line (the Marconi trace layout)::

    {"session_id": 0, "turn_id": 0, "ts": 0.0,
     "input_tokens": [1, 3, 1763, ...], "output_tokens": [1228, 2]}

`session_id` is an integer or a string, `ts` the arrival time in seconds, and
the token lists are token ids: one unit per token (`unit_tokens=1`). Files
ending in `.gz` are read and written gzip-compressed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from ..progress import track
from ..trace import Trace, TraceRequest
from ._io import Fields, PathLike, TraceFormatError, first_record, json_lines, open_text
from .mooncake import load_mooncake

Format = Literal["mooncake", "neutral"]
_MOONCAKE_KEYS = frozenset({"hash_ids", "input_length"})


def load_jsonl(path: PathLike, *, name: str | None = None) -> Trace:
    """Load a neutral-format JSONL file as a token-level Trace.

    Raises TraceFormatError (a ValueError) naming the line of a malformed record.
    """
    requests = []
    for line, obj in track(json_lines(path), f"loading {Path(path).name}", unit=" lines"):
        f = Fields(path, line, obj)
        inp = f.int_array("input_tokens", nonempty=True)
        out = f.int_array("output_tokens", nonempty=False)
        requests.append(
            TraceRequest(
                f.session("session_id"),
                f.integer("turn_id"),
                f.number("ts"),
                inp,
                out,
                len(inp),
                len(out),
            )
        )
    if not requests:
        raise TraceFormatError(path, 1, "file has no records")
    return Trace(
        name=name or Path(path).name.removesuffix(".gz").removesuffix(".jsonl"),
        requests=requests,
        unit_tokens=1,
        source=f"neutral JSONL {path}",
        meta={"format": "neutral", "path": str(path)},
    )


def save_jsonl(trace: Trace, path: PathLike) -> None:
    """Write a token-level trace (`unit_tokens == 1`) in the neutral format.

    Block traces (Mooncake) cannot be written: the format has no block size and
    their token counts differ from their unit counts.
    """
    if trace.unit_tokens != 1:
        raise ValueError(
            f"save_jsonl writes token-level traces only; {trace.name!r} has "
            f"unit_tokens={trace.unit_tokens}"
        )
    with open_text(path, "wt") as f:
        for r in trace.requests:
            if r.input_tokens != len(r.input_units) or r.output_tokens != len(r.output_units):
                raise ValueError(
                    f"request {r.session_id}/{r.turn_id}: token counts differ from its "
                    "token lists, which the neutral format cannot express"
                )
            rec = {
                "session_id": r.session_id,
                "turn_id": r.turn_id,
                "ts": r.ts,
                "input_tokens": r.input_units.tolist(),
                "output_tokens": r.output_units.tolist(),
            }
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")


def detect_format(path: PathLike) -> Format:
    """Tell a Mooncake file from a neutral one by the fields of its first record.

    `hash_ids` / `input_length` mean Mooncake; an `input_tokens` list means
    neutral. Anything else raises TraceFormatError naming the first line.
    """
    line, obj = first_record(path)
    if _MOONCAKE_KEYS & obj.keys():
        return "mooncake"
    if isinstance(obj.get("input_tokens"), list):
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
