"""Speed of the multi-instance replay: the full Mooncake trace behind every router.

    .venv/bin/python bench/bench_cluster.py                  # 8 instances, 40 GB each, 2 workers
    .venv/bin/python bench/bench_cluster.py --instances 4 --memory 20 --workers 1
    .venv/bin/python bench/bench_cluster.py --profile hybrid # cProfile of one router's run
    .venv/bin/python bench/bench_cluster.py --trace swe-agent --instances 4 --memory 1 \
        --routes-differ kv-overlap,hybrid   # requests two routers place apart, each run's time

Issue 10's goal: all five routers at one memory point in under 3 minutes on 2 cores. The
wall time covers everything `mambaradix replay --instances 8` does (loading the trace,
the bound, the sweep over two processes). The peer, in the same run: one
single-instance replay of the same trace and policy (the work of `mambaradix replay`
per cell), so that the ratio says what the cluster costs whatever the machine.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
from pathlib import Path
from typing import Any

from mambaradix.geometry.profile import ModelProfile, get_profile
from mambaradix.replay.cluster import Cluster, ClusterSpec, cluster_replay
from mambaradix.replay.cluster_cli import table
from mambaradix.replay.routers import ROUTERS, make_router
from mambaradix.replay.run import replay
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.sweep import sweep
from mambaradix.replay.workloads import load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="mooncake")
    ap.add_argument("--model", default="nemotron-h-8b")
    ap.add_argument("--policy", default="mambaradix")
    ap.add_argument("--memory", type=float, default=40.0, help="GB per instance")
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--profile", default=None, help="cProfile one router's run instead")
    ap.add_argument(
        "--routes-differ", default=None, help="A,B: requests the two routers place apart"
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    profile, cfg = get_profile(args.model), ServingConfig(memory_gb=args.memory)
    spec = ClusterSpec(args.instances)
    if args.routes_differ:
        routes_differ(args.trace, profile, args.policy, cfg, spec, args.routes_differ.split(","))
        return
    if args.profile:
        trace = load(args.trace)
        with cProfile.Profile() as prof:
            cluster_replay(trace, profile, args.policy, cfg, args.profile, spec)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
        return
    start = time.perf_counter()
    trace = load(args.trace)
    data = sweep(
        trace,
        profile,
        [args.policy],
        [args.memory],
        cfg,
        workers=args.workers,
        progress=False,
        routers=list(ROUTERS),
        cluster=spec,
    ).to_json()
    wall = time.perf_counter() - start
    single = replay(trace, profile, args.policy, cfg)["replay_s"]
    print(table(data))
    print()
    cells = {r["router"]: r["replay_s"] for r in data["results"]}
    print("replay time per router (one process each): ")
    print("  " + ", ".join(f"{k} {v:.1f} s" for k, v in cells.items()))
    print(f"one single-instance replay of the same trace and policy (the peer): {single:.1f} s")
    print(
        f"{args.instances} instances x {len(cells)} routers, {args.workers} workers: "
        f"{wall:.1f} s wall ({wall / single:.1f}x one single-instance run; goal: < 180 s)"
    )
    if args.json:
        data["bench"] = {"wall_s": wall, "single_instance_s": single, "workers": args.workers}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(data, indent=1))


def routes_differ(
    name: str,
    profile: ModelProfile,
    policy: str,
    cfg: ServingConfig,
    spec: ClusterSpec,
    pair: list[str],
) -> None:
    trace = load(name)
    placed = {}
    for router in pair:
        c = Cluster(trace, profile, policy, cfg, make_router(router, spec.overlap_weight), spec)
        start = time.perf_counter()
        c.run()
        took = time.perf_counter() - start
        placed[router] = [r.instance for r in c.routes if r is not None]
        print(f"{router}: {took:.1f} s")
    for router in pair:
        stay, later = sticky(trace.requests, placed[router])
        print(
            f"{router}: {stay} of {later} later turns ({stay / max(later, 1):.1%}) placed "
            "where their session's previous turn went"
        )
    a, b = (placed[r] for r in pair)
    apart = sum(x != y for x, y in zip(a, b, strict=True))
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
    print(
        f"{name}, {spec.instances} instances x {cfg.memory_gb:g} GB: {apart} of {len(a)} requests "
        f"({apart / len(a):.1%}) placed apart by {pair[0]} and {pair[1]}; "
        f"the first is request {first}"
    )


def sticky(requests: list[Any], instances: list[int]) -> tuple[int, int]:
    """(turns placed on the instance of their session's previous turn, turns that have a
    previous turn), in arrival order."""
    previous: dict[Any, int] = {}
    stay = later = 0
    for req, inst in zip(requests, instances, strict=True):
        if req.session_id in previous:
            later += 1
            stay += previous[req.session_id] == inst
        previous[req.session_id] = inst
    return stay, later


if __name__ == "__main__":
    main()
