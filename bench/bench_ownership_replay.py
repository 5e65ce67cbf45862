"""The KV ownership check's cost on the replay itself (issue 19): wall time with it on vs off.

    .venv/bin/python bench/bench_ownership_replay.py [--repeats 3 --memory 20 --limit N]

Replays token-level traces (synthetic agent, synthetic multi-turn, SWE-agent) through the
`mambaradix` policy (the default tree) and `sglang` (compat="sglang-0.5.23"), in one process,
alternating two trees:

* on:  as shipped: the tree checks every inserted KV index against its owner (the KV pool,
       attached by the `CacheManager`);
* off: the same tree with the check skipped (no owner attached).

Prints each run's replay wall time (the `replay_s` the replay itself reports) and, per trace
and policy, the median of on/off over repeats. Hit rates must be identical (checked).
On a shared machine the wall-time ratio is noisy; `--inside` adds, per trace and policy, one
more run with the check's own calls timed (`claim` and `release` of the owner, or of the
tree's `HeldKV` before issue 19): their share of that run's replay time.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
from array import array
from collections.abc import Iterator
from pathlib import Path
from time import perf_counter_ns
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from mambaradix.core.tree import MambaRadixCache  # noqa: E402
from mambaradix.geometry.profile import get_profile  # noqa: E402
from mambaradix.replay.results import ReplayResult  # noqa: E402
from mambaradix.replay.run import _replay  # noqa: E402
from mambaradix.replay.serving import ServingConfig  # noqa: E402
from mambaradix.replay.workloads import load  # noqa: E402

TRACES = ("synthetic-agent", "synthetic-multi-turn", "swe-agent")
POLICIES = ("mambaradix", "sglang")


class _AcceptAll:
    """The check of a tree from before issue 19 (`HeldKV`), replaced by a no-op."""

    def claim(self, values: array[int], start: int, keep: int) -> bool:
        return True

    def release(self, values: array[int], run: bool) -> None:
        pass


@contextlib.contextmanager
def check_off() -> Iterator[None]:
    """Trees built inside skip the KV ownership check (either generation of the tree)."""
    cls: Any = MambaRadixCache
    if hasattr(cls, "attach_kv_owner"):
        name, saved = "attach_kv_owner", cls.attach_kv_owner
        cls.attach_kv_owner = lambda self, owner: None
    else:  # before issue 19: the tree's own HeldKV
        name, saved = "_init_tree", cls._init_tree

        def init(self: Any) -> None:
            saved(self)
            self._held_kv = _AcceptAll()

        cls._init_tree = init
    try:
        yield
    finally:
        setattr(cls, name, saved)


class Inside:
    """Times every call of the check (claim, release) while installed."""

    def __init__(self) -> None:
        self.ns = 0
        self.calls = 0

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        try:  # the allocators' claim and release, which the tree calls (the owner map
            # under them, `SlotOwners`, is an extension type in the compiled build)
            from mambaradix.pools.kv import _OwnerMethods as cls
        except ImportError:  # before issue 19
            from mambaradix.core.held import HeldKV as cls  # type: ignore[import-not-found,no-redef]
        saved = {name: getattr(cls, name) for name in ("claim", "release")}

        def timed(method: Any) -> Any:
            def call(*args: Any) -> Any:
                t0 = perf_counter_ns()
                try:
                    return method(*args)
                finally:
                    self.ns += perf_counter_ns() - t0
                    self.calls += 1

            return call

        for name, method in saved.items():
            setattr(cls, name, timed(method))
        try:
            yield
        finally:
            for name, method in saved.items():
                setattr(cls, name, method)


def run_once(trace: Any, policy: str, cfg: ServingConfig, on: bool) -> ReplayResult:
    gc.collect()
    profile = get_profile("nemotron-h-8b")
    if on:
        return _replay(trace, profile, policy, cfg, False)
    with check_off():
        return _replay(trace, profile, policy, cfg, False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--memory", type=float, default=20.0, help="GB")
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--inside", action="store_true", help="also time the check's own calls")
    args = ap.parse_args(argv)
    cfg = ServingConfig(memory_gb=args.memory)
    for name in args.traces.split(","):
        trace = load(name)
        for policy in args.policies.split(","):
            run_once(trace, policy, cfg, True)  # warm-up
            ratios: list[float] = []
            times: dict[bool, list[float]] = {True: [], False: []}
            for rep in range(args.repeats):
                got = {}
                for on in (True, False) if rep % 2 == 0 else (False, True):
                    got[on] = run_once(trace, policy, cfg, on)
                    times[on].append(got[on]["replay_s"])
                if got[True]["token_hit_rate"] != got[False]["token_hit_rate"]:
                    raise AssertionError(f"{name}/{policy}: hit rates differ with the check off")
                ratios.append(got[True]["replay_s"] / got[False]["replay_s"])
            print(
                f"{name:>22} {policy:>10}: on {statistics.median(times[True]):6.2f} s, "
                f"off {statistics.median(times[False]):6.2f} s, on/off median "
                f"{statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})",
                flush=True,
            )
            if args.inside:
                inside = Inside()
                with inside.installed():
                    wall = run_once(trace, policy, cfg, True)["replay_s"]
                print(
                    f"{'':>34}inside the check: {inside.ns / 1e9:.3f} s of {wall:.2f} s "
                    f"({100 * inside.ns / 1e9 / wall:.1f}%), {inside.calls:,} calls",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
