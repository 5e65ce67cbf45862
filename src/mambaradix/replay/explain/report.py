"""`explain`'s outputs: the aggregate table, the JSON and the per-request lines."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from mambaradix.geometry.profile import ModelProfile
from mambaradix.replay.explain.attribute import CATEGORIES
from mambaradix.replay.explain.records import Explanation, Room
from mambaradix.replay.results import ModelInfo, TraceInfo
from mambaradix.replay.trace import Trace
from mambaradix.results import JsonResult, omitted


@dataclass(frozen=True, eq=False)
class ExplainBound(JsonResult):
    """The bound (unlimited memory, a state everywhere): its rate and tokens."""

    token_hit_rate: float
    tokens: int


@dataclass(frozen=True, eq=False)
class ExplainResult(JsonResult):
    """`explain`'s summary: the trace, the model, the bound, the categories and each
    run's aggregate (`Explanation.to_json`; the per-request records are
    `Explanation.requests_json`). `policies_left_out`, `elapsed_s`: set by the command
    line. Attribute access is the typed way to read it; it is also the read-only mapping
    over its JSON keys (`mambaradix.results`)."""

    trace: TraceInfo
    model: ModelInfo
    bound: ExplainBound
    categories: list[str]
    results: list[Explanation]
    policies_left_out: dict[str, str] | None = omitted()
    elapsed_s: float | None = omitted()


def data(
    trace: Trace, profile: ModelProfile, bound_tokens: int, runs: Sequence[Explanation]
) -> ExplainResult:
    """Everything but the per-request records."""
    prompt = trace.prompt_tokens
    return ExplainResult(
        trace=TraceInfo(trace.name, len(trace), prompt, trace.unit_tokens, trace.source),
        model=ModelInfo(profile.name, profile.kv_bytes_per_token, profile.state_bytes),
        bound=ExplainBound(bound_tokens / max(1, prompt), bound_tokens),
        categories=list(CATEGORIES),
        results=list(runs),
    )


def table(summary: Mapping[str, Any]) -> str:
    """One block per run: hit and gap, then the categories that hold tokens,
    with their share of the gap."""
    t, b = summary["trace"], summary["bound"]
    lines = [
        f"trace {t['name']}: {t['requests']:,} requests, {t['prompt_tokens']:,} prompt tokens; "
        f"model {summary['model']['name']}; bound (unlimited memory, a state everywhere): "
        f"{b['token_hit_rate']:.1%} ({b['tokens']:,} tokens)"
    ]
    fractions = len({r["state_fraction"] for r in summary["results"]}) > 1
    for r in summary["results"]:
        lines += ["", _heading(r, fractions)]
        gap = r["gap_tokens"]
        for name in CATEGORIES:
            tokens = r["categories"][name]
            if tokens:
                share = r["share_of_gap"][name]
                lines.append(f"  {name.replace('_', ' '):<20}{tokens:>14,} {share:>7.1%}")
        if not gap:
            lines.append("  no gap: every request hit its bound")
        if r["evicted"] is not None:
            lines += _evicted(r["evicted"])
        if r["tiers"] is not None:
            lines.append(_tiers(r["tiers"]))
    return "\n".join(lines)


def _heading(r: dict[str, Any], fractions: bool) -> str:
    where = f"{r['memory_gb']:g} GB"
    if fractions:
        where += f" (states {r['state_fraction']:.0%})"
    if r["instances"] > 1:
        where += f" x{r['instances']} {r['router']}"
    cfg = r["config"]
    for tier in ("host", "store"):
        if cfg[f"{tier}_gb"]:
            where += f" + {tier} {cfg[f'{tier}_gb']:g} GB"
    prompt = max(1, r["prompt_tokens"])
    return (
        f"{where} {r['policy']}: hit {r['hit_tokens'] / prompt:.1%} of prompt tokens"
        f"{_loaded(r, prompt)}; "
        f"gap to the bound {r['gap_tokens']:,} tokens ({r['gap_tokens'] / prompt:.1%})"
    )


def _loaded(r: dict[str, Any], prompt: int) -> str:
    """The hit's share loaded from the lower tiers, when any was."""
    host, store = r["host_hit_tokens"], r["store_hit_tokens"]
    if not host and not store:
        return ""
    return f" (loaded: {host / prompt:.1%} from host, {store / prompt:.1%} from store)"


def _evicted(evicted: dict[str, dict[str, int]]) -> list[str]:
    """Where the run's evictions made room, if any did."""
    out = []
    for why, e in evicted.items():
        kv, states = f"{e['kv_tokens']:,} KV tokens", f"{e['states']:,} states"
        if why == Room.KV and e["kv_tokens"]:
            out.append(f"  evicted for KV room: {kv} (and {states} with them)")
        elif why == Room.STATES and e["states"]:
            out.append(f"  evicted for state room: {states} (and {kv} with them)")
        elif why == Room.BOTH and (e["kv_tokens"] or e["states"]):
            out.append(f"  evicted for room in the shared budget: {kv}, {states}")
    return out


def _tiers(t: dict[str, int]) -> str:
    """What the lower tiers did."""
    return (
        f"  lower tiers: {t['host_loads']:,} loads from host, {t['store_loads']:,} from store; "
        f"{t['loads_recomputed']:,} recomputed instead, {t['loads_failed']:,} failed (device "
        f"memory); {t['dropped_bytes'] / 1e9:,.1f} GB fell out of the last tier"
    )


def write_lines(runs: Iterable[Explanation], out: IO[str]) -> None:
    """One JSON object per request and run (`Explanation.requests_json`)."""
    for e in runs:
        for record in e.requests_json():
            out.write(json.dumps(record))
            out.write("\n")
