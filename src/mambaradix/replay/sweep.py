"""A sweep: every (policy, memory) point of one trace and model, in parallel
processes, plus the bound; as JSON-ready data, a table and a plot."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import replace
from typing import Any, BinaryIO, NamedTuple

from mambaradix.geometry.profile import ModelProfile
from mambaradix.replay.bound import bound_token_hit_rate
from mambaradix.replay.cells import Cell, build_cells, cell_key, run_sweep_cell
from mambaradix.replay.checks import (
    check_cluster,
    check_inputs,
    check_instanced,
    check_paged,
    check_policies,
    check_reals,
    check_workers,
    policy_strategy,
)
from mambaradix.replay.cluster import ClusterSpec
from mambaradix.replay.executors import run_on
from mambaradix.replay.fit import Fit, check_memory
from mambaradix.replay.forked import run_forked
from mambaradix.replay.progress import Counter, counter
from mambaradix.replay.results import (
    Bound,
    ModelInfo,
    ReplayResult,
    SweepResult,
    TraceInfo,
)
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.shards import Shard, shard_header
from mambaradix.replay.trace import Trace

_WORK: tuple[Trace, ModelProfile] | None = None  # inherited by forked workers

# A cell's CPU time relative to an SGLang row's, by policy (the full Mooncake sweep on
# nemotron-h-8b, `bench/bench_main_job.py --cells`; others: 1). Cells start longest
# first, so that the workers end together; results do not depend on the order.
CELL_COST = {"mambaradix": 2.6, "vllm-0.20-all": 2.2, "vllm": 1.7, "marconi": 1.2}
CELL_COST["marconi-oracle"] = 8 * CELL_COST["marconi"]  # a Marconi run per alpha (8)


def cell_cost(cell: Cell) -> float:
    """The expected cost of a cell, for ordering only (variants: their policy's)."""
    return CELL_COST.get(re.split(r"[/@]", cell.policy)[0], 1.0)


def _one(cell: Cell) -> ReplayResult:
    assert _WORK is not None
    return run_sweep_cell(_WORK, cell)


def sweep(
    trace: Trace,
    profile: ModelProfile,
    policies: list[str],
    memories: list[float],
    base: ServingConfig,
    workers: int | None = None,
    progress: bool = True,
    state_fractions: list[float] | None = None,
    executor: Executor | None = None,
    shard: Shard | None = None,
    routers: list[str] | None = None,
    cluster: ClusterSpec | None = None,
    checked: Checked | None = None,
) -> SweepResult:
    """Every (state fraction, memory, policy) point; several state fractions
    sweep the split of memory between the KV pool and the state pool. With
    `routers` and `cluster`, every router too, over `cluster.instances`
    instances. `executor` runs the cells (default: forked processes);
    `shard` runs only its share of them (`shards.py`).

    Checks every argument first (TypeError / ValueError naming it), including
    that each memory point holds at least one request of the trace, unless the
    caller hands in what `check_points` returned for these same arguments
    (`checked`: the CLI checks once, with its own option names). Ctrl-C
    (KeyboardInterrupt) terminates the worker processes before it propagates."""
    if checked is None:
        checked = check_points(
            trace, profile, policies, memories, base, state_fractions, routers, cluster
        )
    cells = checked.cells
    points = shard.select(cells) if shard is not None else cells
    workers = check_workers(workers) or min(len(points), os.cpu_count() or 1)
    bound = bound_token_hit_rate(trace)
    bar = counter(len(points), "replay", "run", show=progress)
    try:
        longest_first = sorted(points, key=cell_cost, reverse=True)  # stable
        results = _run(longest_first, trace, profile, min(workers, len(points)), bar, executor)
    finally:
        bar.close()
    order = {cell.key: i for i, cell in enumerate(points)}
    rows = [
        replace(
            r,
            state_fraction=r.config.state_fraction,
            share_of_bound=r.token_hit_rate / bound if bound else 0.0,
        )
        for r in results
    ]
    rows.sort(key=lambda r: order[cell_key(r)])
    header = shard_header(trace, profile, cells, shard) if shard is not None else None
    return SweepResult(
        trace=TraceInfo(
            name=trace.name,
            requests=len(trace),
            prompt_tokens=trace.prompt_tokens,
            unit_tokens=trace.unit_tokens,
            source=trace.source,
        ),
        model=ModelInfo(
            name=profile.name,
            kv_bytes_per_token=profile.kv_bytes_per_token,
            state_bytes=profile.state_bytes,
        ),
        bound=Bound(bound),
        results=rows,
        header=header,
    )


class Checked(NamedTuple):
    """A sweep's checked cells, in table order (fraction, memory, router, policy), and
    each (fraction, memory) point's configuration and `Fit` (its pools), in order."""

    cells: list[Cell]
    points: list[tuple[ServingConfig, Fit]]


def check_points(
    trace: Trace,
    profile: ModelProfile,
    policies: list[str],
    memories: list[float],
    base: ServingConfig,
    state_fractions: list[float] | None = None,
    routers: list[str] | None = None,
    cluster: ClusterSpec | None = None,
    names: tuple[str, str] = ("memories", "state_fractions"),
) -> Checked:
    """Every check `sweep` makes, once (ValueError / TypeError naming the argument; `names`:
    how the memories and state fractions are called in the message). With a cluster, each
    instance has `memory` of its own: the same checks hold."""
    check_inputs(trace, profile, base)
    policies = check_policies(policies)
    if cluster is not None:
        check_instanced(policies, "policies")
    check_paged(policies, trace, base, "policies")
    routers = check_cluster(routers, cluster, trace, base)
    strategies = {p: policy_strategy(p) for p in policies}
    memories = check_reals(memories, names[0], low=0)
    fractions = [base.state_fraction]
    if state_fractions is not None:
        fractions = check_reals(state_fractions, names[1], low=0, high=1)
    points = []
    for f in fractions:
        for m in memories:
            cfg = replace(base, memory_gb=m, state_fraction=f)
            try:
                points.append((cfg, check_memory(trace, profile, cfg, strategies, names[0])))
            except ValueError as e:
                at = f" (with {names[1]} {f:g})" if state_fractions is not None else ""
                raise ValueError(f"{e}{at}") from None
    return Checked(build_cells(policies, memories, base, fractions, routers, cluster), points)


def _run(
    points: list[Cell],
    trace: Trace,
    profile: ModelProfile,
    workers: int,
    bar: Counter,
    executor: Executor | None,
) -> list[ReplayResult]:
    global _WORK
    _WORK = (trace, profile)
    try:
        if executor is not None:
            return run_on(executor, _WORK, points, lambda: bar.update(1))
        if workers <= 1:
            results = []
            for cell in points:
                results.append(_one(cell))
                bar.update(1)
            return results
        return run_forked(_one, points, workers, lambda: bar.update(1))
    finally:
        _WORK = None


def table(data: Mapping[str, Any]) -> str:
    """The results as a fixed-width table, one row per (memory, policy). Hit
    rates are over all requests: `dropped` ones (never served) count as misses."""
    w = max([12] + [len(r["policy"]) for r in data["results"]])
    head = (
        f"{'memory':>7} {'policy':<{w}} {'tok hit':>8} {'of bound':>8} {'req hit':>8} "
        f"{'dropped':>7} {'PFLOP saved':>11} {'TTFT p50':>9} {'TTFT p95':>9} "
        f"{'KV evict':>11} {'st evict':>8}"
    )
    lines = [
        f"trace {data['trace']['name']}: {data['trace']['requests']:,} requests, "
        f"{data['trace']['prompt_tokens']:,} prompt tokens; model {data['model']['name']}; "
        f"bound (unlimited memory, a state everywhere): {data['bound']['token_hit_rate']:.1%}",
        head,
        "-" * len(head),
    ]
    several = len({r.get("state_fraction") for r in data["results"]}) > 1
    shown = None
    for r in data["results"]:
        if several and r["state_fraction"] != shown:
            shown = r["state_fraction"]
            lines.append(f"  state pool {shown:.0%} of memory:")
        lines.append(_row(r, w))
    return "\n".join(lines)


def _seconds(x: float | None) -> str:
    return f"{'-':>9}" if x is None else f"{x:>8.3f}s"


def _row(r: Mapping[str, Any], w: int) -> str:
    return (
        f"{r['memory_gb']:>5g}GB {r['policy']:<{w}} {r['token_hit_rate']:>8.1%} "
        f"{r['share_of_bound']:>8.1%} {r['request_hit_rate']:>8.1%} {r['dropped']:>7,} "
        f"{r['flops_saved'] / 1e15:>11.1f} {_seconds(r['ttft_p50_s'])} "
        f"{_seconds(r['ttft_p95_s'])} {r['kv_tokens_evicted']:>11,} {r['states_evicted']:>8,}"
    )


def _mark_dropped(ax: Any, results: list[Mapping[str, Any]]) -> None:
    """A black cross on every point at which some requests were dropped."""
    hit = [r for r in results if r["dropped"]]
    if hit:
        ax.scatter(
            [r["memory_gb"] for r in hit],
            [r["token_hit_rate"] for r in hit],
            marker="x",
            s=70,
            color="black",
            zorder=5,
            label="requests dropped (counted as misses)",
        )


def plot(data: Mapping[str, Any], path: str | BinaryIO) -> None:
    """Token hit rate against memory, one line per policy, the bound as a line;
    a cross marks the points at which requests were dropped. The format
    follows `path`'s extension (a binary stream gets a PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    fractions = list(dict.fromkeys(r.get("state_fraction") for r in data["results"]))
    policies = list(dict.fromkeys(r["policy"] for r in data["results"]))
    for f in fractions:
        for p in policies:
            rows = [r for r in data["results"] if r["policy"] == p and r.get("state_fraction") == f]
            label = p if len(fractions) == 1 else f"{p} (states {f:.0%})"
            ax.plot(
                [r["memory_gb"] for r in rows],
                [r["token_hit_rate"] for r in rows],
                marker="o",
                label=label,
                linewidth=2.5 if p == "mambaradix" else 1.5,
            )
    _mark_dropped(ax, data["results"])
    ax.axhline(
        data["bound"]["token_hit_rate"],
        color="black",
        linestyle="--",
        label="bound (unlimited memory)",
    )
    ax.set_xscale("log")
    mems = sorted({r["memory_gb"] for r in data["results"]})
    ax.set_xticks(mems, [f"{m:g}" for m in mems])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("cache memory (GB, KV + states)")
    ax.set_ylabel("token hit rate")
    top = max([data["bound"]["token_hit_rate"]] + [r["token_hit_rate"] for r in data["results"]])
    ax.set_ylim(0, min(1.0, top * 1.15 + 0.02))
    ax.set_title(f"{data['trace']['name']} on {data['model']['name']}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format=None if isinstance(path, str) else "png")
    plt.close(fig)
