"""What the planner is asked for: targets a configuration must meet (token hit rate,
mean TTFT, p95 TTFT, all that are given) and an optional memory budget (a memory cost:
device GB plus host GB at the host's price, `space.Setting.cost`; device GB alone
when no host tier is searched)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mambaradix.validate import as_real

__all__ = ["Goal", "ttft_key"]


@dataclass(frozen=True)
class Goal:
    """hit_rate: least token hit rate (0-1). ttft_mean_s / ttft_p95_s: most mean /
        95th-percentile TTFT over served requests. budget_gb: most memory cost, in device
    GB (device GB + host GB x the host's price).
        At least one is given."""

    hit_rate: float | None = None
    ttft_mean_s: float | None = None
    ttft_p95_s: float | None = None
    budget_gb: float | None = None

    def __post_init__(self) -> None:
        if self.hit_rate is not None:
            as_real(self.hit_rate, "hit_rate", low=0, high=1, low_open=True)
        for name in ("ttft_mean_s", "ttft_p95_s", "budget_gb"):
            if getattr(self, name) is not None:
                as_real(getattr(self, name), name, low=0, low_open=True)
        if not self.targets and self.budget_gb is None:
            raise ValueError("give a target (hit_rate, ttft_mean_s, ttft_p95_s) or budget_gb")

    @property
    def targets(self) -> bool:
        return any(x is not None for x in (self.hit_rate, self.ttft_mean_s, self.ttft_p95_s))

    def met(self, row: Mapping[str, Any]) -> bool:
        """Whether a replay's result meets every target (a run that dropped a
        request, or served none, has no TTFT to compare: not met)."""
        if row["dropped"]:
            return False
        if self.hit_rate is not None and row["token_hit_rate"] < self.hit_rate:
            return False
        for key in ("ttft_mean_s", "ttft_p95_s"):
            limit = getattr(self, key)
            if limit is not None and (row[key] is None or row[key] > limit):
                return False
        return True

    def check_bound(self, bound: float) -> None:
        """ValueError naming the bound when the hit-rate target is above it."""
        if self.hit_rate is not None and self.hit_rate > bound:
            raise ValueError(
                f"hit_rate {self.hit_rate:.1%} is above this trace's bound "
                f"{bound:.1%} (unlimited memory, a state at every position): no memory reaches it"
            )

    def describe(self) -> str:
        parts = []
        if self.hit_rate is not None:
            parts.append(f"token hit rate >= {self.hit_rate:.1%}")
        if self.ttft_mean_s is not None:
            parts.append(f"mean TTFT <= {self.ttft_mean_s:g} s")
        if self.ttft_p95_s is not None:
            parts.append(f"p95 TTFT <= {self.ttft_p95_s:g} s")
        if self.budget_gb is not None:
            parts.append(f"memory cost <= {self.budget_gb:g} device GB")
        return ", ".join(parts)


def ttft_key(goal: Goal) -> str:
    """The TTFT the frontier trades: the mean when that is the target, else p95."""
    return (
        "ttft_mean_s"
        if goal.ttft_mean_s is not None and goal.ttft_p95_s is None
        else ("ttft_p95_s")
    )
