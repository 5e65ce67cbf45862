"""The planner's search: replays of (setting, device memory) points, run in parallel
batches, and where the device memory goes next.

Phase 1, a grid: every setting at `grid_points` memories, geometric from the setting's
least memory to the top of its range (`space.py`; the budget instead, when it is lower:
the budget is a memory cost, so a setting's host memory, at its price, comes off it).
Phase 2, with targets: per setting, bisection (geometric midpoints) of the bracket
between its largest memory that misses the targets and its least that meets them, until
the bracket is within `resolution` (10%: the memory is known to within 10%). Branch and
bound: a setting whose bracket starts at or above the least memory that meets the
targets anywhere (in memory cost: device GB plus host GB at its price) can no longer win
and stops; each round takes the brackets that start lowest, as many as there are workers
(with fewer, several cut points per bracket: k-section), so that each round's results
prune the next. This assumes a setting meets the targets at every memory above one that
does (hit rates and TTFTs are monotone-ish in memory); the answer is always a replayed
point that meets them, at worst not the cheapest.

Work shared across points: the trace is parsed and hashed once and handed to forked
workers (`forked.run_forked`), and no point is replayed twice (`Evaluator.rows`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

from mambaradix.geometry.profile import ModelProfile
from mambaradix.replay.cells import Cell, run_cell
from mambaradix.replay.forked import run_forked
from mambaradix.replay.plan.results import PlanPoint
from mambaradix.replay.plan.space import Setting
from mambaradix.replay.plan.targets import Goal
from mambaradix.replay.progress import counter
from mambaradix.replay.results import ReplayResult
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.trace import Trace

__all__ = ["Evaluator", "bisect_rounds", "geometric", "grid_points_of"]

Point = tuple[Setting, float]
_WORK: tuple[Trace, ModelProfile] | None = None  # inherited by forked workers


def _one(item: tuple[int, Cell]) -> tuple[int, ReplayResult]:
    assert _WORK is not None
    return item[0], run_cell(_WORK, item[1])


class Evaluator:
    """Replays points, each once; `rows` maps a point to its result row."""

    def __init__(
        self,
        trace: Trace,
        profile: ModelProfile,
        base: ServingConfig,
        workers: int | None,
        progress: bool,
        host_cost: float = 0.0,
    ) -> None:
        self.trace, self.profile, self.base = trace, profile, base
        self.host_cost = host_cost
        self.workers = workers or os.cpu_count() or 1
        self.progress = progress
        self.rows: dict[Point, PlanPoint] = {}
        self.batches = 0

    def run(self, points: list[Point]) -> None:
        global _WORK
        todo = list(dict.fromkeys(p for p in points if p not in self.rows))
        if not todo:
            return
        self.batches += 1
        items = [(i, Cell(s.policy, s.config(self.base, m))) for i, (s, m) in enumerate(todo)]
        bar = counter(len(items), f"plan round {self.batches}", "run", show=self.progress)
        _WORK = (self.trace, self.profile)
        try:
            workers = min(self.workers, len(items))
            done: list[tuple[int, ReplayResult]]
            if workers <= 1:
                done = []
                for item in items:
                    done.append(_one(item))
                    bar.update(1)
            else:
                done = run_forked(_one, items, workers, lambda: bar.update(1))
        finally:
            _WORK = None
            bar.close()
        for i, result in done:
            s, m = todo[i]
            cost = s.cost(m, self.host_cost)
            self.rows[(s, m)] = PlanPoint(result, s.state_fraction, s.host_gb, cost, s.label())

    def of(self, s: Setting) -> list[tuple[float, PlanPoint]]:
        """A setting's evaluated points, by memory."""
        return sorted((m, r) for (t, m), r in self.rows.items() if t == s)


def round_up_gb(x: float) -> float:
    return math.ceil(x * 100 - 1e-9) / 100


def geometric(lo: float, hi: float, n: int) -> list[float]:
    """`n` memories from `lo` to `hi` (both kept), evenly spaced in log, 0.01 GB steps."""
    if n <= 1 or hi <= lo:
        return [round_up_gb(hi if n <= 1 else lo)]
    ratio = (hi / lo) ** (1 / (n - 1))
    out = [round_up_gb(lo * ratio**i) for i in range(n - 1)] + [round_up_gb(hi)]
    return sorted(set(out))


def device_budget(s: Setting, budget: float | None, host_cost: float) -> float | None:
    """The most device memory `s` may have within a memory-cost budget."""
    return None if budget is None else budget - host_cost * s.host_gb


def grid_points_of(
    ranges: dict[Setting, tuple[float, float]],
    n: int,
    budget: float | None,
    host_cost: float = 0.0,
) -> list[Point]:
    """Phase 1: every setting at `n` memories of its range (capped by the budget;
    a setting whose least memory is above the budget has none)."""
    points: list[Point] = []
    for s, (lo, hi) in ranges.items():
        cap = device_budget(s, budget, host_cost)
        top = hi if cap is None else min(hi, cap)
        if top >= lo:
            points += [(s, m) for m in geometric(lo, top, n)]
    return points


def _bracket(ev: Evaluator, s: Setting, goal: Goal) -> tuple[float | None, float | None]:
    """(largest memory below `b` that misses, `b`: the least that meets) for `s`."""
    pts = ev.of(s)
    met = [m for m, r in pts if goal.met(r) and _within(s.cost(m, ev.host_cost), goal)]
    if not met:
        return None, None
    b = met[0]
    below = [m for m, _ in pts if m < b]
    return (below[-1] if below else None), b


def _within(cost: float, goal: Goal) -> bool:
    return goal.budget_gb is None or cost <= goal.budget_gb + 1e-9


def bisect_rounds(
    ev: Evaluator,
    settings: list[Setting],
    goal: Goal,
    resolution: float,
    on_round: Callable[[int], None] | None = None,
) -> None:
    """Phase 2 (see the module docstring). With fewer active settings than workers,
    each bracket is cut at several points per round (k-section) so no worker idles."""
    while True:
        brackets = {s: _bracket(ev, s, goal) for s in settings}
        hc = ev.host_cost
        best = min((s.cost(b, hc) for s, (_, b) in brackets.items() if b is not None), default=None)
        active = {
            s: (a, b)
            for s, (a, b) in brackets.items()
            if a is not None
            and b is not None
            and b > a * (1 + resolution)
            and (best is None or s.cost(a, hc) < best)  # else it cannot beat the best found
        }
        # best first: the brackets that start cheapest could still beat the best; a round is
        # as wide as the workers, so that each round's results prune the next one
        chosen = sorted(
            active.items(), key=lambda kv: (kv[0].cost(kv[1][0], hc), kv[0].cost(kv[1][1], hc))
        )[: ev.workers]
        cuts = max(1, ev.workers // max(1, len(chosen)))
        mids: list[Point] = []
        for s, (a, b) in chosen:
            assert a is not None and b is not None
            inner = {round_up_gb(a * (b / a) ** (i / (cuts + 1))) for i in range(1, cuts + 1)}
            mids += [(s, m) for m in sorted(inner) if a < m < b]
        if not mids:
            return
        if on_round is not None:
            on_round(len(mids))
        ev.run(mids)
