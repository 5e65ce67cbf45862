"""The replay with lower tiers: ours against the peers' tiered rows and the ideal bound.

    .venv/bin/python bench/bench_tiers_replay.py                   # Mooncake, ~6 min, 2 cores
    .venv/bin/python bench/bench_tiers_replay.py --points 80:1000 --policies mambaradix
    .venv/bin/python bench/bench_tiers_replay.py --trace synthetic-agent --points 1:0,1:20

For each (device GB, host GB[, store GB]) point of `--points` and each policy of
`--policies`, one `replay()` (the same as `mambaradix replay --memory D --host-gb H
--store-gb S`): token hit rate, its share of the ideal bound (unlimited memory, a state
everywhere: `replay.bound`), the tokens loaded from host and store, TTFT p50 / p95 and the
seconds spent loading. Then, per point, ours (`mambaradix`) against each peer row as a
difference of token hit rates in points, and the issue-17 target at 80 GB + 1 TB: ours
>= 90% of the bound. The break-even length (tokens beyond which loading from host beats
recomputing, `tiers.cost.break_even` on the run's links and prefill rate) is printed once.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from mambaradix.geometry.profile import get_profile  # noqa: E402
from mambaradix.replay.bound import bound_token_hit_rate  # noqa: E402
from mambaradix.replay.run import replay  # noqa: E402
from mambaradix.replay.serving import ServingConfig  # noqa: E402
from mambaradix.replay.trace import Trace  # noqa: E402
from mambaradix.replay.workloads import load  # noqa: E402

POINTS = "40:0,40:1000,80:0,80:250,80:1000,80:250:1000,160:0,160:1000"
POLICIES = "mambaradix,sglang-hicache,vllm-offload"
OURS = "mambaradix"


def parse_points(text: str) -> list[tuple[float, float, float]]:
    out = []
    for part in text.split(","):
        nums = [float(x) for x in part.split(":")]
        if not 2 <= len(nums) <= 3 or min(nums) < 0 or nums[0] <= 0:
            raise SystemExit(f"--points: expected DEVICE:HOST[:STORE] GB, got {part!r}")
        out.append((nums[0], nums[1], nums[2] if len(nums) == 3 else 0.0))
    return out


def load_trace(name: str, limit: int | None) -> Trace:
    trace = load(name)
    if limit is not None:
        trace = Trace(trace.name, trace.requests[:limit], trace.unit_tokens)
    return trace


def one(job: tuple[str, int | None, str, str, tuple[float, float, float]]) -> dict[str, Any]:
    name, limit, model, policy, (device, host, store) = job
    cfg = ServingConfig(memory_gb=device, host_gb=host, store_gb=store)
    r = replay(load_trace(name, limit), get_profile(model), policy, cfg).to_json()
    r["point"] = [device, host, store]
    return r


def row(r: dict[str, Any], bound: float) -> str:
    d, h, s = r["point"]
    prompt = max(1, r["prompt_tokens"])
    host = r.get("host_hit_tokens", 0) / prompt
    store = r.get("store_hit_tokens", 0) / prompt
    return (
        f"{d:>6g} {h:>6g} {s:>6g}  {r['policy']:<15} {r['token_hit_rate']:>7.1%} "
        f"{r['token_hit_rate'] / bound:>8.1%} {host:>7.1%} {store:>7.1%} "
        f"{r['ttft_p50_s']:>8.3f} {r['ttft_p95_s']:>8.3f} {r.get('load_s', 0.0):>9.1f} "
        f"{r['dropped']:>7}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="mooncake")
    ap.add_argument("--model", default="nemotron-h-8b")
    ap.add_argument("--points", default=POINTS, help="DEVICE:HOST[:STORE] GB, comma-separated")
    ap.add_argument("--policies", default=POLICIES)
    ap.add_argument("--limit", type=int, default=None, help="only the first N requests")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default=None, help="write every result here")
    args = ap.parse_args()
    points, policies = parse_points(args.points), args.policies.split(",")
    trace = load_trace(args.trace, args.limit)
    bound = bound_token_hit_rate(trace)
    jobs = [(args.trace, args.limit, args.model, p, pt) for pt in points for p in policies]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(one, jobs))
    print(f"trace {args.trace}: {len(trace)} requests; model {args.model}; bound {bound:.1%}")
    print(
        "device   host  store  policy          tok hit of bound    host   store "
        "TTFT p50 TTFT p95  load s  dropped"
    )
    for r in results:
        print(row(r, bound))
    print("\nours - peer, token hit rate in points:")
    for pt in points:
        at = {r["policy"]: r for r in results if tuple(r["point"]) == pt}
        if OURS not in at:
            continue
        diffs = [
            f"{p} {100 * (at[OURS]['token_hit_rate'] - at[p]['token_hit_rate']):+.1f}"
            for p in policies
            if p != OURS and p in at
        ]
        print(f"  {pt[0]:g}+{pt[1]:g}+{pt[2]:g} GB: {', '.join(diffs)}")
        if pt == (80.0, 1000.0, 0.0):
            share = at[OURS]["token_hit_rate"] / bound
            print(f"  target (80 GB + 1 TB host, ours >= 90% of bound): {share:.1%}")
    even = next((r["break_even_tokens"] for r in results if r.get("break_even_tokens")), None)
    print(f"break-even (tokens; load beats recompute beyond): {even}")
    if args.json:
        Path(args.json).write_text(json.dumps({"bound": bound, "results": results}, indent=1))


if __name__ == "__main__":
    main()
