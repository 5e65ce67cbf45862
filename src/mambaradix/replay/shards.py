"""Sweeps beyond one machine: a shard of the cell list, and merging the shards.

`--shard i/N` runs the cells at positions i-1, i-1+N, i-1+2N, ... of the sweep's ordered
cell list (`cells.build_cells`; interleaved, so that every shard gets a similar mix of
small and large memory sizes). Its JSON carries a header: the mambaradix version, a hash
of the trace's contents, a hash of the sweep's definition (model, every cell's full
config), the shard's index and count, and the keys of every cell of the whole sweep.
`merge` checks the headers agree, that each shard index 1..N is there once, and that the
rows cover every cell of the sweep exactly once; it refuses anything else with a
one-line `ShardError`. It needs nothing but the standard library; the merged data has
the shape of a single run's, in the single run's order.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from mambaradix import __version__
from mambaradix.geometry.profile import ModelProfile
from mambaradix.replay.cells import Cell, CellKey, row_key
from mambaradix.replay.results import ShardHeader
from mambaradix.replay.trace import Trace

T = TypeVar("T")


class ShardError(ValueError):
    """Shard files that cannot be merged (the message says why, on one line)."""


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    def __post_init__(self) -> None:
        if not 1 <= self.index <= self.count:
            raise ValueError(f"--shard must be i/N with 1 <= i <= N, got {self.index}/{self.count}")

    @classmethod
    def parse(cls, text: str) -> Shard:
        parts = text.split("/")
        if len(parts) != 2 or not all(p.strip().isdecimal() for p in parts):
            raise ValueError(f"--shard must be i/N with 1 <= i <= N, got {text!r}")
        return cls(int(parts[0]), int(parts[1]))

    def select(self, cells: list[T]) -> list[T]:
        return cells[self.index - 1 :: self.count]


def trace_hash(trace: Trace) -> str:
    """SHA-256 of what the replay reads from a trace (not its name or source)."""
    h = hashlib.sha256(struct.pack("<q", trace.unit_tokens))
    for r in trace.requests:
        head = f"{r.session_id!r}|{r.turn_id}|{r.ts!r}|{r.input_tokens}|{r.output_tokens}"
        h.update(head.encode())
        h.update(struct.pack("<qq", len(r.input_units), len(r.output_units)))
        h.update(r.input_units.tobytes())
        h.update(r.output_units.tobytes())
    return h.hexdigest()


def shard_header(
    trace: Trace, profile: ModelProfile, cells: list[Cell], shard: Shard
) -> ShardHeader:
    definition = {
        "model": asdict(profile),
        "cells": [
            [c.policy, asdict(c.cfg), c.router, None if c.cluster is None else asdict(c.cluster)]
            for c in cells
        ],
    }
    blob = json.dumps(definition, sort_keys=True, default=repr).encode()
    return ShardHeader(
        mambaradix_version=__version__,
        trace_hash=trace_hash(trace),
        sweep_hash=hashlib.sha256(blob).hexdigest(),
        shard={"index": shard.index, "count": shard.count},
        cells=[list(c.key) for c in cells],
    )


_SAME = ("mambaradix_version", "trace_hash", "sweep_hash")


def merge(parts: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Merge shard files (name, data). ShardError if they do not make one sweep."""
    if not parts:
        raise ShardError("no shard files given")
    for name, data in parts:
        if not isinstance(data, dict) or "shard" not in data or "cells" not in data:
            raise ShardError(f"{name} is not a shard file (write one with --shard i/N --json)")
        if problem := _damage(data):
            raise ShardError(f"{name} is not a shard file as --shard writes it: {problem}")
    first_name, first = parts[0]
    for name, data in parts[1:]:
        for field in (*_SAME, "cells"):
            if data.get(field) != first.get(field):
                what = field.replace("_", " ") if field != "cells" else "cell list"
                raise ShardError(f"{name} and {first_name} differ in {what}")
    _check_indices(parts)
    order = {tuple(k): i for i, k in enumerate(first["cells"])}
    rows = _rows_by_cell(parts, order)
    missing = [k for k in order if k not in rows]
    if missing:
        raise ShardError(f"{len(missing)} cell(s) missing, first {_cell_name(missing[0])}")
    merged = {k: v for k, v in first.items() if k not in ("shard", "cells", "elapsed_s")}
    merged["results"] = [rows[k] for k in sorted(rows, key=order.__getitem__)]
    merged["merged_shards"] = first["shard"]["count"]
    return merged


def _damage(data: dict[str, Any]) -> str | None:
    """What is wrong with the fields `merge` and the table read, if anything."""
    shard = data["shard"]
    counts = [shard.get(k) for k in ("index", "count")] if isinstance(shard, dict) else []
    if len(counts) != 2 or not all(type(x) is int for x in counts):
        return "'shard' must hold an integer index and count"
    if not all(isinstance(data.get(k), dict) for k in ("trace", "model", "bound")):
        return "'trace', 'model' and 'bound' must be objects"
    if not isinstance(data["cells"], list) or not isinstance(data.get("results"), list):
        return "'cells' and 'results' must be lists"
    if not all(isinstance(c, list) and len(c) == 4 for c in data["cells"]):
        return "each of 'cells' must be a [policy, memory, fraction, router] list"
    for i, row in enumerate(data["results"]):
        if not isinstance(row, dict) or not isinstance(row.get("config"), dict):
            return f"results[{i}] must be an object with a 'config' object"
        try:
            policy, memory, fraction, _ = row_key(row)
        except KeyError as e:
            return f"results[{i}] has no {e}"
        if not isinstance(policy, str) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in (memory, fraction)
        ):
            return f"results[{i}] needs a policy name and numbers for its memory and fraction"
    return None


def _check_indices(parts: list[tuple[str, dict[str, Any]]]) -> None:
    count = parts[0][1]["shard"]["count"]
    seen: dict[int, str] = {}
    for name, data in parts:
        index = data["shard"]["index"]
        if data["shard"]["count"] != count:
            raise ShardError(f"{name} is a shard of {data['shard']['count']}, not of {count}")
        if index in seen:
            raise ShardError(f"shard {index}/{count} given twice ({seen[index]}, {name})")
        seen[index] = name
    absent = sorted(set(range(1, count + 1)) - set(seen))
    if absent:
        raise ShardError(f"shard {absent[0]}/{count} missing ({len(absent)} of {count} absent)")


def _rows_by_cell(
    parts: list[tuple[str, dict[str, Any]]], order: dict[tuple[Any, ...], int]
) -> dict[tuple[Any, ...], dict[str, Any]]:
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for name, data in parts:
        for row in data.get("results", []):
            key = row_key(row)
            if key not in order:
                raise ShardError(f"{name} holds {_cell_name(key)}, not a cell of this sweep")
            if key in rows:
                raise ShardError(f"{_cell_name(key)} appears twice (again in {name})")
            rows[key] = row
    return rows


def _cell_name(key: CellKey | tuple[Any, ...]) -> str:
    policy, memory, fraction, router = key
    where = f" router {router}" if router is not None else ""
    return f"cell (policy {policy}, {memory:g} GB, state fraction {fraction:.3g}{where})"
