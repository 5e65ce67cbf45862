"""`mambaradix explain`: why each request hit short of the ideal bound.

Takes `replay`'s workload, model and serving options (`add_serving_arguments`)
and `--instances` / `--router`; runs every (state fraction, memory, policy)
point observed (`mambaradix.replay.explain`) and prints, per point, the gap to
the bound split into categories that add up to it exactly. `--json` writes the
aggregate, `--jsonl` one line per request and point (`-`: stdout, the table
then goes to stderr). Checks everything before any work, as `replay` does."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mambaradix.cli.checks import UsageError, check_output, write_all
from mambaradix.cli.replay import (
    add_serving_arguments,
    check_sizes,
    load_trace,
    pick_policies,
    validate_serving,
)
from mambaradix.replay.cluster_cli import add_replay_arguments

if TYPE_CHECKING:
    from mambaradix.geometry.profile import ModelProfile
    from mambaradix.replay.cells import Cell
    from mambaradix.replay.cluster_cli import ScaleOut
    from mambaradix.replay.explain import Explanation, Ideal
    from mambaradix.replay.serving import ServingConfig
    from mambaradix.replay.trace import Trace

__all__ = ["add"]

_WORK: tuple[Trace, ModelProfile, Ideal] | None = None  # inherited by forked workers


def add(p: argparse.ArgumentParser) -> None:
    add_serving_arguments(p)
    p.add_argument("--json", type=Path, default=None, help="write the aggregate as JSON here")
    p.add_argument(
        "--jsonl",
        default=None,
        help="write one JSON line per request and point here ('-': stdout)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_replay_arguments(p)  # --instances, --router...; --shard and --executor are refused
    p.set_defaults(run=run, plot=None, no_plot=True)  # explain draws no plot


def run(args: argparse.Namespace) -> int:
    from mambaradix.replay.explain import ideal
    from mambaradix.replay.explain.report import data, table
    from mambaradix.replay.progress import shown

    start = time.perf_counter()
    profile, base, scale = validate_serving(args)
    if scale.shard is not None or scale.executor_url is not None:
        raise UsageError("--shard and --executor have no explain form: explain one point at once")
    check_outputs(args)
    with shown(not args.no_progress):
        trace = load_trace(args.trace, args.limit, scale)
        policies, left_out = pick_policies(args, trace, base)
        check_sizes(trace, profile, base, policies, args, scale)
        structure = ideal(trace)
        runs = run_points(args, trace, profile, structure, policies, base, scale)
    bound = sum(r.bound_tokens for r in runs[0].requests)
    result = replace(data(trace, profile, bound, runs), policies_left_out=left_out)
    elapsed = time.perf_counter() - start
    summary = replace(result, elapsed_s=elapsed).to_json()
    to_stdout = args.jsonl == "-"
    print(table(summary), file=sys.stderr if to_stdout else sys.stdout)
    write_outputs(summary, runs, args)
    print(f"({elapsed:.1f} s)", file=sys.stderr if to_stdout else sys.stdout)
    return 0


def check_outputs(args: argparse.Namespace) -> None:
    """--json and --jsonl writable, apart, and neither the --trace file."""
    source = Path(args.trace).resolve() if Path(args.trace).is_file() else None
    paths = {
        "--json": args.json,
        "--jsonl": None if args.jsonl in (None, "-") else Path(args.jsonl),
    }
    for flag, path in paths.items():
        if path is None:
            continue
        check_output(path, flag)
        if path.resolve() == source:
            raise UsageError(f"{flag} {path} is the --trace file: the run would overwrite it")
    a, b = paths.values()
    if a is not None and b is not None and a.resolve() == b.resolve():
        raise UsageError(f"--json and --jsonl name the same file {a}")


def run_points(
    args: argparse.Namespace,
    trace: Trace,
    profile: ModelProfile,
    structure: Ideal,
    policies: list[str],
    base: ServingConfig,
    scale: ScaleOut,
) -> list[Explanation]:
    """Every point, in table order (state fraction, memory, router, policy)."""
    import os

    from mambaradix.replay.cells import build_cells
    from mambaradix.replay.forked import run_forked
    from mambaradix.replay.progress import counter

    global _WORK
    fractions = args.state_fraction or [base.state_fraction]
    cells = build_cells(policies, args.memory, base, fractions, scale.routers, scale.cluster)
    workers = min(len(cells), args.workers or os.cpu_count() or 1)
    bar = counter(len(cells), "explain", "run", show=not args.no_progress)
    _WORK = (trace, profile, structure)
    try:
        if workers <= 1:
            out = []
            for cell in cells:
                out.append(_one(cell))
                bar.update(1)
            return out
        done = run_forked(_one, cells, workers, lambda: bar.update(1))
    finally:
        _WORK = None
        bar.close()
    order = {cell.key: i for i, cell in enumerate(cells)}
    return sorted(done, key=lambda e: order[_key(e)])


def _key(e: Explanation) -> tuple[str, float, float, str | None]:
    return (e.policy, e.config.memory_gb, e.config.state_fraction, e.router)


def _one(cell: Cell) -> Explanation:
    from mambaradix.replay.explain import explain

    assert _WORK is not None
    trace, profile, structure = _WORK
    return explain(
        trace,
        profile,
        cell.policy,
        cell.cfg,
        router=cell.router,
        spec=cell.cluster,
        structure=structure,
    )


def write_outputs(
    summary: dict[str, Any], runs: list[Explanation], args: argparse.Namespace
) -> None:
    from mambaradix.replay.explain.report import write_lines

    writers = {}
    if args.json is not None:
        writers[args.json] = lambda p: p.write_text(json.dumps(summary, indent=1))
    if args.jsonl not in (None, "-"):
        writers[Path(args.jsonl)] = lambda p: _write_lines(p, runs)
    write_all(writers)
    if args.jsonl == "-":
        write_lines(runs, sys.stdout)
    for flag, path in (("json", args.json), ("jsonl", args.jsonl)):
        if path not in (None, "-"):
            print(f"{flag}: {path}", file=sys.stderr if args.jsonl == "-" else sys.stdout)


def _write_lines(path: Path, runs: list[Explanation]) -> None:
    from mambaradix.replay.explain.report import write_lines

    with path.open("w") as f:
        write_lines(runs, f)
