"""A trace file checked and summarised (`mambaradix trace check`).

`check_file` loads the file with its format's loader (every malformed record
is a TraceFormatError naming the line and the field) and, for the neutral
format, checks what closed-loop replay relies on: no (session, turn) twice,
and no turn earlier in time than its session's previous turn. `summarize`
describes a loaded trace: requests, sessions and turns, prompt and output
lengths, recorded think times, how many later turns extend their previous
prompt and answer (what a prefix cache can reuse), and the ideal bound.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mambaradix.results import JsonResult, flat

from ..bound import bound_hit_tokens
from ..sessions import previous_turns
from ..trace import Trace, TraceRequest
from ._io import Fields, PathLike, TraceFormatError, json_lines
from .jsonl import detect_format, load_trace

__all__ = ["TraceSummary", "check_file", "describe", "summarize"]


def check_file(path: PathLike) -> Trace:
    """The trace in `path`, checked (see the module docstring)."""
    trace = load_trace(path)
    if detect_format(path) == "neutral":
        _check_sessions(path)
    return trace


def _check_sessions(path: PathLike) -> None:
    seen: dict[tuple[int | str, int], tuple[int, float]] = {}
    for line, obj in json_lines(path):
        if "schema" in obj and not seen:
            continue
        f = Fields(path, line, obj)
        key = (f.session("session_id"), f.integer("turn_id"))
        if key in seen:
            raise TraceFormatError(
                path, line, f"session {key[0]!r} turn {key[1]} repeats line {seen[key][0]}"
            )
        seen[key] = (line, f.number("ts"))
    by_session: dict[int | str, list[tuple[int, int, float]]] = {}
    for (sid, turn), (line, ts) in seen.items():
        by_session.setdefault(sid, []).append((turn, line, ts))
    for sid, turns in by_session.items():
        turns.sort()
        for (_, before, t0), (turn, line, t1) in zip(turns, turns[1:], strict=False):
            if t1 < t0:
                raise TraceFormatError(
                    path,
                    line,
                    f"'ts' {t1:g} of session {sid!r} turn {turn} is earlier than its "
                    f"previous turn's {t0:g} (line {before})",
                )


@dataclass(frozen=True, eq=False)
class Spread(JsonResult):
    """Per request: min, median, mean, p95 and max."""

    min: float
    p50: float
    mean: float
    p95: float
    max: float


def _spread(values: list[int] | list[float]) -> Spread | None:
    ordered = sorted(values)
    if not ordered:
        return None
    return Spread(
        min=ordered[0],
        p50=statistics.median(ordered),
        mean=statistics.fmean(ordered),
        p95=ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
        max=ordered[-1],
    )


@dataclass(frozen=True, eq=False)
class Tokens(JsonResult):
    """A token count over the trace, and its spread per request (absent: none)."""

    total: int
    spread: Spread | None = flat()


@dataclass(frozen=True, eq=False)
class ThinkTimes(JsonResult):
    """How many later turns record a think time, and their spread (absent: none)."""

    recorded: int
    spread: Spread | None = flat()


@dataclass(frozen=True, eq=False)
class TurnsPerSession(JsonResult):
    mean: float
    max: int


@dataclass(frozen=True, eq=False)
class TraceBound(JsonResult):
    """The ideal bound: hit tokens with unlimited memory and a state everywhere."""

    hit_tokens: int
    token_hit_rate: float


@dataclass(frozen=True, eq=False)
class TraceSummary(JsonResult):
    """`summarize`'s figures (the module docstring). Attribute access is the typed way
    to read them; it is also the read-only mapping over its JSON keys
    (`mambaradix.results`), as `mambaradix trace check --json` writes it."""

    name: str
    path: str | None
    format: object
    version: object
    unit_tokens: int
    requests: int
    sessions: int
    later_turns: int
    turns_per_session: TurnsPerSession
    span_s: float
    prompt_tokens: Tokens
    output_tokens: Tokens
    think_s: ThinkTimes
    extending_turns: int
    bound: TraceBound
    source: str


def _extends(prev: TraceRequest, r: TraceRequest, unit: int) -> bool:
    """`r`'s prompt starts with `prev`'s prompt and answer (token traces), or
    with `prev`'s full prompt blocks (block traces, whose answers have no ids)."""
    if unit > 1:
        full = len(prev.input_units) - 1
        return r.input_units[:full] == prev.input_units[:full]
    history = prev.input_units + prev.output_units
    return r.input_units[: len(history)] == history


