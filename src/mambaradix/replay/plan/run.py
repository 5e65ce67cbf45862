"""`plan`: from a trace, a model and a goal, the memory to buy per tier (device, host),
the state share and the policy; the Pareto frontier; SGLang's and vLLM's default sizing
at that memory (with a host tier: their tiered setups at the same host bytes)."""

from __future__ import annotations

import time
from typing import NamedTuple

from mambaradix.geometry.profile import ModelProfile
from mambaradix.replay.bound import bound_hit_tokens
from mambaradix.replay.checks import check_inputs, check_paged, check_policies, check_reals
from mambaradix.replay.plan.frontier import pareto, recommend
from mambaradix.replay.plan.results import (
    Axes,
    GoalInfo,
    PeerDefault,
    PlanFootprint,
    PlanPoint,
    PlanResult,
    PlanTrace,
    SettingRange,
)
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
from mambaradix.replay.results import Bound, ModelInfo
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.trace import Trace
from mambaradix.validate import as_positive, as_real, as_type

__all__ = [
    "DEFAULT_FRACTIONS",
    "DEFAULT_HOST_COST",
    "DEFAULT_POLICIES",
    "DEFAULTS",
    "HOST_DEFAULTS",
    "Prepared",
    "plan",
    "prepare",
]

SGLANG_FRACTION = 0.9 / 1.9  # SGLang's --mamba-full-memory-ratio 0.9 (ServingConfig's)
DEFAULT_POLICIES = ["sglang-extra-buffer", "vllm", "mambaradix"]
DEFAULT_FRACTIONS = [0.25, SGLANG_FRACTION, 0.75]
DEFAULTS = {  # what each engine runs when its memory options are left alone
    "sglang": Setting("sglang-extra-buffer", SGLANG_FRACTION),
    "vllm": Setting("vllm", None),
}
HOST_DEFAULTS = {  # with a host tier: the peers' tiered setups (`policies.tier_rules`)
    "sglang-hicache": Setting("sglang-hicache", SGLANG_FRACTION),  # host split as the device
    "sglang-hicache-auto": Setting("sglang-hicache-auto", SGLANG_FRACTION),  # sglang #39436
    "vllm-offload": Setting("vllm-offload", None),
}
DEFAULT_HOST_COST = 0.05
"""A host GB's price in device GB. Device memory is bought as accelerators: an H100 SXM
(80 GB) at $25,000-30,000, $310-375 per GB; server DDR5 RDIMM at about $19 per GB at the
2025-26 shortage's prices (a 4 TB kit of 16 x 256 GB at about $77,000), about $5 before it:
0.013-0.06. 0.05 is near the top, so that host memory is not made to look cheaper than it
is (docs/plan.md cites the sources)."""


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
    hosts: list[float]
    host_cost: float


def prepare(
    trace: Trace,
    profile: ModelProfile,
    goal: Goal,
    base: ServingConfig,
    policies: list[str] | None = None,
    state_fractions: list[float] | None = None,
    memories: list[float] | None = None,
    host_gbs: list[float] | None = None,
    host_cost: float = DEFAULT_HOST_COST,
) -> Prepared:
    """Every check `plan` makes before a replay (TypeError / ValueError naming the
    parameter; a hit-rate target above the bound names the bound), the bound and
    each setting's memory range. `memories` replaces the derived ranges; `host_gbs`
    (GB, 0: no host tier; default [0]) is the host axis, `host_cost` a host GB's
    price in device GB."""
    check_inputs(trace, profile, base)
    as_type(goal, Goal, "goal")
    names = check_policies(DEFAULT_POLICIES if policies is None else policies)
    check_paged(names, trace, base, "policies")
    fractions = check_reals(state_fractions or DEFAULT_FRACTIONS, "state_fractions", low=0, high=1)
    if memories is not None:
        memories = sorted(check_reals(memories, "memories", low=0))
    hosts = sorted(check_reals([0.0] if host_gbs is None else host_gbs, "host_gbs", low=0,
                               open_=False))  # fmt: skip
    cost = as_real(host_cost, "host_cost", low=0)
    hits = bound_hit_tokens(trace)
    bound = sum(hits) / max(1, trace.prompt_tokens)
    goal.check_bound(bound)
    fp = footprint(trace, hits)
    ranges = {}
    for s in settings(names, fractions, base.sequential, hosts):
        lo = least_gb(trace, profile, base, s)
        top = max(lo, top_gb(fp, trace, profile, base, s, lo))
        ranges[s] = (lo, top) if memories is None else (lo, max(memories))
    _check_budget(goal, ranges, cost)
    return Prepared(
        trace, profile, goal, base, names, fractions, bound, fp, ranges, memories, hosts, cost
    )


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
    host_gbs: list[float] | None = None,
    host_cost: float = DEFAULT_HOST_COST,
) -> PlanResult:
    """Search (`search.py`) and report as JSON-ready data. `memories` replaces the
    derived grid (the same for every setting; a setting runs at those that serve
    its largest request). `host_gbs`: the host memories searched (default [0]: no
    host tier); `host_cost`: a host GB's price in device GB. Every check of `prepare`
    first."""
    as_positive(grid_points, "grid_points")
    as_real(resolution, "resolution", low=0, low_open=True)
    return search(
        prepare(
            trace, profile, goal, base, policies, state_fractions, memories, host_gbs, host_cost
        ),
        grid_points,
        resolution,
        workers,
        progress,
    )


