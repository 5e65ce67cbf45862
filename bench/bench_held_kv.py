"""Cost of `insert`'s KV ownership check (issue 7): the tree before it vs this checkout.

    .venv/bin/python bench/bench_held_kv.py [--base 6b439c9 --repeats 7 --ops 40000 --parts]

Replays `bench_vs_sglang.py`'s serving-like op sequence (same generator, same defaults),
in one process, through three trees, in both modes (compat="sglang-0.5.15.post1" and the default):

* base:    the tree at commit `--base` (before any KV ownership check), exported from git
           into a scratch directory and imported under its own module objects;
* nocheck: this checkout's tree with its record of held KV indices replaced by one that
           accepts everything and records nothing (the check's own cost, nothing else);
* head:    this checkout's tree as shipped.

With `--parts`, one more tree splits the check's cost in two:

* mark:    claims take the indices as one run without proving it (unsafe; measured only
           for the split): they check and mark the byte map through `HeldKV`'s general
           paths (`_any_held`, `_mark_run`, slower than `claim`'s inlined fast path);
           releases are `HeldKV`'s own. head - mark is then the run proof (a lower bound),
           mark - nocheck the byte map (an upper bound).
"""

from __future__ import annotations

import argparse
import gc
import io
import statistics
import subprocess
import sys
import tarfile
import tempfile
from array import array
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from drivers import REPO, replay_ours, warm_allocator  # noqa: E402
from workload import OP_NAMES, WorkloadConfig, generate  # noqa: E402

MODES = {"compat": "sglang-0.5.15.post1", "default": None}
TREES = ("base", "nocheck", "head")
PARTS = ("mark",)


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


class AcceptAll:
    """Stands in for `HeldKV`: every claim succeeds as one run, nothing is recorded."""

    def claim(self, values: array[int], start: int, keep: int) -> bool:
        return True

    def release(self, values: array[int], run: bool) -> None:
        pass


def part_trees(head: Any) -> dict[str, Any]:
    """The --parts tree, built on `head`'s own copy of `HeldKV` (see the docstring)."""
    held_kv = head._init_tree.__globals__["HeldKV"]

    class MarkOnly(held_kv):  # type: ignore[misc, valid-type]
        def claim(self, values: array[int], start: int, keep: int) -> bool | None:
            n = len(values) - start
            if n <= 0:
                return True
            a = values[start]
            if self._any_held(a, a + n):
                return None
            self._mark_run(a + keep - start, a + n)
            return True

    return {"mark": with_held(head, MarkOnly)}


def with_held(cls: Any, make: Any) -> Any:
    """`cls` with its record of held KV indices made by `make()`."""

    class Swapped(cls):  # type: ignore[misc, valid-type]
        def _init_tree(self) -> None:
            super()._init_tree()
            self._held_kv = make()

    return Swapped


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
                + f"; head/base {tot['head'] / tot['base']:.3f}"
                + f", head/nocheck {tot['head'] / tot['nocheck']:.3f}"
            )
        for ref in ("base", "nocheck"):
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
    ap.add_argument("--base", default="6b439c9", help="git revision without the check")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--ops", type=int, default=40_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parts", action="store_true", help="also time the mark tree")
    args = ap.parse_args(argv)
    warm_allocator()
    with tempfile.TemporaryDirectory() as tmp:
        classes = {"base": load_tree(export_src(args.base, Path(tmp)))}
    head = load_tree(REPO / "src")
    classes.update(nocheck=with_held(head, AcceptAll), head=head, **part_trees(head))
    w = generate(WorkloadConfig(seed=args.seed, n_ops=args.ops))
    print(f"workload: {w.describe()}; base={args.base}; repeats={args.repeats}")
    trees = TREES + (PARTS if args.parts else ())
    pairs = [(t, m) for m in MODES for t in trees]
    for t, m in pairs:  # warm-up
        replay_ours(w, MODES[m], limit=3000, cache_cls=classes[t])
    runs: dict[tuple[str, str], list[Any]] = {p: [] for p in pairs}
    for rep in range(args.repeats):
        for t, m in pairs[rep % len(pairs) :] + pairs[: rep % len(pairs)]:
            gc.collect()
            runs[t, m].append(replay_ours(w, MODES[m], cache_cls=classes[t]))
        print(
            f"repeat {rep + 1}: "
            + " ".join(f"{t}/{m}={timed_ms(runs[t, m][-1]):.0f}" for t, m in pairs)
        )
    report(w, runs, trees)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
