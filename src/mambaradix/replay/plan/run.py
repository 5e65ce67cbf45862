"""`plan`: from a trace, a model and a goal, the device memory to buy, the state share
and the policy; the Pareto frontier; SGLang's and vLLM's default sizing at that memory."""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from mambaradix.replay.bound import bound_hit_tokens
from mambaradix.replay.checks import check_inputs, check_paged, check_policies, check_reals
from mambaradix.replay.models import ModelProfile
from mambaradix.replay.plan.frontier import pareto, recommend
from mambaradix.replay.plan.search import Evaluator, bisect_rounds, grid_points_of
from mambaradix.replay.plan.space import (
    Footprint,
    Setting,
    footprint,
    least_gb,
    settings,
    top_gb,
)
from mambaradix.replay.plan.targets import Goal, ttft_key
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.trace import Trace
from mambaradix.validate import as_positive, as_real, as_type

__all__ = ["DEFAULT_FRACTIONS", "DEFAULT_POLICIES", "DEFAULTS", "Prepared", "plan", "prepare"]

SGLANG_FRACTION = 0.9 / 1.9  # SGLang's --mamba-full-memory-ratio 0.9 (ServingConfig's)
DEFAULT_POLICIES = ["sglang-extra-buffer", "vllm", "mambaradix"]
DEFAULT_FRACTIONS = [0.25, SGLANG_FRACTION, 0.75]
DEFAULTS = {  # what each engine runs when its memory options are left alone
    "sglang": Setting("sglang-extra-buffer", SGLANG_FRACTION),
    "vllm": Setting("vllm", None),
}


class Prepared(NamedTuple):
    """What the search needs, every input checked."""

    trace: Trace
    profile: ModelProfile
    goal: Goal
    base: ServingConfig
    policies: list[str]
    fractions: list[float]
    bound: float
    footprint: Footprint
    ranges: dict[Setting, tuple[float, float]]
    memories: list[float] | None


def prepare(
    trace: Trace,
    profile: ModelProfile,
    goal: Goal,
    base: ServingConfig,
    policies: list[str] | None = None,
    state_fractions: list[float] | None = None,
    memories: list[float] | None = None,
) -> Prepared:
    """Every check `plan` makes before a replay (TypeError / ValueError naming the
    parameter; a hit-rate target above the bound names the bound), the bound and
    each setting's memory range. `memories` replaces the derived ranges."""
    check_inputs(trace, profile, base)
    as_type(goal, Goal, "goal")
    names = check_policies(DEFAULT_POLICIES if policies is None else policies)
    check_paged(names, trace, base, "policies")
    fractions = check_reals(state_fractions or DEFAULT_FRACTIONS, "state_fractions", low=0, high=1)
    if memories is not None:
        memories = sorted(check_reals(memories, "memories", low=0))
    hits = bound_hit_tokens(trace)
    bound = sum(hits) / max(1, trace.prompt_tokens)
    goal.check_bound(bound)
    fp = footprint(trace, hits)
    ranges = {}
    for s in settings(names, fractions, base.sequential):
        lo = least_gb(trace, profile, base, s)
        top = max(lo, top_gb(fp, trace, profile, base, s, lo))
        ranges[s] = (lo, top) if memories is None else (lo, max(memories))
    _check_budget(goal, ranges)
    return Prepared(trace, profile, goal, base, names, fractions, bound, fp, ranges, memories)