def summarize(trace: Trace, path: PathLike | None = None) -> TraceSummary:
    """The trace's figures, JSON-ready (see the module docstring)."""
    reqs = trace.requests
    prev = previous_turns(trace)
    later = [(reqs[i], r) for r, i in zip(reqs, prev, strict=True) if i >= 0]
    per_session: dict[int | str, int] = {}
    for r in reqs:
        per_session[r.session_id] = per_session.get(r.session_id, 0) + 1
    thinks = [r.think_s for _, r in later if r.think_s is not None]
    hits = bound_hit_tokens(trace)
    prompt = trace.prompt_tokens
    return TraceSummary(
        name=trace.name,
        path=str(path) if path is not None else None,
        format=trace.meta.get("format"),
        version=trace.meta.get("version"),
        unit_tokens=trace.unit_tokens,
        requests=len(reqs),
        sessions=len(per_session),
        later_turns=len(later),
        turns_per_session=TurnsPerSession(len(reqs) / len(per_session), max(per_session.values())),
        span_s=reqs[-1].ts - reqs[0].ts,
        prompt_tokens=Tokens(prompt, _spread([r.input_tokens for r in reqs])),
        output_tokens=Tokens(
            sum(r.output_tokens for r in reqs), _spread([r.output_tokens for r in reqs])
        ),
        think_s=ThinkTimes(len(thinks), _spread(thinks)),
        extending_turns=sum(_extends(p, r, trace.unit_tokens) for p, r in later),
        bound=TraceBound(sum(hits), sum(hits) / max(1, prompt)),
        source=trace.source,
    )


def describe(summary: Mapping[str, Any]) -> str:
    """The summary as the lines `mambaradix trace check` prints."""
    s = summary
    kind = "token ids" if s["unit_tokens"] == 1 else f"{s['unit_tokens']}-token block hashes"
    schema = f"neutral JSONL, version {s['version']}" if s["format"] == "neutral" else "Mooncake"
    p, o, th = s["prompt_tokens"], s["output_tokens"], s["think_s"]
    lines = [
        f"trace {s['name']}: {schema}, {kind}",
        f"  requests {s['requests']:,} in {s['sessions']:,} sessions (turns per session: mean "
        f"{s['turns_per_session']['mean']:.2f}, max {s['turns_per_session']['max']}), "
        f"over {s['span_s']:,.1f} s",
        f"  prompt tokens {p['total']:,}: per request min {p['min']:,}, median {p['p50']:,.0f}, "
        f"mean {p['mean']:,.0f}, p95 {p['p95']:,}, max {p['max']:,}",
        f"  output tokens {o['total']:,}: per request min {o['min']:,}, median {o['p50']:,.0f}, "
        f"mean {o['mean']:,.0f}, p95 {o['p95']:,}, max {o['max']:,}",
    ]
    if s["later_turns"]:
        recorded = f"{th['recorded']:,} of {s['later_turns']:,} later turns record a think time"
        if th["recorded"]:
            recorded += f" (median {th['p50']:.1f} s, max {th['max']:.1f} s)"
        if th["recorded"] < s["later_turns"]:
            recorded += "; the others think for their arrival gap"
        lines.append(f"  {recorded}")
        lines.append(
            f"  {s['extending_turns']:,} of {s['later_turns']:,} later turns extend their "
            "previous turn's prompt"
            + (" and answer" if s["unit_tokens"] == 1 else " (full blocks)")
        )
    b = s["bound"]
    lines.append(
        f"  bound (unlimited memory, a state everywhere): {b['token_hit_rate']:.1%} of prompt "
        f"tokens ({b['hit_tokens']:,})"
    )
    return "\n".join(lines)
