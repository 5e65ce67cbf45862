"""Cost of `insert`'s KV ownership check on the core benchmark (issues 7, 19): off vs on.

    .venv/bin/python bench/bench_held_kv.py [--repeats 7 --ops 40000]

Replays `bench_vs_sglang.py`'s serving-like op sequence (same generator, same defaults),
in one process, through two trees, in both modes (compat="sglang-0.5.15.post1" and the
default), in rotating order:

* nocheck: the tree as a tree alone is built by default (no KV pool attached: unchecked);
* head:    the same tree attached to a KV pool's owner map (`pools.ownership.SlotOwners`,
           one byte per slot, every slot a request's at the start: the sequence allocates
           its indices from a counter and never frees one), what the replay and the engine
           run (a `CacheManager` attaches its KV allocator, whose map this is);
* set:     the same tree with `check_kv=True`: a tree alone's own record of held KV
           indices (`core.ownership.HeldSet`, a set), the opt-in without a pool.

The replay's own wall time with the check on and off: `bench/bench_ownership_replay.py`.
"""

from __future__ import annotations

import argparse
import gc
import io
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from drivers import REPO, Ours, replay, warm_allocator  # noqa: E402
from workload import OP_NAMES, WorkloadConfig, generate  # noqa: E402

MODES = {"compat": "sglang-0.5.15.post1", "default": None}
TREES = ("nocheck", "head", "set")
SLOTS = 1 << 25  # the map's slots: above every index of the sequence at its defaults


def load_tree(src: Path) -> Any:
    """Import `src`/mambaradix and return its MambaRadixCache; forget the modules after, so
    the next import loads another copy (the class keeps its own module globals)."""
    for name in [m for m in sys.modules if m == "mambaradix" or m.startswith("mambaradix.")]:
        del sys.modules[name]
    sys.path.insert(0, str(src))
    try:
        import mambaradix

        return mambaradix.MambaRadixCache
    finally:
        sys.path.remove(str(src))
        for name in [m for m in sys.modules if m == "mambaradix" or m.startswith("mambaradix.")]:
            del sys.modules[name]


def export_src(rev: str, into: Path) -> Path:
    tar = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev, "src"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(into, filter="data")
    return into / "src"


def with_pool(cls: Any) -> Any:
    """`cls` attached to a stand-in pool's owner map (see the docstring)."""
    from mambaradix.pools.ownership import SlotOwners

    class Pooled(cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.attach_kv_owner(SlotOwners(bytearray(SLOTS)))

    return Pooled


def with_check(cls: Any) -> Any:
    """`cls` built with check_kv=True."""

    class Checked(cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, check_kv=True, **kwargs)

    return Checked


def per_op_median(runs: list[Any], n: int) -> list[int]:
    """Each op's median time over repeats (-1 where the op did nothing)."""
    return [int(statistics.median(r.times[i] for r in runs)) for i in range(n)]


def timed_ms(r: Any) -> float:
    return sum(t for t in r.times if t >= 0) / 1e6


def report(w: Any, runs: dict[tuple[str, str], list[Any]], trees: tuple[str, ...]) -> None:
    kinds = [OP_NAMES[op[0]] for op in w.ops]
    print("\nms: sum over ops of each op's median over repeats; ratios of those sums")
    for m in MODES:
        med = {t: per_op_median(runs[t, m], len(w.ops)) for t in trees}
        for kind in ("insert", "evict", "all"):
            tot = {
                t: sum(
                    x for x, k in zip(med[t], kinds, strict=True) if x >= 0 and kind in (k, "all")
                )
                for t in trees
            }
            print(
                f"{m:>8} {kind:>6}: "
                + ", ".join(f"{t} {tot[t] / 1e6:.1f}" for t in trees)
                + f"; head/nocheck {tot['head'] / tot['nocheck']:.3f}"
                + f", set/nocheck {tot['set'] / tot['nocheck']:.3f}"
            )
        for ref in ("nocheck",):
            rs = [
                timed_ms(h) / timed_ms(b)
                for h, b in zip(runs["head", m], runs[ref, m], strict=True)
            ]
            print(
                f"{'':>17}head/{ref} of each repeat's totals: median {statistics.median(rs):.3f}"
                f" (range {min(rs):.3f}-{max(rs):.3f})"
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--ops", type=int, default=40_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    warm_allocator()
    head = load_tree(REPO / "src")
    classes = {"nocheck": head, "head": with_pool(head), "set": with_check(head)}
    w = generate(WorkloadConfig(seed=args.seed, n_ops=args.ops))
    print(f"workload: {w.describe()}; repeats={args.repeats}")
    trees = TREES
    pairs = [(t, m) for m in MODES for t in trees]
    for t, m in pairs:  # warm-up
        replay(w, Ours(MODES[m], cache_cls=classes[t]), limit=3000)
    runs: dict[tuple[str, str], list[Any]] = {p: [] for p in pairs}
    for rep in range(args.repeats):
        for t, m in pairs[rep % len(pairs) :] + pairs[: rep % len(pairs)]:
            gc.collect()
            runs[t, m].append(replay(w, Ours(MODES[m], cache_cls=classes[t])))
        print(
            f"repeat {rep + 1}: "
            + " ".join(f"{t}/{m}={timed_ms(runs[t, m][-1]):.0f}" for t, m in pairs)
        )
    report(w, runs, trees)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
