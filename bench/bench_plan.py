"""How long `mambaradix plan` takes on the full bundled Mooncake trace (issue 18's goal:
a sweep of >= 24 configurations in <= 5 minutes on 2 cores).

    .venv/bin/python bench/bench_plan.py                          # mooncake, 20% hits, 2 workers
    .venv/bin/python bench/bench_plan.py --target 0.3 --workers 1
    .venv/bin/python bench/bench_plan.py --target 0.3 --host-gb 250,1000   # with host memory

Runs `plan()` as the CLI does (trace loaded once, the bound and the memory ranges, then
the grid and bisection rounds on forked workers) and reports the wall time of the whole,
the replays it ran, the rounds, the sum of the replays' own seconds (what one core would
have spent on them alone) and that sum over the wall time (the parallel speed-up). Ends
with PASS / FAIL against the goal. With `--host-gb` (the host axis) it also prints the
peers' tiered rows at the recommended (device, host) memory, and whether the
recommendation has more token hits than `sglang-hicache` and `sglang-hicache-auto` there
(issue 18's target: beat SGLang's sizing at equal host bytes). Run it on an otherwise
idle machine: other load on the two cores counts in the wall time, so it also reports
CPU seconds (its own and its workers') over the workers: the time on that many idle cores.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from dataclasses import replace
from typing import Any

from mambaradix.geometry.profile import load_profile
from mambaradix.replay.plan import DEFAULT_HOST_COST, Goal, plan
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.workloads import load

GOAL_CONFIGS = 24
GOAL_S = 300.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="mooncake")
    ap.add_argument("--model", default="nemotron-h-8b")
    ap.add_argument("--target", type=float, default=0.2, help="token hit rate")
    ap.add_argument("--ttft-p95", type=float, default=None, help="also a p95 TTFT target, s")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--grid-points", type=int, default=3)
    ap.add_argument("--policies", default=None, help="comma-separated (default: plan's)")
    ap.add_argument("--state-fractions", default=None, help="comma-separated (default: plan's)")
    ap.add_argument("--host-gb", default=None, help="comma-separated host GB (default: none)")
    ap.add_argument("--host-cost", type=float, default=DEFAULT_HOST_COST)
    ap.add_argument("--limit", type=int, default=None, help="the trace's first N requests")
    ap.add_argument("--json", default=None, help="write the plan's JSON here")
    args = ap.parse_args()
    start = time.perf_counter()
    trace = load(args.trace)
    if args.limit:
        trace = replace(trace, requests=trace.requests[: args.limit])
    loaded = time.perf_counter() - start
    data = plan(
        trace,
        load_profile(args.model),
        Goal(hit_rate=args.target, ttft_p95_s=args.ttft_p95),
        ServingConfig(memory_gb=1.0),
        policies=args.policies.split(",") if args.policies else None,
        state_fractions=[float(x) for x in args.state_fractions.split(",")]
        if args.state_fractions
        else None,
        grid_points=args.grid_points,
        workers=args.workers,
        host_gbs=[float(x) for x in args.host_gb.split(",")] if args.host_gb else None,
        host_cost=args.host_cost,
    ).to_json()
    wall = time.perf_counter() - start
    cpu = _cpu_s()
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
            f"recommended: {best['setting']} at {best['memory_gb']:g} GB device + "
            f"{best['host_gb']:g} GB host (cost {best['cost_gb']:.2f} device GB), "
            f"{best['token_hit_rate']:.1%} token hits, p95 TTFT {best['ttft_p95_s']:.3f} s"
        )
        _versus(best, data["defaults"])
    _cheapest(data["points"], Goal(hit_rate=args.target, ttft_p95_s=args.ttft_p95))
    # on a shared machine the wall time counts other load; CPU seconds / workers is what
    # the same work takes on that many idle cores (the replays are CPU-bound)
    print(
        f"CPU {cpu:.1f} s (this process and its workers): {cpu / args.workers:.1f} s on "
        f"{args.workers} idle cores"
    )
    ok = data["replays"] >= GOAL_CONFIGS and wall <= GOAL_S
    print(f"{'PASS' if ok else 'FAIL'}: >= {GOAL_CONFIGS} configurations in <= {GOAL_S:g} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)


def _versus(best: dict[str, Any], defaults: dict[str, Any]) -> None:
    """The peers' rows at the recommended memory, and whether the recommendation beats
    each on token hits (a tie is within 0.1 point: reported as a tie)."""
    for name, d in defaults.items():
        if not d["runs"]:
            print(f"  {name}: does not run ({d['why']})")
            continue
        gap = best["token_hit_rate"] - d["token_hit_rate"]
        verdict = "tie" if abs(gap) < 0.001 else ("beats" if gap > 0 else "LOSES to")
        print(
            f"  {name} ({d['setting']}) at the same memory: {d['token_hit_rate']:.1%} token "
            f"hits, p95 TTFT {d['ttft_p95_s']:.3f} s: recommendation {verdict} it "
            f"({gap * 100:+.1f} points)"
        )


def _cheapest(points: list[dict[str, Any]], goal: Goal) -> None:
    """Per policy and host memory searched: the least memory cost replayed that meets
    the target (what each row needs to buy, the peers' included when searched)."""
    for key in sorted({(r["policy"], r["host_gb"]) for r in points}):
        ok = [r for r in points if (r["policy"], r["host_gb"]) == key and goal.met(r)]
        if not ok:
            print(f"  {key[0]} at {key[1]:g} GB host: no point searched meets the target")
            continue
        r = min(ok, key=lambda r: r["cost_gb"])
        print(
            f"  {key[0]} at {key[1]:g} GB host: least searched meeting the target "
            f"{r['memory_gb']:g} GB device (cost {r['cost_gb']:.2f}), "
            f"{r['token_hit_rate']:.1%} token hits ({r['setting']})"
        )


def _cpu_s() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        use = resource.getrusage(who)
        total += use.ru_utime + use.ru_stime
    return total


if __name__ == "__main__":
    main()