def plan(
    trace: Trace,
    profile: ModelProfile,
    goal: Goal,
    base: ServingConfig,
    policies: list[str] | None = None,
    state_fractions: list[float] | None = None,
    grid_points: int = 3,
    resolution: float = 0.1,
    memories: list[float] | None = None,
    workers: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Search (`search.py`) and report as JSON-ready data. `memories` replaces the
    derived grid (the same for every setting; a setting runs at those that serve
    its largest request). Every check of `prepare` first."""
    as_positive(grid_points, "grid_points")
    as_real(resolution, "resolution", low=0, low_open=True)
    return search(
        prepare(trace, profile, goal, base, policies, state_fractions, memories),
        grid_points,
        resolution,
        workers,
        progress,
    )


def search(
    p: Prepared, grid_points: int, resolution: float, workers: int | None, progress: bool
) -> dict[str, Any]:
    start = time.perf_counter()
    ev = Evaluator(p.trace, p.profile, p.base, workers, progress)
    if p.memories is not None:
        ev.run([(s, m) for s, (lo, _) in p.ranges.items() for m in p.memories if m >= lo])
    else:
        ev.run(grid_points_of(p.ranges, grid_points, p.goal.budget_gb))
    if p.goal.targets:
        bisect_rounds(ev, list(p.ranges), p.goal, resolution)
    ttft = ttft_key(p.goal)
    best = recommend(list(ev.rows.values()), p.goal, ttft)
    defaults = _defaults(ev, best, p.trace, p.profile, p.base) if best else {}
    rows = list(ev.rows.values())  # the defaults' too: configurations like any other
    best = recommend(rows, p.goal, ttft)  # the same memory; more hits if a default has them
    return {
        "trace": {
            "name": p.trace.name,
            "requests": len(p.trace),
            "unit_tokens": p.trace.unit_tokens,
        },
        "model": {
            "name": p.profile.name,
            "kv_bytes_per_token": p.profile.kv_bytes_per_token,
            "state_bytes": p.profile.state_bytes,
        },
        "bound": {"token_hit_rate": p.bound},
        "footprint": {"kv_units": p.footprint.kv_units, "positions": p.footprint.positions},
        "goal": {
            "hit_rate": p.goal.hit_rate,
            "ttft_mean_s": p.goal.ttft_mean_s,
            "ttft_p95_s": p.goal.ttft_p95_s,
            "budget_gb": p.goal.budget_gb,
            "described": p.goal.describe(),
        },
        "ttft": ttft,
        "axes": {"policies": p.policies, "state_fractions": p.fractions, "memory": ["device"]},
        "ranges": [
            {
                "setting": s.label(),
                "policy": s.policy,
                "state_fraction": s.state_fraction,
                "least_gb": lo,
                "top_gb": hi,
            }
            for s, (lo, hi) in p.ranges.items()
        ],
        "points": sorted(rows, key=lambda r: (r["setting"], r["memory_gb"])),
        "frontier": pareto(rows, ttft),
        "recommended": best,
        "defaults": defaults,
        "replays": len(rows),
        "rounds": ev.batches,
        "search_s": time.perf_counter() - start,
    }


def least_gb_of(ranges: dict[Setting, tuple[float, float]], s: Setting) -> float:
    return ranges[s][0]


def _check_budget(goal: Goal, ranges: dict[Setting, tuple[float, float]]) -> None:
    if goal.budget_gb is None:
        return
    least = min(lo for lo, _ in ranges.values())
    if goal.budget_gb < least:
        raise ValueError(
            f"budget_gb {goal.budget_gb:g} GB is below the least memory that serves this "
            f"trace's largest request under any policy searched ({least:g} GB)"
        )


def _defaults(
    ev: Evaluator,
    best: dict[str, Any],
    trace: Trace,
    profile: ModelProfile,
    base: ServingConfig,
) -> dict[str, Any]:
    """SGLang's and vLLM's default sizing at the recommended memory: their row, or
    why they do not run there."""
    memory = best["memory_gb"]
    out: dict[str, Any] = {}
    todo = []
    for engine, s in DEFAULTS.items():
        if base.sequential:
            s = Setting(s.policy, None)
        try:
            check_paged([s.policy], trace, base, "policies")
            least = least_gb(trace, profile, base, s)
        except ValueError as e:
            out[engine] = {"setting": s.label(), "runs": False, "why": str(e)}
            continue
        if memory < least:
            why = f"needs {least:g} GB to serve the largest request"
            out[engine] = {"setting": s.label(), "runs": False, "why": why}
            continue
        todo.append((engine, s))
    ev.run([(s, memory) for _, s in todo])
    for engine, s in todo:
        out[engine] = {"setting": s.label(), "runs": True, **ev.rows[(s, memory)]}
    return out
