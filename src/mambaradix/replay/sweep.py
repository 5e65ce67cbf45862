"""A sweep: every (policy, memory) point of one trace and model, in parallel
processes, plus the bound; as JSON-ready data, a table and a plot."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from typing import Any

from mambaradix.replay.bound import bound_token_hit_rate
from mambaradix.replay.models import ModelProfile
from mambaradix.replay.policies import ORACLE
from mambaradix.replay.run import FIXED_ALPHA, oracle_result, oracle_runs, replay
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.trace import Trace

_WORK: tuple[Trace, ModelProfile] | None = None  # inherited by forked workers


def _one(policy: str, cfg: ServingConfig) -> dict[str, Any]:
    assert _WORK is not None
    return replay(_WORK[0], _WORK[1], policy, cfg)


def sweep(
    trace: Trace,
    profile: ModelProfile,
    policies: list[str],
    memories: list[float],
    base: ServingConfig,
    workers: int | None = None,
    progress: bool = True,
    state_fractions: list[float] | None = None,
) -> dict[str, Any]:
    """Every (state fraction, memory, policy) point; several state fractions
    sweep the split of memory between the KV pool and the state pool."""
    global _WORK
    _WORK = (trace, profile)
    fractions = state_fractions or [base.state_fraction]
    points = [
        (p, replace(base, memory_gb=m, state_fraction=f))
        for f in fractions
        for m in memories
        for p in policies
    ]
    jobs = [(run, cfg) for p, cfg in points for run in (oracle_runs() if p == ORACLE else [p])]
    results = _combine_oracle(run_jobs(jobs, workers, _bar(len(jobs), progress)))
    order = {(p, c.memory_gb, c.state_fraction): i for i, (p, c) in enumerate(points)}
    for r in results:
        r["state_fraction"] = r["config"]["state_fraction"]
    results.sort(key=lambda r: order[(r["policy"], r["memory_gb"], r["state_fraction"])])
    bound = bound_token_hit_rate(trace)
    for r in results:
        r["share_of_bound"] = r["token_hit_rate"] / bound if bound else 0.0
    return {
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


def run_jobs(jobs: list[tuple[str, ServingConfig]], workers: int | None, bar: Any) -> list[Any]:
    """Every (policy run, config) job of the trace and model in `_WORK`, in
    parallel processes (forked: they inherit the trace)."""
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    results: list[dict[str, Any]] = []
    if workers <= 1:
        for p, cfg in jobs:
            results.append(_one(p, cfg))
            bar.update(1)
    else:
        import multiprocessing as mp

        ctx = mp.get_context("fork")
        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            futures = [pool.submit(_one, p, cfg) for p, cfg in jobs]
            for f in as_completed(futures):
                results.append(f.result())
                bar.update(1)
    bar.close()
    return results


def _combine_oracle(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fold the fixed-alpha runs of each point into one `marconi-oracle` result."""
    out = [r for r in results if not r["policy"].startswith(FIXED_ALPHA)]
    groups: dict[tuple[float, float], list[dict[str, Any]]] = {}
    for r in results:
        if r["policy"].startswith(FIXED_ALPHA):
            key = (r["memory_gb"], r["config"]["state_fraction"])
            groups.setdefault(key, []).append(r)
    return out + [oracle_result(runs) for runs in groups.values()]


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
