"""`mambaradix replay`: a trace through every policy at every memory point.

Order of work: parse (argparse types refuse nonsense numbers), `validate` (model,
policies, option combinations, output paths), load the trace, pick the
policies that run at the page size, check that every memory point holds at
least one request, sweep, then write the plot and the JSON together (all or
nothing)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from mambaradix.cli.checks import (
    UsageError,
    check_output,
    count,
    is_stdout,
    listed,
    names,
    plot_formats,
    real,
    reals,
    suggest,
    warn,
    write_all,
)
from mambaradix.replay.cluster_cli import ScaleOut, add_replay_arguments
from mambaradix.validate import HOST_BYTES_PER_ID, available_bytes

if TYPE_CHECKING:
    from mambaradix.geometry.profile import ModelProfile
    from mambaradix.replay.fit import Pools
    from mambaradix.replay.results import SweepResult
    from mambaradix.replay.serving import ServingConfig
    from mambaradix.replay.sweep import Checked
    from mambaradix.replay.trace import Trace

DEFAULT_MEMORY = [20.0, 40.0, 80.0, 160.0]
TRACK_INTERVAL = 256  # SGLang's --mamba-track-interval default (ServingConfig's)


def add(p: argparse.ArgumentParser) -> None:
    add_serving_arguments(p)
    p.add_argument(
        "--json", type=Path, default=None, help="write the results as JSON here (-: stdout)"
    )
    p.add_argument(
        "--plot",
        default=None,
        help="plot file (its extension picks the format), directory, or - (a PNG on stdout) "
        "(default out/replay-TRACE-MODEL.png)",
    )
    p.add_argument("--no-plot", action="store_true", help="write no plot (needs no matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_replay_arguments(p)  # --instances, --router..., --shard, --executor
    p.set_defaults(run=run)


def add_serving_arguments(p: argparse.ArgumentParser) -> None:
    """The workload, model and serving options (`--trace` to `--workers`), shared
    by `replay` and `explain`."""
    listed(
        p.add_argument(
            "--trace", default="mooncake", help="a JSONL trace file or a bundled one: %(known)s"
        ),
        bundled_traces,
    )
    listed(
        p.add_argument(
            "--model",
            default="nemotron-h-8b",
            help="a built-in model (%(known)s), or a model's config.json (or a directory "
            "holding one)",
        ),
        model_names,
    )
    p.add_argument(
        "--state-dtype",
        default="auto",
        choices=["auto", "float32", "fp32", "bfloat16", "bf16", "int8"],
        help="dtype of the cached state checkpoints (default: each engine's own; "
        "int8 checkpoints change outputs)",
    )
    p.add_argument("--memory", type=reals(0), default=DEFAULT_MEMORY, help="GB, e.g. 10,20,40")
    listed(
        p.add_argument(
            "--policy",
            type=names,
            default=None,
            help="comma-separated, of %(known)s (default: all but marconi-oracle, which is a "
            "run per alpha, the older SGLang release's rows, "
            "sglang-0.5.15.post1[-extra-buffer], and, without --host-gb or --store-gb, the "
            "tiered rows sglang-hicache[-auto] and vllm-offload)",
        ),
        policy_names,
    )
    p.add_argument(
        "--vllm-retention",
        default=None,
        help="vllm: vLLM's --prefix-cache-retention-interval, tokens (a multiple of its block) "
        "or 'dense' (default 0: only the replay boundary and shared-prefix junctions)",
    )
    p.add_argument("--sequential", action="store_true", help="Marconi's simulator discipline")
    p.add_argument(
        "--state-fraction",
        type=reals(0, 1),
        default=None,
        help="share of memory for the state pool, e.g. 0.3,0.47,0.7 to sweep the split",
    )
    p.add_argument("--prefill-tflops", type=real(0), default=2400.0, help="prefill TFLOP/s")
    p.add_argument("--tpot-ms", type=real(0, low_open=False), default=20.0, help="ms per token")
    p.add_argument("--chunk-tokens", type=count(1), default=8192, help="prefill chunk, tokens")
    p.add_argument(
        "--page-size",
        type=count(1),
        default=1,
        help="KV page in tokens (SGLang's --page-size); > 1 on token traces: extra_buffer "
        "only; no effect on block traces (mooncake), whose blocks are whole pages",
    )
    p.add_argument(
        "--track-interval",
        type=count(1),
        default=None,
        help=f"extra_buffer: track a state every N decoded tokens (default {TRACK_INTERVAL}, "
        "rounded up to whole pages)",
    )
    p.add_argument("--rate", type=real(0), default=None, help="requests/s instead of trace times")
    p.add_argument(
        "--open-loop",
        action="store_true",
        help="release every request at its time, even before its session's previous answer "
        "(default: closed loop, a turn after the previous answer plus the recorded think time)",
    )
    add_tier_arguments(p)
    p.add_argument("--limit", type=count(1), default=None, help="only the first N requests")
    p.add_argument("--workers", type=count(1), default=None, help="processes (default: cores)")


def add_tier_arguments(p: argparse.ArgumentParser) -> None:
    """The lower tiers (`replay.tiered`; defaults: `policies.tier_rules`, cited)."""
    from mambaradix.policies import tier_rules as t

    at_least_0 = real(0, low_open=False)
    p.add_argument(
        "--host-gb", type=at_least_0, default=0.0, help="host memory tier (L2), GB (0: none)"
    )
    p.add_argument("--store-gb", type=at_least_0, default=0.0, help="store tier (L3), GB (0: none)")
    p.add_argument(
        "--host-gbps",
        type=real(0),
        default=t.DEFAULT_HOST_GBPS,
        help="host <-> device GB/s (default: PCIe Gen5 x16, one way)",
    )
    p.add_argument(
        "--host-latency-us",
        type=at_least_0,
        default=t.DEFAULT_HOST_LATENCY_US,
        help="host <-> device microseconds per load",
    )
    p.add_argument(
        "--store-gbps",
        type=real(0),
        default=t.DEFAULT_STORE_GBPS,
        help="store -> host GB/s (default: an NVMe Gen5 SSD's sequential read)",
    )
    p.add_argument(
        "--store-latency-us",
        type=at_least_0,
        default=t.DEFAULT_STORE_LATENCY_US,
        help="store -> host microseconds per load",
    )
    p.add_argument(
        "--tier-write",
        choices=["back", "through", "through-selective"],
        default=None,
        help="when units go down to the host, for every row: when the device evicts them "
        "(back), when they are cached (through), once hit twice (through-selective, "
        "SGLang's rule) (default: each row's own: through for sglang-hicache, "
        "sglang-hicache-auto and vllm-offload, as their upstreams' defaults; back for ours "
        "and the rest)",
    )


def run(args: argparse.Namespace) -> int:
    from mambaradix.replay.progress import shown

    start = time.perf_counter()
    profile, base, scale = validate(args)
    with shown(not args.no_progress):
        trace = load_trace(args.trace, args.limit, scale)
        warn_no_effect(args, trace)
        policies, left_out = pick_policies(args, trace, base)
        plot_path = plot_target(args.plot, trace, profile) if plots(args, scale) else None
        check_outputs(plot_path, args.json, args.trace)
        checked = check_sizes(trace, profile, base, policies, args, scale)
        result = run_sweep(args, trace, profile, policies, base, scale, checked)
    model = result.model
    if args.state_dtype != "auto" and profile.state_dtypes is not None:
        changes = profile.state_dtypes.changes_outputs
        model = replace(model, state_dtype=args.state_dtype, changes_outputs=changes)
    elapsed = time.perf_counter() - start
    data = replace(result, model=model, policies_left_out=left_out, elapsed_s=elapsed).to_json()
    report = sys.stderr if is_stdout(plot_path) or is_stdout(args.json) else sys.stdout
    print(scale.table(data) if scale.cluster else table_text(data), file=report)
    warn_dropped(data, trace, profile, base)
    if failed := [r for r in data["results"] if r["served"] == 0]:
        where = ", ".join(f"{r['policy']} at {r['memory_gb']:g} GB" for r in failed)
        msg = f"nothing was served ({where}): every request was dropped; no output written"
        print(f"mambaradix replay: error: {msg}", file=sys.stderr)
        return 1
    write_outputs(data, plot_path, args.json, report)
    print(f"({elapsed:.1f} s)", file=report)
    return 0


def plots(args: argparse.Namespace, scale: ScaleOut) -> bool:
    """Single-instance, whole sweeps have a plot (unless --no-plot); cluster and
    shard runs do not."""
    return scale.cluster is None and scale.shard is None and not args.no_plot


def bundled_traces() -> list[str]:
    from mambaradix.replay.workloads import BUNDLED

    return sorted(BUNDLED)


def model_names() -> list[str]:
    from mambaradix.geometry.profile import PROFILES

    return list(PROFILES)


def policy_names() -> list[str]:
    from mambaradix.policies import POLICIES

    return list(POLICIES)


def warn_no_effect(args: argparse.Namespace, trace: Trace) -> None:
    """A warning for an option that changes nothing on this trace."""
    if args.page_size > 1 and trace.unit_tokens > 1 and trace.unit_tokens % args.page_size == 0:
        warn(
            f"--page-size {args.page_size} has no effect on {trace.name}: its "
            f"{trace.unit_tokens}-token blocks are whole pages already (the tree's page is "
            "one block)"
        )


def run_sweep(
    args: argparse.Namespace,
    trace: Trace,
    profile: ModelProfile,
    policies: list[str],
    base: ServingConfig,
    scale: ScaleOut,
    checked: Checked,
) -> SweepResult:
    from mambaradix.replay.sweep import sweep

    try:
        scale.connect()
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        return sweep(
            trace,
            profile,
            policies,
            args.memory,
            base,
            args.workers,
            not args.no_progress,
            state_fractions=args.state_fraction,
            **scale.sweep_kwargs(),
            checked=checked,
        )
    finally:
        scale.close()


def validate(args: argparse.Namespace) -> tuple[ModelProfile, ServingConfig, ScaleOut]:
    """Everything that needs no trace: model, policies, option combinations, outputs."""
    profile, base, scale = validate_serving(args)
    plot_path = plot_target(args.plot, None, profile) if plots(args, scale) else None
    check_outputs(plot_path, args.json, args.trace)
    return profile, base, scale


def validate_serving(args: argparse.Namespace) -> tuple[ModelProfile, ServingConfig, ScaleOut]:
    """The options of `add_serving_arguments` and `add_replay_arguments` (and
    `--plot` against them): model, policies, option combinations."""
    from mambaradix.policies import ORACLE, POLICIES, retired_reason
    from mambaradix.replay.serving import ServingConfig

    try:
        scale = ScaleOut.from_args(args)
    except ValueError as e:
        raise UsageError(str(e)) from None
    profile = resolve_model(args.model, args.state_dtype)
    if args.plot is not None and args.no_plot:
        raise UsageError("--plot and --no-plot contradict each other")
    if args.plot is not None and not plots(args, scale):
        raise UsageError(
            "--plot has no effect with --instances or --shard (the table and --json have "
            "the results)"
        )
    if (why := retired_reason(args.policy or [])) is not None:
        raise UsageError(f"--policy: {why}")
    if unknown := [x for x in args.policy or [] if x not in POLICIES]:
        raise UsageError(
            f"--policy: unknown policy {', '.join(unknown)}; choose from {', '.join(POLICIES)}"
            f"{suggest(unknown[0], POLICIES)}"
        )
    retention_policies(args, profile)
    if plots(args, scale):
        check_matplotlib()
    if args.executor is not None and args.workers is not None:
        warn(f"--workers {args.workers} has no effect with --executor: its workers run the cells")
    if scale.cluster is not None and ORACLE in (args.policy or []):
        raise UsageError(f"--policy {ORACLE} (a run per alpha) has no --instances form")
    if args.sequential and args.state_fraction:
        raise UsageError("--state-fraction has no effect with --sequential (one shared budget)")
    track = args.track_interval or default_track_interval(args.page_size)
    if track % args.page_size:
        raise UsageError(
            f"--track-interval {track} must be a multiple of --page-size {args.page_size}, "
            "as SGLang requires"
        )
    base = ServingConfig(
        memory_gb=args.memory[0],
        sequential=args.sequential,
        rate=args.rate,
        open_loop=args.open_loop,
        prefill_flops_per_s=args.prefill_tflops * 1e12,
        tpot_s=args.tpot_ms / 1e3,
        chunk_tokens=args.chunk_tokens,
        page_size=args.page_size,
        track_interval=track,
        host_gb=args.host_gb,
        store_gb=args.store_gb,
        host_gbps=args.host_gbps,
        host_latency_us=args.host_latency_us,
        store_gbps=args.store_gbps,
        store_latency_us=args.store_latency_us,
        tier_write=args.tier_write,
    )
    return profile, base, scale


def resolve_model(model: str, state_dtype: str = "auto") -> ModelProfile:
    """`--model` (a built-in name, a config.json or a directory holding one) at
    `--state-dtype`; UsageError naming the option. Warns that int8 states change
    outputs."""
    from mambaradix.geometry.profile import load_profile

    try:
        profile = load_profile(model, state_dtype)
    except KeyError as e:
        raise UsageError(f"--model: {e.args[0]}{suggest(model, model_names())}") from None
    except (ValueError, TypeError) as e:
        flag = "--state-dtype" if str(e).startswith("state_dtype") else "--model"
        raise UsageError(f"{flag}: {e}") from None
    if profile.state_dtypes is not None and profile.state_dtypes.changes_outputs:
        warn(
            f"--state-dtype {state_dtype}: quantized state checkpoints; a hit resumes from an "
            "approximate state, so outputs differ from an uncached run"
        )
    return profile


def retention_policies(args: argparse.Namespace, profile: ModelProfile) -> None:
    """With --vllm-retention, the vllm row runs at that interval (`vllm@N`, `vllm@dense`)."""
    from mambaradix.policies import DEFAULT_RUN
    from mambaradix.policies.vllm import parse_retention, retention_name

    if args.vllm_retention is None:
        return
    try:
        retention = parse_retention(args.vllm_retention, "--vllm-retention")
    except ValueError as e:
        raise UsageError(str(e)) from None
    block = profile.vllm_block_tokens
    if retention and retention % block:
        raise UsageError(
            f"--vllm-retention {retention} must be a multiple of vLLM's block "
            f"({block} tokens for {profile.name})"
        )
    names = list(args.policy or DEFAULT_RUN)
    if "vllm" not in names:
        raise UsageError("--vllm-retention has no effect: --policy does not run vllm")
    args.policy = [retention_name(retention) if p == "vllm" else p for p in names]


def check_matplotlib() -> None:
    """UsageError, before any work, when the plot cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(
            "the plot needs matplotlib, which is not installed: pip install "
            "'mambaradix[replay]', or give --no-plot (the table and --json have the results)"
        ) from None


