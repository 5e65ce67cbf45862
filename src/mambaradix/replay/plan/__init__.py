"""The planner behind `mambaradix plan`: the device and host memory, state share and
policy that meet a target hit rate or TTFT on a trace (or do best within a budget),
searched by replaying the trace (`search.py`), with the Pareto frontier of what was
replayed (memory cost, the tiers weighed by price, vs hit rate vs TTFT).

    space     the settings (policy x state share x host memory) and each one's memory range
    targets   the goal: hit rate, mean / p95 TTFT, budget
    search    parallel batches of replays; grid, then bisection per setting
    frontier  the non-dominated points and the recommendation
    run       `plan()`, the whole of it as JSON-ready data
    report    its table and plot
"""

from mambaradix.replay.plan.run import (
    DEFAULT_FRACTIONS,
    DEFAULT_HOST_COST,
    DEFAULT_POLICIES,
    DEFAULTS,
    Prepared,
    plan,
    prepare,
    search,
)
from mambaradix.replay.plan.targets import Goal

__all__ = [
    "DEFAULTS",
    "DEFAULT_FRACTIONS",
    "DEFAULT_HOST_COST",
    "DEFAULT_POLICIES",
    "Goal",
    "Prepared",
    "plan",
    "prepare",
    "search",
]
