"""Command line: `mambaradix replay` (the main job) and `mambaradix demo`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from mambaradix.index.cli import add_parser as add_index_parser
from mambaradix.replay.cluster_cli import ScaleOut, add_merge_parser, add_replay_arguments


def _number_list(text: str, ok: Callable[[float], bool], rule: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas, got {text!r}"
        ) from None
    if not values or not all(ok(v) for v in values):
        raise argparse.ArgumentTypeError(rule)
    return values


def _floats(text: str) -> list[float]:
    return _number_list(text, lambda v: v > 0, "memory sizes must be positive GB values")


def _fractions(text: str) -> list[float]:
    return _number_list(
        text, lambda v: 0 < v < 1, "state fractions must lie strictly between 0 and 1"
    )


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mambaradix", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_replay(
        sub.add_parser("replay", help="what a hybrid prefix cache saves on a workload, per policy")
    )
    _add_demo(
        sub.add_parser("demo", help="multi-turn sessions through the cache, both tree behaviours")
    )
    _add_engine(sub.add_parser("engine", help="a real hybrid model served on the cache, on vs off"))
    add_index_parser(sub)
    add_merge_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


def _add_replay(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", default="mooncake", help="bundled name or path to a JSONL trace")
    p.add_argument("--model", default="nemotron-h-8b", help="model profile name")
    p.add_argument(
        "--memory", type=_floats, default=[20.0, 40.0, 80.0, 160.0], help="GB, e.g. 10,20,40"
    )
    p.add_argument("--policy", type=_names, default=None, help="comma-separated (default: all)")
    p.add_argument("--sequential", action="store_true", help="Marconi's simulator discipline")
    p.add_argument(
        "--state-fraction",
        type=_fractions,
        default=None,
        help="share of memory for the state pool, e.g. 0.3,0.47,0.7 to sweep the split",
    )
    p.add_argument(
        "--prefill-tflops", type=float, default=2400.0, help="prefill throughput, TFLOP/s"
    )
    p.add_argument("--tpot-ms", type=float, default=20.0, help="decode time per output token, ms")
    p.add_argument("--chunk-tokens", type=int, default=8192, help="prefill chunk size in tokens")
    p.add_argument("--rate", type=float, default=None, help="requests/s instead of trace times")
    p.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    p.add_argument("--workers", type=int, default=None, help="parallel processes (default: cores)")
    p.add_argument("--json", default=None, help="write the results as JSON here")
    p.add_argument(
        "--plot", default=None, help="write the plot here (default out/replay-TRACE-MODEL.png)"
    )
    p.add_argument("--no-progress", action="store_true")
    add_replay_arguments(p)
    p.set_defaults(func=_replay)


def _replay(args: argparse.Namespace) -> int:
    from mambaradix.replay.models import get_profile
    from mambaradix.replay.policies import POLICIES
    from mambaradix.replay.serving import ServingConfig
    from mambaradix.replay.sweep import plot, sweep, table
    from mambaradix.replay.workloads import load

    start = time.perf_counter()
    policies = args.policy or list(POLICIES)
    unknown = [x for x in policies if x not in POLICIES]
    if unknown:
        print(
            f"unknown policy {', '.join(unknown)}; choose from {', '.join(POLICIES)}",
            file=sys.stderr,
        )
        return 2
    try:
        scale = ScaleOut.from_args(args)
        profile = get_profile(args.model)
        trace = load(args.trace)
        scale.check_trace(trace)
    except (KeyError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.limit is not None:
        if args.limit < 1:
            print("error: --limit must be a positive number of requests", file=sys.stderr)
            return 2
        trace.requests = trace.requests[: args.limit]
    if args.prefill_tflops <= 0 or args.tpot_ms < 0 or args.chunk_tokens < 1:
        print(
            "error: --prefill-tflops, --tpot-ms and --chunk-tokens must be positive",
            file=sys.stderr,
        )
        return 2
    base = ServingConfig(
        memory_gb=args.memory[0],
        sequential=args.sequential,
        rate=args.rate,
        prefill_flops_per_s=args.prefill_tflops * 1e12,
        tpot_s=args.tpot_ms / 1e3,
        chunk_tokens=args.chunk_tokens,
    )
    try:
        scale.connect()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        data = sweep(
            trace,
            profile,
            policies,
            args.memory,
            base,
            args.workers,
            not args.no_progress,
            state_fractions=args.state_fraction,
            **scale.sweep_kwargs(),
        )
    finally:
        scale.close()
    elapsed = time.perf_counter() - start
    data["elapsed_s"] = elapsed
    print(scale.table(data) if scale.cluster else table(data))
    if scale.cluster is None and scale.shard is None:
        plot_path = args.plot or f"out/replay-{Path(trace.name).stem}-{profile.name}.png"
        Path(plot_path).parent.mkdir(parents=True, exist_ok=True)
        plot(data, plot_path)
        print(f"\nplot: {plot_path}")
    elif args.plot:
        print("(no plot for --instances or --shard runs: the table and --json have the results)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(data, indent=1))
        print(f"json: {args.json}")
    print(f"({elapsed:.1f} s)")
    return 0


def _add_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sessions", type=int, default=24)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--kv-tokens", type=int, default=60_000, help="KV pool size in tokens")
    p.add_argument("--state-slots", type=int, default=48, help="state pool size in slots")
    p.add_argument("--chunk", type=int, default=512, help="prefill chunk size in tokens")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from mambaradix.demo import run_demo

    start = time.perf_counter()
    print(
        run_demo(args.sessions, args.turns, args.kv_tokens, args.state_slots, args.chunk, args.seed)
    )
    print(f"\n({time.perf_counter() - start:.1f} s)")
    return 0


def _add_engine(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="nemotron-h-tiny", help="nemotron-h-tiny, qwen3-next-tiny")
    p.add_argument("--workload", default="mt-bench", help="a bundled multi-turn workload")
    p.add_argument("--sessions", type=int, default=8, help="serve the first N sessions")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--kv-tokens", type=int, default=65536, help="KV pool size in tokens")
    p.add_argument("--state-slots", type=int, default=64, help="state pool size in slots")
    p.add_argument("--chunk-size", type=int, default=256, help="prefill chunk size in tokens")
    p.add_argument("--max-running", type=int, default=8, help="requests admitted at once")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.set_defaults(func=_engine)


def _engine(args: argparse.Namespace) -> int:
    try:
        import torch

        from mambaradix.compare import compare_cache, engine_sessions
        from mambaradix.engine.models import PRESETS, build_model
    except ImportError as e:
        print(f"error: {e} (install the engine extra)", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model not in PRESETS and not Path(args.model).is_dir():
        print(
            f"error: unknown model {args.model!r}; presets: {', '.join(PRESETS)}", file=sys.stderr
        )
        return 2
    start = time.perf_counter()
    vocab = int(build_model(args.model, args.seed).config.vocab_size)
    try:
        sessions = engine_sessions(args.workload, vocab, args.sessions)
    except (KeyError, ValueError, OSError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    data = compare_cache(
        sessions,
        args.max_new_tokens,
        model=args.model,
        seed=args.seed,
        kv_tokens=args.kv_tokens,
        state_slots=args.state_slots,
        chunk_size=args.chunk_size,
        max_running=args.max_running,
    )
    print(
        f"{args.model} on {args.workload}: {len(sessions)} sessions, {data['requests']} requests, "
        f"{args.max_new_tokens} new tokens each (prompts carry the engine's own answers)"
    )
    print(f"outputs identical: {'yes' if data['identical'] else 'no'}")
    rows = [
        ("prompt tokens", "prompt_tokens", "{:.0f}"),
        ("prefill tokens computed", "computed_prefill_tokens", "{:.0f}"),
        ("hit rate", "hit_rate", "{:.1%}"),
        ("evictions (KV tokens + states)", "evictions", "{:.0f}"),
        ("retractions", "retractions", "{:.0f}"),
        ("time per request (s)", "s_per_request", "{:.3f}"),
        ("mean TTFT (s)", "mean_ttft_s", "{:.3f}"),
    ]
    print(f"{'':32}{'cache':>12}{'no cache':>12}")
    for label, key, fmt in rows:
        on, off = data["cache"][key], data["no cache"][key]
        print(f"{label:32}{fmt.format(on):>12}{fmt.format(off):>12}")
    pred = data["replay"]
    print(
        f"prefill saved by the cache: {data['cache']['hit_rate']:.1%}; `mambaradix replay` "
        f"predicts {pred['token_hit_rate']:.1%} for these requests and pools "
        f"(bound {pred['bound_token_hit_rate']:.1%})"
    )
    print(f"\n({time.perf_counter() - start:.1f} s)")
    return 0 if data["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
