"""The cells of a sweep: one (state fraction, memory, router, policy) point each.

`build_cells` gives them in one fixed order (state fraction, then memory, then router,
then policy, each in the order given), the order of a sweep's results, of its shards
(`shards.py`) and of a merge. `run_sweep_cell` runs one of a sweep's (the sweep checked
them all) and `run_cell` any other, checked first; each takes the trace and the profile
explicitly, so that any executor can run it (a forked process, another machine).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, NamedTuple

from mambaradix.geometry.profile import ModelProfile
from mambaradix.replay.cluster import ClusterSpec, cluster_replay, cluster_replay_checked
from mambaradix.replay.results import ReplayResult
from mambaradix.replay.run import replay, replay_checked
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.trace import Trace

Work = tuple[Trace, ModelProfile]
CellKey = tuple[str, float, float, "str | None"]


class Cell(NamedTuple):
    """One policy at one serving config; with `cluster`, `router` routes the
    trace over `cluster.instances` serving models."""

    policy: str
    cfg: ServingConfig
    router: str | None = None
    cluster: ClusterSpec | None = None

    @property
    def key(self) -> CellKey:
        return (self.policy, self.cfg.memory_gb, self.cfg.state_fraction, self.router)


def build_cells(
    policies: list[str],
    memories: list[float],
    base: ServingConfig,
    fractions: list[float],
    routers: list[str] | None = None,
    cluster: ClusterSpec | None = None,
) -> list[Cell]:
    """Every cell, in the sweep's order. Routers only with `cluster`."""
    if (routers is None) != (cluster is None):
        raise ValueError("give both routers and cluster, or neither")
    each_router: list[str | None] = list(routers) if routers is not None else [None]
    return [
        Cell(p, replace(base, memory_gb=m, state_fraction=f), r, cluster)
        for f in fractions
        for m in memories
        for r in each_router
        for p in policies
    ]


def row_key(row: Mapping[str, Any]) -> CellKey:
    """The key of the cell a result row (a result's JSON, read from a file) came from."""
    return (row["policy"], row["memory_gb"], row["config"]["state_fraction"], row.get("router"))


def cell_key(result: ReplayResult) -> CellKey:
    """`row_key` of a result not yet written as JSON."""
    router = None if result.cluster is None else result.cluster.router
    return (result.policy, result.memory_gb, result.config.state_fraction, router)


def run_cell(work: Work, cell: Cell) -> ReplayResult:
    """One cell, checked first (`replay`, `cluster_replay`): the planner's points."""
    trace, profile = work
    if cell.cluster is None or cell.router is None:
        return replay(trace, profile, cell.policy, cell.cfg)
    return cluster_replay(trace, profile, cell.policy, cell.cfg, cell.router, cell.cluster)


def run_sweep_cell(work: Work, cell: Cell) -> ReplayResult:
    """One cell of a `sweep`, which checked every cell (the memory fit of each point
    included) before the first ran: nothing is checked again per cell."""
    trace, profile = work
    if cell.cluster is None or cell.router is None:
        return replay_checked(trace, profile, cell.policy, cell.cfg)
    return cluster_replay_checked(trace, profile, cell.policy, cell.cfg, cell.router, cell.cluster)
