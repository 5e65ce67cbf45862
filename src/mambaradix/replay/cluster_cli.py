"""Command-line wiring of the multi-instance replay and of sweeps beyond one machine.

`add_replay_arguments` adds `--instances`, `--router`, `--router-lag-ms`,
`--router-block`, `--overlap-weight`, `--shard` and `--executor` to `mambaradix replay`;
`ScaleOut.from_args` checks them (ValueError with a one-line message, before any work)
and gives `sweep()` its keyword arguments; `table` prints cluster rows (`mambaradix
merge` is `cli/merge.py`).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from mambaradix.replay.routers import ROUTERS, check_router_names

if TYPE_CHECKING:  # the replay itself is imported only when a command runs
    from mambaradix.replay.cluster import ClusterSpec
    from mambaradix.replay.shards import Shard
    from mambaradix.replay.trace import Trace


def add_replay_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("several instances behind a router")
    g.add_argument("--instances", type=int, default=None, help="serving models (memory each)")
    g.add_argument(
        "--router", default=None, help=f"comma-separated (default: all): {', '.join(ROUTERS)}"
    )
    g.add_argument("--router-lag-ms", type=float, default=None, help="age of the event view")
    g.add_argument("--router-block", type=int, default=None, help="router block, tokens")
    g.add_argument("--overlap-weight", type=float, default=None, help="prefill weight in cost")
    g.add_argument(
        "--shared-store",
        action="store_true",
        help="the instances share one store (L3) of --store-gb, instead of one each",
    )
    g = p.add_argument_group("sweeps beyond one machine")
    g.add_argument("--shard", default=None, help="run shard i of N of the cells (i/N)")
    g.add_argument("--executor", default=None, help="dask://HOST:PORT (the dask extra)")


class SweepScale(TypedDict):
    """`sweep`'s arguments for running beyond one process (`ScaleOut.sweep_kwargs`)."""

    executor: Executor | None
    shard: Shard | None
    routers: list[str] | None
    cluster: ClusterSpec | None


@dataclass
class ScaleOut:
    routers: list[str] | None = None
    cluster: ClusterSpec | None = None
    shard: Shard | None = None
    executor_url: str | None = None
    executor: Executor | None = field(default=None, repr=False)
    page_size: int = 1  # --page-size: the router's block must be whole pages

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ScaleOut:
        """The options, checked; ValueError (one line) on bad input."""
        from mambaradix.replay.cluster import ClusterSpec
        from mambaradix.replay.shards import Shard

        out = cls(shard=Shard.parse(args.shard) if args.shard is not None else None)
        out.page_size = args.page_size
        if out.shard is not None and not args.json:
            raise ValueError("--shard needs --json FILE (the shard file for `mambaradix merge`)")
        if args.executor is not None:
            from mambaradix.replay.executors import dask_address

            dask_address(args.executor)  # syntax only; connecting comes later
            out.executor_url = args.executor
        cluster_only = ("router", "router_lag_ms", "router_block", "overlap_weight")
        if args.shared_store and not args.store_gb:
            raise ValueError("--shared-store needs --store-gb (the store the instances share)")
        if args.instances is None:
            given = [n for n in cluster_only if getattr(args, n) is not None]
            given += ["shared_store"] if args.shared_store else []
            if given:
                raise ValueError(f"--{given[0].replace('_', '-')} needs --instances N")
            return out
        if args.instances < 1:
            raise ValueError(f"--instances must be a positive number, got {args.instances}")
        out.routers = _routers(args.router)
        lag = 0.0 if args.router_lag_ms is None else args.router_lag_ms
        if not math.isfinite(lag) or lag < 0:
            raise ValueError(f"--router-lag-ms must be a number >= 0, got {args.router_lag_ms}")
        weight = 1.0 if args.overlap_weight is None else args.overlap_weight
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"--overlap-weight must be a number >= 0, got {weight}")
        if args.router_block is not None and args.router_block < 1:
            raise ValueError(f"--router-block must be a positive number, got {args.router_block}")
        out.cluster = ClusterSpec(
            args.instances, lag / 1e3, args.router_block, weight, args.shared_store
        )
        return out

    def check_trace(self, trace: Trace) -> None:
        block = None if self.cluster is None else self.cluster.block_tokens
        if block is not None and block % trace.unit_tokens:
            raise ValueError(
                f"--router-block must be a multiple of the trace's {trace.unit_tokens}-token "
                f"blocks, got {block}"
            )
        if block is not None and trace.unit_tokens == 1 and block % self.page_size:
            raise ValueError(
                f"--router-block must be a multiple of the tree's {self.page_size}-token page "
                f"(--page-size), got {block}"
            )

    def connect(self) -> None:
        if self.executor_url is not None:
            from mambaradix.replay.executors import open_executor

            self.executor = open_executor(self.executor_url)

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown()
            self.executor = None

    def sweep_kwargs(self) -> SweepScale:
        return {
            "executor": self.executor,
            "shard": self.shard,
            "routers": self.routers,
            "cluster": self.cluster,
        }

    @staticmethod
    def table(data: Mapping[str, Any]) -> str:
        return table(data)


def _routers(text: str | None) -> list[str]:
    names = [x.strip() for x in (",".join(ROUTERS) if text is None else text).split(",")]
    names = [x for x in names if x]
    if not names:
        raise ValueError(f"--router must name at least one of {', '.join(ROUTERS)}")
    check_router_names(names, "--router")
    if repeated := sorted({x for x in names if names.count(x) > 1}):
        raise ValueError(f"--router: {', '.join(repeated)} given twice")  # a row each, twice
    return names


def table(data: Mapping[str, Any]) -> str:
    """Cluster rows as a fixed-width table, one row per (memory, router, policy)."""
    first = data["results"][0] if data["results"] else {}
    w = max([12] + [len(r["policy"]) for r in data["results"]])
    head = (
        f"{'memory':>7} {'router':<12} {'policy':<{w}} {'tok hit':>8} {'req hit':>8} "
        f"{'dropped':>7} {'TTFT p50':>9} {'TTFT p95':>9} {'TTFT mean':>9} {'credited':>13} "
        f"{'over-credit':>12} {'imbalance':>9}"
    )
    lines = [
        f"trace {data['trace']['name']}: {data['trace']['requests']} requests; model "
        f"{data['model']['name']}; {first.get('instances', '?')} instances (memory is per "
        f"instance), router lag {first.get('router_lag_s', 0) * 1e3:g} ms",
        head,
        "-" * len(head),
    ]
    several = len({r.get("state_fraction") for r in data["results"]}) > 1
    shown = None
    for r in data["results"]:
        if several and r["state_fraction"] != shown:  # as the single-instance table does
            shown = r["state_fraction"]
            lines.append(f"  state pool {shown:.0%} of memory:")
        lines.append(
            f"{r['memory_gb']:>5g}GB {r['router']:<12} {r['policy']:<{w}} "
            f"{r['token_hit_rate']:>8.1%} {r['request_hit_rate']:>8.1%} {r['dropped']:>7,} "
            f"{_seconds(r['ttft_p50_s'])} {_seconds(r['ttft_p95_s'])} {_seconds(r['ttft_mean_s'])} "
            f"{r['credited_tokens']:>13,} {r['mispredicted_tokens']:>12,} "
            f"{r['load_imbalance']:>9.2f}"
        )
    return "\n".join(lines)


def _seconds(x: float | None) -> str:
    """A TTFT, or '-' where nothing was served (it has none)."""
    return f"{'-':>9}" if x is None else f"{x:>8.3f}s"