def default_track_interval(page: int) -> int:
    """SGLang's 256, rounded up to a whole number of pages (SGLang itself
    refuses a page that does not divide it; here the default follows the page)."""
    return -(-TRACK_INTERVAL // page) * page


def pick_policies(
    args: argparse.Namespace, trace: Trace, base: ServingConfig
) -> tuple[list[str], dict[str, str]]:
    """The policies to run at `--page-size` on this trace, and those of the
    default list left out (name -> why; said on stderr). An explicit
    `--policy` that cannot run at the page size is a usage error."""
    from mambaradix.policies import DEFAULT_RUN, TIER_ROWS
    from mambaradix.replay.checks import policy_strategy, unpaged_policies

    # the peers' tiered rows join the default list when a lower tier is configured
    default = DEFAULT_RUN + list(TIER_ROWS) if base.tiered else DEFAULT_RUN
    try:
        unpaged = unpaged_policies(args.policy or default, trace, base)
    except ValueError as e:
        raise UsageError(f"--{str(e).replace('_', '-', 1)}") from None
    why = f"no_buffer needs --page-size 1 on a token-level trace, got {args.page_size}"
    if args.policy and unpaged:
        raise UsageError(
            f"--policy {', '.join(unpaged)}: {why}; extra_buffer policies "
            "(sglang-extra-buffer) take any page size"
        )
    policies = [p for p in args.policy or default if p not in unpaged]
    if not policies:
        raise UsageError(f"--page-size {args.page_size}: no policy runs at it ({why})")
    if unpaged:
        warn(f"--page-size {args.page_size}: left out {', '.join(unpaged)} ({why})")
    if args.track_interval and all(policy_strategy(p) != "extra_buffer" for p in policies):
        raise UsageError(
            "--track-interval has no effect: none of the policies uses extra_buffer "
            "(sglang-extra-buffer does)"
        )
    return policies, dict.fromkeys(unpaged, why)


def load_trace(name: str, limit: int | None, scale: ScaleOut | None = None) -> Trace:
    from mambaradix.replay.workloads import load

    try:
        trace = load(name)
    except (ValueError, OSError, ImportError) as e:  # TraceFormatError is a ValueError
        hint = "" if Path(name).exists() else suggest(name, bundled_traces())
        raise UsageError(f"--trace: {e}{hint}") from None
    if limit is not None:
        trace.requests = trace.requests[:limit]
    try:
        if scale is not None:
            scale.check_trace(trace)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return trace


def plot_target(arg: str | None, trace: Trace | None, profile: ModelProfile) -> Path:
    """Where the plot goes: `arg` if it names a file with an extension
    matplotlib writes; inside `arg` if it is a directory (an existing one, or a
    path ending in '/'); else out/. Before the trace is loaded (`trace` None)
    the file name is a stand-in: only the directory and extension matter."""
    stem = Path(trace.name).stem if trace is not None else "TRACE"
    default = f"replay-{stem}-{profile.name}.png"
    if arg is None:
        return Path("out") / default
    path = Path(arg)
    if is_stdout(path):
        return path
    if arg.endswith(("/", "\\")) or path.is_dir():
        return path / default
    formats = plot_formats()
    if path.suffix.lower().lstrip(".") not in formats:
        raise UsageError(
            f"--plot {arg}: {'no' if not path.suffix else 'unsupported'} file extension; name a "
            f"directory or a file ending in one of {', '.join('.' + f for f in sorted(formats))}"
        )
    if path.suffix.lower() == ".pgf":  # the one format matplotlib writes with another program
        import matplotlib

        tex = str(matplotlib.rcParams["pgf.texsystem"])
        if shutil.which(tex) is None:
            raise UsageError(f"--plot {arg}: matplotlib writes .pgf with {tex}, not found on PATH")
    return path


def check_outputs(plot_path: Path | None, json_path: Path | None, trace: str) -> None:
    """Each output writable, the two apart, and neither the --trace file."""
    for flag, path in (("--plot", plot_path), ("--json", json_path)):
        if path is not None:
            check_output(path, flag, inputs=[(trace, "the --trace file")])
    if plot_path and json_path and str(plot_path) == str(json_path) == "-":
        raise UsageError("--json - and --plot - both ask for stdout; give one of them a file")
    if plot_path and json_path and json_path.resolve() == plot_path.resolve():
        raise UsageError(f"--json and --plot name the same file {json_path}")


def check_sizes(
    trace: Trace,
    profile: ModelProfile,
    base: ServingConfig,
    policies: list[str],
    args: argparse.Namespace,
    scale: ScaleOut,
) -> Checked:
    """The sweep's checks, once (`sweep.check_points`), as a UsageError naming the options:
    a memory point (at any state fraction) that holds no request or too few states for a
    policy, or makes pools whose bookkeeping would not fit this machine's memory."""
    from mambaradix.replay.sweep import check_points

    kw = scale.sweep_kwargs()
    try:
        checked = check_points(
            trace, profile, policies, args.memory, base, args.state_fraction,
            kw["routers"], kw["cluster"], names=("--memory", "--state-fraction"),
        )  # fmt: skip
    except ValueError as e:
        raise UsageError(str(e)) from None
    workers = args.workers or os.cpu_count() or 1
    for cfg, fit in checked.points:
        check_host_memory(trace, profile, cfg, fit.pools, workers, args.instances or 1)
    return checked


def check_host_memory(
    trace: Trace,
    profile: ModelProfile,
    cfg: ServingConfig,
    pools: Pools,
    workers: int,
    instances: int = 1,
) -> None:
    """The serving model keeps a free list of every KV unit and state: a memory
    point far beyond what the trace can use, or very many instances (each has
    its own pools), could exhaust this machine first."""
    from mambaradix.replay.fit import fit

    need = HOST_BYTES_PER_ID * (pools.kv_units + pools.states) * workers * instances
    have = available_bytes()
    if have is None or need <= have // 2:
        return
    each = f"{instances:,} --instances, " if instances > 1 else ""
    raise UsageError(
        f"--memory {cfg.memory_gb:g} GB makes pools of {pools.kv_units:,} KV units and "
        f"{pools.states:,} states, whose bookkeeping needs about {need / 1e9:.1f} GB of this "
        f"machine's memory ({each}{workers} workers) and only {have / 1e9:.1f} GB is available; "
        f"the largest request of this trace is served alone in about "
        f"{fit(trace, profile, replace(cfg, memory_gb=1.0), 2).gb_for_largest:g} GB"
    )


def table_text(data: dict[str, Any]) -> str:
    from mambaradix.replay.sweep import table

    return table(data)


def warn_dropped(
    data: dict[str, Any], trace: Trace, profile: ModelProfile, base: ServingConfig
) -> None:
    """One stderr line per memory point at which requests were dropped."""
    from mambaradix.replay.checks import (
        policy_own_memory,
        policy_shared_budget,
        policy_state_bytes,
        policy_strategy,
    )
    from mambaradix.replay.fit import TRACK_SLOTS, fit, policy_fit

    groups: dict[tuple[float, float, int], list[str]] = {}
    for r in data["results"]:
        if r["dropped"]:
            key = (r["memory_gb"], r["state_fraction"], r["dropped"])
            named = groups.setdefault(key, [])
            named += [] if r["policy"] in named else [r["policy"]]  # once, with many routers
    for (mem, frac, n), policies in groups.items():
        cfg = replace(base, memory_gb=mem, state_fraction=frac)
        own = [p for p in policies if policy_own_memory(p)]  # vLLM's block pool
        pooled = [p for p in policies if p not in own]
        gbs = [policy_fit(trace, profile, cfg, p).gb_for_largest for p in own]
        for p in pooled:  # each on its own layout: split pools or ours' one budget
            track, state = TRACK_SLOTS[policy_strategy(p)], policy_state_bytes(p, profile)
            gbs.append(
                fit(
                    trace, profile, cfg, track, state, policy_shared_budget(p, cfg.tiered)
                ).gb_for_largest
            )
        gb = max(gbs)
        why = f"serving every request needs about {gb:g} GB"
        if gb <= mem and base.sequential:
            why = "each fits alone, but not beside the states cached by then (--sequential)"
        elif gb <= mem:  # the scheduler's abort: SGLang's retract_decode with one request left
            why = "each fits alone, but ran out of KV while decoding beside the requests in flight"
        warn(
            f"{n:,} of {len(trace):,} requests did not fit in {mem:g} GB and were dropped "
            f"({', '.join(policies)}); they count as misses; {why}"
        )


def write_outputs(
    data: dict[str, Any], plot_path: Path | None, json_path: Path | None, report: TextIO
) -> None:
    """The files together (all or nothing), then what goes to stdout."""
    from mambaradix.replay.sweep import plot

    writers: dict[Path, Callable[[Path], object]] = {}
    if plot_path is not None:
        writers[plot_path] = lambda p: plot(data, str(p))
    if json_path is not None:
        writers[json_path] = lambda p: p.write_text(json.dumps(data, indent=1))
    write_all({path: w for path, w in writers.items() if not is_stdout(path)})
    if is_stdout(plot_path):
        plot(data, sys.stdout.buffer)
        sys.stdout.buffer.flush()
    if is_stdout(json_path):
        print(json.dumps(data, indent=1), flush=True)
    if plot_path is not None and not is_stdout(plot_path):
        print(f"\nplot: {plot_path}", file=report)
    if json_path is not None and not is_stdout(json_path):
        print(f"json: {json_path}", file=report)
