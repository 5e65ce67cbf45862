"""A sweep: every (policy, memory) point of one trace and model, in parallel
processes, plus the bound; as JSON-ready data, a table and a plot."""

from __future__ import annotations

import os
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from typing import Any

from mambaradix.replay.bound import bound_token_hit_rate
from mambaradix.replay.cells import Cell, build_cells, row_key, run_cell
from mambaradix.replay.cluster import ClusterSpec
from mambaradix.replay.executors import run_on
from mambaradix.replay.models import ModelProfile
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.shards import Shard, shard_header
from mambaradix.replay.trace import Trace

_WORK: tuple[Trace, ModelProfile] | None = None  # inherited by forked workers


def _one(cell: Cell) -> dict[str, Any]:
    assert _WORK is not None
    return run_cell(_WORK, cell)


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
) -> dict[str, Any]:
    """Every (state fraction, memory, policy) point; several state fractions
    sweep the split of memory between the KV pool and the state pool. With
    `routers` and `cluster`, every router too, over `cluster.instances`
    instances. `executor` runs the cells (default: forked processes);
    `shard` runs only its share of them (`shards.py`)."""
    global _WORK
    _WORK = (trace, profile)
    fractions = state_fractions or [base.state_fraction]
    cells = build_cells(policies, memories, base, fractions, routers, cluster)
    points = shard.select(cells) if shard is not None else cells
    workers = workers or min(len(points), os.cpu_count() or 1)
    results: list[dict[str, Any]] = []
    bar = _bar(len(points), progress)
    if executor is not None:
        results = run_on(executor, _WORK, points, lambda: bar.update(1))
    elif workers <= 1:
        for cell in points:
            results.append(_one(cell))
            bar.update(1)
    else:
        import multiprocessing as mp

        ctx = mp.get_context("fork")
        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            futures = [pool.submit(_one, cell) for cell in points]
            for f in as_completed(futures):
                results.append(f.result())
                bar.update(1)
    bar.close()
    order = {cell.key: i for i, cell in enumerate(points)}
    for r in results:
        r["state_fraction"] = r["config"]["state_fraction"]
    results.sort(key=lambda r: order[row_key(r)])
    bound = bound_token_hit_rate(trace)
    for r in results:
        r["share_of_bound"] = r["token_hit_rate"] / bound if bound else 0.0
    data = {
        "trace": {
            "name": trace.name,
            "requests": len(trace),
            "prompt_tokens": trace.prompt_tokens,
            "unit_tokens": trace.unit_tokens,
            "source": trace.source,
        },
        "model": {
            "name": profile.name,
            "kv_bytes_per_token": profile.kv_bytes_per_token,
            "state_bytes": profile.state_bytes,
        },
        "bound": {"token_hit_rate": bound},
        "results": results,
    }
    if shard is not None:
        data.update(shard_header(trace, profile, cells, shard))
    return data


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _bar(total: int, show: bool) -> Any:
    if not show:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # the replay extra is optional for library use
        return _NoBar()
    return tqdm(total=total, desc="replay", unit="run")


def table(data: dict[str, Any]) -> str:
    """The results as a fixed-width table, one row per (memory, policy)."""
    head = (
        f"{'memory':>7} {'policy':<12} {'tok hit':>8} {'of bound':>8} {'req hit':>8} "
        f"{'PFLOP saved':>11} {'TTFT p50':>9} {'TTFT p95':>9} {'KV evict':>10} {'st evict':>8}"
    )
    lines = [
        f"trace {data['trace']['name']}: {data['trace']['requests']} requests, "
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
        lines.append(
            f"{r['memory_gb']:>5g}GB {r['policy']:<12} {r['token_hit_rate']:>8.1%} "
            f"{r['share_of_bound']:>8.1%} {r['request_hit_rate']:>8.1%} "
            f"{r['flops_saved'] / 1e15:>11.1f} "
            f"{r['ttft_p50_s']:>8.3f}s {r['ttft_p95_s']:>8.3f}s {r['kv_tokens_evicted']:>10,} "
            f"{r['states_evicted']:>8,}"
        )
    return "\n".join(lines)


def plot(data: dict[str, Any], path: str) -> None:
    """Token hit rate against memory, one line per policy, the bound as a line."""
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
    fig.savefig(path, dpi=120)
    plt.close(fig)
