"""The compiled core against the pure-Python one, on the core benchmark's serving sequence.

    .venv/bin/python bench/bench_compiled.py [--repeats 5 --ops 40000]

Loads both builds of the core in this one process (`tests/core_builds.py`: compiled first,
then pure) and replays `bench_vs_sglang.py`'s serving-like op sequence (same generator,
same defaults) through each, in every mode (the default, compat="sglang-0.5.15.post1",
compat="sglang-0.5.23"), plus the default mode with the tree's own KV check
(check_kv=True), in rotating order after a warm-up. Tree time only (`drivers.replay`
times each call). Prints each repeat's totals and, per mode, the median over repeats of
pure / compiled (> 1: the compiled core is faster). Needs the compiled build
(`pip install -e .`, docs/build.md).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent / "tests")]

from core_builds import load_cache_class  # noqa: E402
from drivers import Ours, replay, warm_allocator  # noqa: E402
from workload import WorkloadConfig, generate  # noqa: E402

MODES: dict[str, dict[str, Any]] = {
    "default": {"compat": None},
    "default+check_kv": {"compat": None, "check_kv": True},
    "sglang-0.5.15": {"compat": "sglang-0.5.15.post1"},
    "sglang-0.5.23": {"compat": "sglang-0.5.23"},
}
BUILDS = ("compiled", "pure")


def with_options(cls: Any, options: dict[str, Any]) -> Any:
    """`cls` built with `options` beyond `drivers.Ours`'s (check_kv)."""
    extra = {k: v for k, v in options.items() if k != "compat"}

    class Built(cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs, **extra)

    return Built


def timed_ms(r: Any) -> float:
    return sum(t for t in r.times if t >= 0) / 1e6


def per_op_median_ms(replays: list[Any]) -> float:
    """The sum over ops of each op's median time over repeats: a burst of load on a shared
    machine lengthens some ops of one repeat, not the median."""
    n = len(replays[0].times)
    medians = (statistics.median(r.times[i] for r in replays) for i in range(n))
    return sum(t for t in medians if t >= 0) / 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ops", type=int, default=40_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    warm_allocator()
    classes = {b: load_cache_class(b) for b in BUILDS}  # compiled first (see core_builds)
    w = generate(WorkloadConfig(seed=args.seed, n_ops=args.ops))
    print(f"workload: {w.describe()}; repeats={args.repeats}")
    runs = [(b, m) for m in MODES for b in BUILDS]
    built = {(b, m): with_options(classes[b], MODES[m]) for b, m in runs}
    for b, m in runs:  # warm-up
        replay(w, Ours(MODES[m]["compat"], cache_cls=built[b, m]), limit=3000)
    replays: dict[tuple[str, str], list[Any]] = {r: [] for r in runs}
    for rep in range(args.repeats):
        for b, m in runs[rep % len(runs) :] + runs[: rep % len(runs)]:
            gc.collect()
            replays[b, m].append(replay(w, Ours(MODES[m]["compat"], cache_cls=built[b, m])))
        print(
            f"repeat {rep + 1}: "
            + " ".join(f"{b}/{m}={timed_ms(replays[b, m][-1]):.0f}" for b, m in runs)
        )
    print("\ntree time, ms: the sum over ops of each op's median over repeats")
    for m in MODES:
        if replays["compiled", m][0].sig != replays["pure", m][0].sig:
            raise SystemExit(f"{m}: the two builds decided differently")
        c, p = (per_op_median_ms(replays[b, m]) for b in BUILDS)
        print(f"{m:>17}: compiled {c:7.0f}  pure {p:7.0f}  pure/compiled {p / c:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