def search(
    p: Prepared, grid_points: int, resolution: float, workers: int | None, progress: bool
) -> PlanResult:
    start = time.perf_counter()
    ev = Evaluator(p.trace, p.profile, p.base, workers, progress, p.host_cost)
    if p.memories is not None:
        ev.run([(s, m) for s, (lo, _) in p.ranges.items() for m in p.memories if m >= lo])
    else:
        ev.run(grid_points_of(p.ranges, grid_points, p.goal.budget_gb, p.host_cost))
    if p.goal.targets:
        bisect_rounds(ev, list(p.ranges), p.goal, resolution)
    ttft = ttft_key(p.goal)
    best = recommend(list(ev.rows.values()), p.goal, ttft)
    defaults = _defaults(ev, best, p.trace, p.profile, p.base) if best is not None else {}
    rows = list(ev.rows.values())  # the defaults' too: configurations like any other
    best = recommend(rows, p.goal, ttft)  # the same memory; more hits if a default has them
    return PlanResult(
        trace=PlanTrace(p.trace.name, len(p.trace), p.trace.unit_tokens),
        model=ModelInfo(p.profile.name, p.profile.kv_bytes_per_token, p.profile.state_bytes),
        bound=Bound(p.bound),
        footprint=PlanFootprint(p.footprint.kv_units, p.footprint.positions),
        goal=GoalInfo(
            p.goal.hit_rate,
            p.goal.ttft_mean_s,
            p.goal.ttft_p95_s,
            p.goal.budget_gb,
            p.goal.describe(),
        ),
        ttft=ttft,
        axes=Axes(
            p.policies,
            p.fractions,
            ["device", "host"] if any(p.hosts) else ["device"],
            p.hosts,
        ),
        host_cost=p.host_cost,
        ranges=[
            SettingRange(s.label(), s.policy, s.state_fraction, s.host_gb, lo, hi)
            for s, (lo, hi) in p.ranges.items()
        ],
        points=sorted(rows, key=lambda r: (r.setting, r.replay.memory_gb, r.host_gb)),
        frontier=pareto(rows, ttft),
        recommended=best,
        defaults=defaults,
        replays=len(rows),
        rounds=ev.batches,
        search_s=time.perf_counter() - start,
    )


def least_gb_of(ranges: dict[Setting, tuple[float, float]], s: Setting) -> float:
    return ranges[s][0]


def _check_budget(goal: Goal, ranges: dict[Setting, tuple[float, float]], host_cost: float) -> None:
    if goal.budget_gb is None:
        return
    least = min(s.cost(lo, host_cost) for s, (lo, _) in ranges.items())
    if goal.budget_gb < least:
        raise ValueError(
            f"budget_gb {goal.budget_gb:g} GB is below the least memory that serves this "
            f"trace's largest request under any policy searched ({least:g} GB)"
        )


def _defaults(
    ev: Evaluator,
    best: PlanPoint,
    trace: Trace,
    profile: ModelProfile,
    base: ServingConfig,
) -> dict[str, PeerDefault]:
    """SGLang's and vLLM's default sizing at the recommended memory: their row, or
    why they do not run there. With a host tier, the peers' tiered setups at the same
    host memory and device memory (`HOST_DEFAULTS`), or at their least device memory
    when they need more to serve the largest request."""
    memory, host = best.replay.memory_gb, best.host_gb
    out: dict[str, PeerDefault] = {}
    todo = []
    for engine, s in (HOST_DEFAULTS if host else DEFAULTS).items():
        s = s._replace(host_gb=host)
        if base.sequential:
            s = Setting(s.policy, None, host)
        try:
            check_paged([s.policy], trace, base, "policies")
            least = least_gb(trace, profile, base, s)
        except ValueError as e:
            out[engine] = PeerDefault(s.label(), False, why=str(e))
            continue
        if memory < least and not host:
            why = f"needs {least:g} GB to serve the largest request"
            out[engine] = PeerDefault(s.label(), False, why=why)
            continue
        # with a host tier the comparison is at equal host bytes: a peer that needs more
        # device memory than the recommendation runs at its least (more than ours)
        todo.append((engine, s, max(memory, least)))
    ev.run([(s, m) for _, s, m in todo])
    for engine, s, m in todo:
        out[engine] = PeerDefault(s.label(), True, point=ev.rows[(s, m)])
    return out
