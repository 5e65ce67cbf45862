"""The Pareto frontier of evaluated configurations (less memory cost, more token hits,
less TTFT) and the configuration to recommend. The memory cost of a row is `cost_gb`
(device GB plus host GB at the host's price, `Setting.cost`); a row without one (no
host axis) costs its device memory."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeVar

from mambaradix.replay.plan.targets import Goal

__all__ = ["cost_gb", "dominates", "pareto", "recommend"]

Row = Mapping[str, Any]  # a point: `results.PlanPoint` or its JSON
R = TypeVar("R", bound=Row)


def cost_gb(row: Row) -> float:
    return float(row["cost_gb"] if "cost_gb" in row else row["memory_gb"])


def _costs(row: Row, ttft: str) -> tuple[float, float, float]:
    """What the frontier minimises. A run that served nothing has no TTFT: infinite."""
    t = row[ttft]
    return (cost_gb(row), -row["token_hit_rate"], math.inf if t is None else t)


def dominates(a: Row, b: Row, ttft: str) -> bool:
    """`a` is no worse than `b` on all three and better on one."""
    ca, cb = _costs(a, ttft), _costs(b, ttft)
    return all(x <= y for x, y in zip(ca, cb, strict=True)) and ca != cb


def pareto(rows: list[R], ttft: str) -> list[R]:
    """The rows no other row dominates, by memory then hit rate; of rows with equal
    costs, the first. Rows that dropped requests are left out (they did not serve the
    trace). Sorting by the costs lets each row be checked against the kept ones only."""
    ordered = sorted((r for r in rows if not r["dropped"]), key=lambda r: _costs(r, ttft))
    kept: list[R] = []
    for r in ordered:
        c = _costs(r, ttft)
        if not any(all(x <= y for x, y in zip(_costs(k, ttft), c, strict=True)) for k in kept):
            kept.append(r)
    return kept


def recommend(rows: list[R], goal: Goal, ttft: str) -> R | None:
    """With targets: the least memory cost meeting them all (within the budget), then
    the higher hit rate, then the lower TTFT. With a budget only: the highest hit rate
    within it, then the least cost, then the lower TTFT. None if none qualifies."""
    within = [
        r
        for r in rows
        if not r["dropped"] and (goal.budget_gb is None or cost_gb(r) <= goal.budget_gb + 1e-9)
    ]
    if goal.targets:
        ok = [r for r in within if goal.met(r)]
        return min(ok, key=lambda r: _costs(r, ttft)) if ok else None
    if not within:
        return None
    return min(within, key=lambda r: (-r["token_hit_rate"], *_costs(r, ttft)))
