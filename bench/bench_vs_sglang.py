"""SGLang's trees and ours, side by side on one serving-like op sequence.

    .venv/bin/python bench/bench_vs_sglang.py [--seed 0 --ops 40000 --repeats 3 --json out.json]

Replays the same seeded op list (see `workload.py`) through
  (a) upstream: SGLang 0.5.15.post1's own class, called directly as its scheduler does
      (`drivers.py`),
  (b) ours with compat="sglang-0.5.15.post1": the same decisions as (a) -- every match's prefix
      length and branching length, every insert's prefix length and state-existed flag, every
      eviction's counts, a hash of every 16th match's KV indices and the final sizes are
      asserted equal, so both time identical work,
  (c) ours with compat=None (default): the fixed behaviour; decisions may differ (it never
      splits on match and refreshes only the state a match uses), so only its time is shown,
  (d) SGLang 0.5.23's `UnifiedRadixCache` over its compiled Rust tree core (its default
      backend), loaded from the wheel's extension (`tests/upstream_unified.py`),
  (e) the same class over its Python tree core,
  (f) ours with compat="sglang-0.5.23": its decisions asserted equal to (d)'s and (e)'s.
Each repeat builds fresh caches; the replays run in rotating order. Per op, the median
over repeats is taken; the tables summarise those medians. `--sides` picks a subset.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from array import array
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from drivers import (  # noqa: E402
    Ours,
    Replay,
    Side,
    Unified,
    Upstream,
    add_common_args,
    picked,
    replay,
    set_torch_threads,
    timer_overhead_ns,
    warm_allocator,
)
from workload import OP_NAMES, Workload, WorkloadConfig, generate  # noqa: E402

SIDES = (
    "upstream",
    "ours_sglang",
    "ours_default",
    "sglang_0523_rust",
    "sglang_0523_py",
    "ours_0523",
)
SHORT = {
    "upstream": "sglang 0.5.15",
    "ours_sglang": "ours(c0.5.15)",
    "ours_default": "ours(default)",
    "sglang_0523_rust": "0.5.23 rust",
    "sglang_0523_py": "0.5.23 python",
    "ours_0523": "ours(c0.5.23)",
}
# (reference, side): pairs asserted to decide the same on every op
SAME_WORK = (
    ("upstream", "ours_sglang"),
    ("sglang_0523_rust", "ours_0523"),
    ("sglang_0523_py", "ours_0523"),
)
# (reference, side): time ratios reported, reference time / side time
RATIOS = (
    ("upstream", "ours_sglang"),
    ("upstream", "ours_default"),
    ("sglang_0523_rust", "ours_0523"),
    ("sglang_0523_rust", "ours_default"),
    ("sglang_0523_py", "ours_0523"),
    ("sglang_0523_py", "sglang_0523_rust"),
)
COMPAT = {"ours_sglang": "sglang-0.5.15.post1", "ours_default": None, "ours_0523": "sglang-0.5.23"}
BACKEND = {"sglang_0523_rust": "rust", "sglang_0523_py": "python"}


def machine() -> dict[str, Any]:
    import torch

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch": torch.__version__,
    }


def make_side(side: str, args: argparse.Namespace) -> Side:
    if side == "upstream":
        return Upstream(args.page_size, args.chunk_size)
    if side in BACKEND:
        return Unified(BACKEND[side], args.page_size, args.chunk_size, not args.untimed_indices)
    return Ours(COMPAT[side], args.page_size, args.chunk_size)


def run_side(side: str, w: Workload, args: argparse.Namespace, limit: int | None = None) -> Replay:
    gc.collect()
    if args.no_gc:
        gc.disable()
    try:
        return replay(w, make_side(side, args), limit)
    finally:
        gc.enable()


def check_same(w: Workload, a: Replay, b: Replay, names: tuple[str, str]) -> int:
    """Assert side b decided exactly what side a decided; returns ops compared."""
    bad = [
        i for i in range(len(w.ops)) if a.sig[i] != b.sig[i] or (a.times[i] < 0) != (b.times[i] < 0)
    ]
    if bad:
        i = bad[0]
        raise AssertionError(
            f"{len(bad)} ops differ between {names[0]} and {names[1]}; first: op #{i} "
            f"{w.ops[i]}: {names[0]}={a.sig[i]} {names[1]}={b.sig[i]}"
        )
    if a.sizes != b.sizes:
        raise AssertionError(f"final sizes differ: {names[0]}={a.sizes} {names[1]}={b.sizes}")
    return sum(1 for s in a.sig if s is not None)


def per_op_median(runs: list[Replay], n: int) -> array[int]:
    if len(runs) == 1:
        return runs[0].times
    out = array("q", [-1]) * n
    cols = [r.times for r in runs]
    for i in range(n):
        xs = [c[i] for c in cols]
        if min(xs) >= 0:
            out[i] = int(statistics.median(xs))
    return out


def summarise(
    w: Workload, times: dict[str, array[int]], overhead: int, sides: tuple[str, ...]
) -> dict[str, Any]:
    """Per op type and overall: count, median / mean µs, total ms per side; ratios
    (``ratio_<side>_vs_<reference>``; the 0.5.15 pairs keep their old keys ``ratio_<side>``)."""
    kinds = [OP_NAMES[op[0]] for op in w.ops]
    table: dict[str, Any] = {}
    for kind in (*OP_NAMES, "all"):
        row: dict[str, Any] = {}
        for side in sides:
            xs = [
                t - overhead
                for t, k in zip(times[side], kinds, strict=True)
                if t >= 0 and (kind == "all" or k == kind)
            ]
            if not xs:
                continue
            row[side] = {
                "count": len(xs),
                "median_us": statistics.median(xs) / 1e3,
                "mean_us": statistics.fmean(xs) / 1e3,
                "total_ms": sum(xs) / 1e6,
            }
        for ref, side in RATIOS:
            if ref not in row or side not in row:
                continue
            ratios = [
                (u - overhead) / max(o - overhead, 1)
                for u, o, k in zip(times[ref], times[side], kinds, strict=True)
                if u >= 0 and o >= 0 and (kind == "all" or k == kind)
            ]
            row[ratio_key(ref, side)] = {
                "total": row[ref]["total_ms"] / row[side]["total_ms"],
                "median_of_per_op": statistics.median(ratios) if ratios else float("nan"),
                "ops_compared": len(ratios),
            }
        table[kind] = row
    return table


def ratio_key(ref: str, side: str) -> str:
    return f"ratio_{side}" if ref == "upstream" else f"ratio_{side}_vs_{ref}"


def print_table(table: dict[str, Any], sides: tuple[str, ...]) -> None:
    head = f"{'op':<7}{'count':>7} | " + " | ".join(f"{SHORT[s]:>13} med µs  tot ms" for s in sides)
    print(head)
    print("-" * len(head))
    for kind, row in table.items():
        present = [s for s in sides if s in row]
        if not present:
            continue
        line = f"{kind:<7}{row[present[0]]['count']:>7} | "
        cells = []
        for s in sides:
            r = row.get(s)
            cells.append(
                " " * 28 if r is None else f"{r['median_us']:>20.2f} {r['total_ms']:>7.1f}"
            )
        print(line + " | ".join(cells))
    pairs = [(ref, side) for ref, side in RATIOS if ref in sides and side in sides]
    if not pairs:
        return
    print()
    print("time ratios, reference / side: total-time ratio (median of per-op ratios)")
    names = [f"{SHORT[ref]} / {SHORT[side]}" for ref, side in pairs]
    print(f"{'op':<7} | " + " | ".join(f"{n:>29}" for n in names))
    for kind, row in table.items():
        cells = []
        for (ref, side), n in zip(pairs, names, strict=True):
            r = row.get(ratio_key(ref, side))
            text = "" if r is None else f"{r['total']:.2f}x ({r['median_of_per_op']:.2f}x)"
            cells.append(f"{text:>{max(len(n), 29)}}")
        print(f"{kind:<7} | " + " | ".join(cells))


def profile(w: Workload, args: argparse.Namespace, sides: tuple[str, ...]) -> None:
    """cProfile one replay per side; top functions by own time (the replay loop itself is the
    bench's driver: its own time is input building, not cache work)."""
    import cProfile
    import pstats

    for side in sides:
        prof = cProfile.Profile()
        prof.enable()
        run_side(side, w, args)
        prof.disable()
        print(f"\n=== cProfile: {side} (top {args.profile} by own time) ===")
        stats = pstats.Stats(prof)
        stats.strip_dirs().sort_stats("tottime").print_stats(args.profile)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ops", type=int, default=40_000, help="ops in the sequence (approximate)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, help="write all results here")
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--kv-budget", type=int, default=120_000)
    ap.add_argument("--state-budget", type=int, default=192)
    ap.add_argument(
        "--cut-frac",
        type=float,
        default=0.25,
        help="share of steps that are random-cut prefix probes",
    )
    ap.add_argument("--no-gc", action="store_true", help="disable the cyclic GC during replays")
    ap.add_argument(
        "--raw-timer",
        action="store_true",
        help="do not subtract the empty perf_counter_ns pair's cost from each op",
    )
    ap.add_argument("--warmup", type=int, default=3000, help="ops replayed per side before timing")
    ap.add_argument("--skip-upstream-check", action="store_true")
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after timing, cProfile one replay of each of our modes; print the top N functions",
    )
    ap.add_argument(
        "--profile-upstream", action="store_true", help="with --profile, profile upstream too"
    )
    ap.add_argument(
        "--untimed-indices",
        action="store_true",
        help="SGLang 0.5.23: read a hit's KV indices off the path after the timer, not inside",
    )
    add_common_args(ap, "--sides", SIDES)
    args = ap.parse_args(argv)
    sides = picked(ap, "--sides", args.sides, SIDES)
    warm_allocator()
    set_torch_threads(args.torch_threads)
    if args.page_size != 1:
        ap.error("the workload's keys are not page-aligned; use --page-size 1")

    info = machine()
    print("machine: " + ", ".join(f"{k}={v}" for k, v in info.items()))
    cfg = WorkloadConfig(
        seed=args.seed,
        n_ops=args.ops,
        tenants=args.tenants,
        concurrency=args.concurrency,
        max_turns=args.max_turns,
        kv_budget=args.kv_budget,
        state_budget=args.state_budget,
        p_cut_match=args.cut_frac,
    )
    t0 = time.perf_counter()
    w = generate(cfg)
    print(f"workload ({time.perf_counter() - t0:.1f}s to generate): {w.describe()}")
    print(
        f"cache: page_size={args.page_size} chunk_size={args.chunk_size}; "
        f"repeats={args.repeats}; gc={'off' if args.no_gc else 'on'}"
    )
    overhead = 0 if args.raw_timer else timer_overhead_ns()
    print(
        f"timer: empty perf_counter_ns pair = {timer_overhead_ns()} ns "
        f"({'kept in' if args.raw_timer else 'subtracted from'} every op)"
    )

    for side in sides:  # warm-up: imports, torch's first calls, code paths
        run_side(side, w, args, limit=min(args.warmup, len(w.ops)))

    pairs = [(a, b) for a, b in SAME_WORK if a in sides and b in sides]
    runs: dict[str, list[Replay]] = {s: [] for s in sides}
    walls: dict[str, list[float]] = {s: [] for s in sides}
    for rep in range(args.repeats):
        k = rep % len(sides)
        for side in sides[k:] + sides[:k]:
            t0 = time.perf_counter()
            runs[side].append(run_side(side, w, args))
            walls[side].append(time.perf_counter() - t0)
        checked = []
        if not args.skip_upstream_check:
            for a, b in pairs:
                n_checked = check_same(w, runs[a][-1], runs[b][-1], (a, b))
                checked.append(f"{b} == {a} on all {n_checked} ops with a result")
        totals = {s: sum(t for t in runs[s][-1].times if t >= 0) / 1e6 for s in sides}
        print(
            f"repeat {rep + 1}/{args.repeats}: timed ms "
            + " ".join(f"{s}={totals[s]:.1f}" for s in sides)
            + "".join(f"; {c}" for c in checked)
        )

    n = len(w.ops)
    med = {s: per_op_median(runs[s], n) for s in sides}
    table = summarise(w, med, overhead, sides)
    last = {s: runs[s][-1] for s in sides}
    print()
    print(
        "final tree: "
        + ", ".join(
            f"{s}: {last[s].nodes if last[s].nodes >= 0 else '?'} nodes, "
            f"sizes(kv ev/prot, st ev/prot)={last[s].sizes}"
            for s in sides
        )
    )
    print("matched tokens: " + ", ".join(f"{s}={last[s].matched_tokens}" for s in sides))
    print(
        "mean depth (nodes) of a locked node: "
        + ", ".join(f"{s}={last[s].lock_depth / max(last[s].locks, 1):.1f}" for s in sides)
    )
    print()
    print("per-op time, median over repeats per op (µs = microseconds):")
    print_table(table, sides)
    print()
    per_rep = {s: [sum(t for t in r.times if t >= 0) / 1e6 for r in runs[s]] for s in sides}
    for ref, side in RATIOS:
        if ref not in sides or side not in sides:
            continue
        r = table["all"][ratio_key(ref, side)]
        spread = [u / o for u, o in zip(per_rep[ref], per_rep[side], strict=True)]
        print(
            f"{SHORT[ref]:>13} / {SHORT[side]:<13}: total-time ratio {r['total']:.2f}x "
            f"(per repeat {min(spread):.2f}-{max(spread):.2f}x), "
            f"median per-op ratio {r['median_of_per_op']:.2f}x over {r['ops_compared']} ops"
        )
    if args.profile:
        ours = tuple(s for s in sides if s in COMPAT)
        profile(w, args, sides if args.profile_upstream else ours)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": info,
                    "workload": {**vars(cfg), "n_ops_actual": n, **w.stats},
                    "args": {
                        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                    },
                    "timer_overhead_ns": overhead,
                    "per_type": table,
                    "per_repeat_timed_ms": per_rep,
                    "per_repeat_wall_s": walls,
                },
                indent=2,
            )
        )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
