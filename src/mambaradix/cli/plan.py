"""`mambaradix plan`: the device and host memory, state share and policy that meet a
target (token hit rate, mean or p95 TTFT) on a trace, or do best within a memory budget;
the Pareto frontier of what was replayed; SGLang's and vLLM's default sizing at the same
memory.

Takes `replay`'s workload, model and serving options (`add_serving_arguments`);
`--memory` replaces the memory range derived from the trace, `--policy` and
`--state-fraction` the axes searched; `--host-gb` is a list here (the host axis, 0: no
host tier) and `--host-cost` a host GB's price in device GB. Checks everything before
any replay, as `replay` does; a hit-rate target above the trace's bound is an error that
names the bound. Exit 1 when no configuration searched meets the targets (the outputs
are still written)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mambaradix.cli.checks import UsageError, count, is_stdout, real, reals, write_all
from mambaradix.cli.replay import (
    add_serving_arguments,
    check_outputs,
    load_trace,
    pick_policies,
    plot_target,
    validate_serving,
)

if TYPE_CHECKING:
    from mambaradix.replay.plan import Goal

__all__ = ["add"]

FLAGS = {  # plan()'s parameter names as the options that set them
    "hit_rate": "--target-hit-rate",
    "budget_gb": "--budget-gb",
    "policies": "--policy",
    "state_fractions": "--state-fraction",
    "memories": "--memory",
    "host_gbs": "--host-gb",
    "host_cost": "--host-cost",
}


def hit_rate(text: str) -> float:
    """An argparse type: a rate in (0, 1], or a percentage ("40%")."""
    if text.strip().endswith("%"):
        return real(0, 100, high_open=False)(text.strip()[:-1]) / 100
    return real(0, 1, high_open=False)(text)


def add(p: argparse.ArgumentParser) -> None:
    add_serving_arguments(p)
    for action in p._actions:  # argparse has no public way to amend a shared option's help
        if action.dest == "memory":
            action.help = "GB, e.g. 10,20,40: the first grid instead of a range from the trace "
            action.help += "(bisection still refines it)"
        if action.dest == "policy":
            action.help = "comma-separated, of %(known)s (default: sglang-extra-buffer, vllm, "
            action.help += "mambaradix)"
        if action.dest == "state_fraction":
            action.help = "state shares to search (default 0.25, 0.4737 (SGLang's), 0.75)"
        if action.dest == "host_gb":  # one host size in `replay`, the host axis here
            action.type, action.default = reals(0, low_open=False), None
            action.help = "host memories (L2) to search, GB, e.g. 0,100,400 (default 0: none)"
    g = p.add_argument_group("what to plan for (a target, a budget, or both)")
    g.add_argument("--target-hit-rate", type=hit_rate, default=None, help="e.g. 0.3 or 30%%")
    g.add_argument("--target-ttft-mean", type=real(0), default=None, help="seconds")
    g.add_argument("--target-ttft-p95", type=real(0), default=None, help="seconds")
    g.add_argument("--budget-gb", type=real(0), default=None, help="most memory cost, device GB")
    g.add_argument(
        "--host-cost",
        type=real(0, low_open=False),
        default=None,
        help="a host GB's price in device GB (default 0.05: docs/plan.md)",
    )
    g.add_argument(
        "--grid-points", type=count(1), default=3, help="memories per setting before bisecting"
    )
    g.add_argument(
        "--resolution", type=real(0), default=0.1, help="bisect until memory is known within it"
    )
    p.add_argument("--json", type=Path, default=None, help="write the plan as JSON (-: stdout)")
    p.add_argument(
        "--plot", default=None, help="plot file or directory (default out/plan-TRACE-MODEL.png)"
    )
    p.add_argument("--no-plot", action="store_true", help="write no plot (needs no matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    none = dict.fromkeys(
        ("instances", "router", "router_lag_ms", "router_block", "overlap_weight", "shard"),
    )
    p.set_defaults(run=run, memory=None, executor=None, shared_store=False, **none)


def goal_of(args: argparse.Namespace) -> Goal:
    from mambaradix.replay.plan import Goal

    if all(
        x is None
        for x in (args.target_hit_rate, args.target_ttft_mean, args.target_ttft_p95, args.budget_gb)
    ):
        raise UsageError(
            "give a target (--target-hit-rate, --target-ttft-mean, --target-ttft-p95) "
            "or --budget-gb"
        )
    return Goal(args.target_hit_rate, args.target_ttft_mean, args.target_ttft_p95, args.budget_gb)


def run(args: argparse.Namespace) -> int:
    from mambaradix.replay.plan import DEFAULT_HOST_COST, DEFAULT_POLICIES, prepare, search
    from mambaradix.replay.plan.report import table
    from mambaradix.replay.progress import shown

    start = time.perf_counter()
    goal = goal_of(args)
    memories, args.memory = args.memory, args.memory or [1.0]  # validate_serving's base memory
    hosts, args.host_gb = args.host_gb, 0.0  # the host axis; the base has none
    profile, base, _ = validate_serving(args)
    plot_path = _plot_path(args, None, profile)
    check_outputs(plot_path, args.json, args.trace)
    with shown(not args.no_progress):
        trace = load_trace(args.trace, args.limit)
        given = args.policy
        policies, _ = pick_policies(args, trace, base)
        if given is None:
            policies = [p for p in policies if p in DEFAULT_POLICIES]
        try:
            ready = prepare(
                trace, profile, goal, base, policies, args.state_fraction, memories, hosts,
                DEFAULT_HOST_COST if args.host_cost is None else args.host_cost,
            )  # fmt: skip
        except ValueError as e:
            raise UsageError(_flagged(str(e))) from None
        plot_path = _plot_path(args, trace, profile)
        result = search(
            ready, args.grid_points, args.resolution, args.workers, not args.no_progress
        )
    elapsed = time.perf_counter() - start
    data = replace(result, elapsed_s=elapsed).to_json()
    report = sys.stderr if is_stdout(plot_path) or is_stdout(args.json) else sys.stdout
    print(table(data), file=report)
    _write(data, plot_path, args.json, report)
    print(f"({elapsed:.1f} s)", file=report)
    if data["recommended"] is None:
        print(f"mambaradix plan: no configuration meets {goal.describe()}", file=sys.stderr)
        return 1
    return 0


def _flagged(message: str) -> str:
    """A library message that starts with a parameter name, with the option instead."""
    for name, flag in FLAGS.items():
        if message.startswith(name):
            return flag + message[len(name) :]
    return message


def _plot_path(args: argparse.Namespace, trace: Any, profile: Any) -> Path | None:
    if args.no_plot:
        return None
    path = plot_target(args.plot, trace, profile)
    if path.name.startswith("replay-") and (args.plot is None or path.parent == Path(args.plot)):
        path = path.with_name("plan-" + path.name[len("replay-") :])
    return path


def _write(
    data: dict[str, Any], plot_path: Path | None, json_path: Path | None, report: Any
) -> None:
    from mambaradix.replay.plan.report import plot

    writers: dict[Path, Any] = {}
    if plot_path is not None and not is_stdout(plot_path):
        writers[plot_path] = lambda p: plot(data, str(p))
    if json_path is not None and not is_stdout(json_path):
        writers[json_path] = lambda p: p.write_text(json.dumps(data, indent=1))
    write_all(writers)
    if is_stdout(plot_path):
        plot(data, sys.stdout.buffer)
        sys.stdout.buffer.flush()
    if is_stdout(json_path):
        print(json.dumps(data, indent=1), flush=True)
    for what, path in (("plot", plot_path), ("json", json_path)):
        if path is not None and not is_stdout(path):
            print(f"{what}: {path}", file=report)
