"""How long `mambaradix plan` takes on the full bundled Mooncake trace (issue 18's goal:
a sweep of >= 24 configurations in <= 5 minutes on 2 cores).

    .venv/bin/python bench/bench_plan.py                          # mooncake, 20% hits, 2 workers
    .venv/bin/python bench/bench_plan.py --target 0.3 --workers 1

Runs `plan()` as the CLI does (trace loaded once, the bound and the memory ranges, then
the grid and bisection rounds on forked workers) and reports the wall time of the whole,
the replays it ran, the rounds, the sum of the replays' own seconds (what one core would
have spent on them alone) and that sum over the wall time (the parallel speed-up). Ends
with PASS / FAIL against the goal. Run it on an otherwise idle machine: other load on
the two cores counts in the wall time.
"""

from __future__ import annotations

import argparse
import json
import time

from mambaradix.replay.models import load_profile
from mambaradix.replay.plan import Goal, plan
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.workloads import load

GOAL_CONFIGS = 24
GOAL_S = 300.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="mooncake")
    ap.add_argument("--model", default="nemotron-h-8b")
    ap.add_argument("--target", type=float, default=0.2, help="token hit rate")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--grid-points", type=int, default=4)
    ap.add_argument("--json", default=None, help="write the plan's JSON here")
    args = ap.parse_args()
    start = time.perf_counter()
    trace = load(args.trace)
    loaded = time.perf_counter() - start
    data = plan(
        trace,
        load_profile(args.model),
        Goal(hit_rate=args.target),
        ServingConfig(memory_gb=1.0),
        grid_points=args.grid_points,
        workers=args.workers,
    )
    wall = time.perf_counter() - start
    replay_s = sum(r["replay_s"] for r in data["points"])
    best = data["recommended"]
    print(
        f"trace {args.trace} ({len(trace):,} requests, loaded in {loaded:.1f} s), "
        f"model {args.model}, target {args.target:.0%}, {args.workers} workers"
    )
    print(
        f"replays {data['replays']} in {data['rounds']} rounds; wall {wall:.1f} s; "
        f"replays' own time {replay_s:.1f} s (speed-up {replay_s / wall:.2f}x)"
    )
    if best is not None:
        print(
            f"recommended: {best['setting']} at {best['memory_gb']:g} GB, "
            f"{best['token_hit_rate']:.1%} token hits"
        )
    ok = data["replays"] >= GOAL_CONFIGS and wall <= GOAL_S
    print(f"{'PASS' if ok else 'FAIL'}: >= {GOAL_CONFIGS} configurations in <= {GOAL_S:g} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)


if __name__ == "__main__":
    main()
