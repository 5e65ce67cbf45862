"""`mambaradix engine`: a real hybrid model served on the cache, on vs off.

Order of work: parse, `validate` (the engine extra, the model, a token-level
workload, option combinations, the device), load the workload's sessions (the
vocabulary from the model's config), check that the pools admit its largest
request, build the model (once, on its device, for both runs; a checkpoint can
take long to load), check that its pools fit in memory, then serve (a progress
bar counts requests)."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypedDict

from mambaradix.cli.checks import UsageError, count
from mambaradix.core.compat import COMPAT_MODES
from mambaradix.lifecycle.strategy import EXTRA_BUFFER, PAGE_RULE, STRATEGIES, takes_page

TOKEN_WORKLOADS = "mt-bench, swe-agent, chitchat, synthetic-multi-turn, or a neutral JSONL file"
DTYPES = ("float32", "bfloat16", "float16")  # torch dtype names
SEED_LIMIT = (2**64, "2**64")  # torch.manual_seed's range


def add(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default="nemotron-h-tiny",
        help="nemotron-h-tiny, qwen3-next-tiny, or a local checkpoint directory",
    )
    p.add_argument(
        "--workload", default="mt-bench", help=f"multi-turn, token-level: {TOKEN_WORKLOADS}"
    )
    p.add_argument("--sessions", type=count(1), default=8, help="serve the first N sessions")
    p.add_argument(
        "--max-new-tokens", type=count(1), default=32, help="tokens generated per request"
    )
    p.add_argument("--kv-tokens", type=count(1), default=65536, help="KV pool size in tokens")
    p.add_argument("--state-slots", type=count(2), default=64, help="state pool size in slots")
    p.add_argument("--chunk-size", type=count(1), default=256, help="prefill chunk size in tokens")
    p.add_argument("--max-running", type=count(1), default=8, help="requests admitted at once")
    p.add_argument(
        "--page-size", type=count(1), default=1, help="KV page in tokens (> 1: extra_buffer)"
    )
    p.add_argument(
        "--policy",
        default=None,
        help="where states are cached and what is evicted: a policy of the replay the engine "
        "runs (default, sglang, sglang-extra-buffer, mambaradix, marconi, marconi@ALPHA, ...; "
        "default: the --compat's, or default)",
    )
    p.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default=None,
        help="SGLang's mamba cache strategy (default: the --policy's, or no_buffer)",
    )
    p.add_argument(
        "--track-interval",
        type=count(1),
        default=None,
        help="extra_buffer: track a state every N decoded tokens (default 256)",
    )
    p.add_argument(
        "--compat",
        choices=[c for c in COMPAT_MODES if c is not None],
        default=None,
        help="an SGLang release's tree and rules (sglang: the current one, 0.5.23)",
    )
    p.add_argument("--seed", type=count(0, SEED_LIMIT), default=0, help="torch.manual_seed")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (never falls back)")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="model and pools")
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="cut every prefill on one grid of --chunk-size positions, so that in bf16 the "
        "cache does not change the answer (no_buffer only)",
    )
    p.add_argument(
        "--single-decode", action="store_true", help="one forward per sequence per decode step"
    )
    p.add_argument("--threads", type=count(1), default=1, help="torch CPU threads (default 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


class EngineKwargs(TypedDict):
    """The `Engine` keyword arguments the command line sets (`validate`)."""

    device: Any  # a torch.device: torch is imported only when the command runs
    dtype: Any  # a torch.dtype
    deterministic: bool
    batch_decode: bool
    kv_tokens: int | None
    state_slots: int | None
    chunk_size: int
    max_running: int
    page_size: int
    strategy: str
    compat: str | None
    track_interval: int
    policy: str | None


def run(args: argparse.Namespace) -> int:
    from mambaradix.compare import compare_cache
    from mambaradix.replay.progress import counter

    start = time.perf_counter()
    engine_kw = validate(args)
    net, sessions = prepare(args, engine_kw["device"], engine_kw["dtype"])
    total = sum(len(s) for s in sessions)
    bar = counter(2 * total, "serving (cache on, then off)", "req", show=not args.no_progress)
    try:
        data = compare_cache(
            sessions,
            args.max_new_tokens,
            model=args.model,
            seed=args.seed,
            on_round=bar.update,
            net=net,
            **engine_kw,
        )
    finally:
        bar.close()
    print_summary(args, len(sessions), data)
    print(f"\n({time.perf_counter() - start:.1f} s)")
    return 0 if data["identical"] else 1


def validate(args: argparse.Namespace) -> EngineKwargs:
    """Everything checked before the model is built; the engine's keyword arguments."""
    try:
        import torch
        import transformers  # noqa: F401

        from mambaradix.engine.models import PRESETS
    except ImportError as e:
        raise UsageError(
            f"{e} (install the engine extra: pip install 'mambaradix[engine]')"
        ) from None
    if args.model not in PRESETS and not Path(args.model).is_dir():
        raise UsageError(
            f"--model: unknown model {args.model!r}; presets: {', '.join(PRESETS)}, "
            "or a local checkpoint directory"
        )
    if _block_level(args.workload):
        raise UsageError(
            f"--workload {args.workload} is a block-level trace (ids of 512-token blocks, not "
            f"token ids): the engine needs token ids; use {TOKEN_WORKLOADS}"
        )
    args.strategy = check_engine_policy(args)
    check_paging(args)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if cpus and args.threads > cpus:  # torch would start them all, or overflow
        raise UsageError(f"--threads {args.threads} is more than the {cpus} CPUs this process has")
    device = check_device(args)
    return {
        "device": device,
        "dtype": getattr(torch, args.dtype),
        "deterministic": args.deterministic,
        "batch_decode": not args.single_decode,
        "kv_tokens": args.kv_tokens,
        "state_slots": args.state_slots,
        "chunk_size": args.chunk_size,
        "max_running": args.max_running,
        "page_size": args.page_size,
        "strategy": args.strategy,
        "compat": args.compat,
        "track_interval": args.track_interval or 256,
        "policy": args.policy,
    }


def check_engine_policy(args: argparse.Namespace) -> str:
    """`--policy` (with `--strategy` and `--compat`, which must agree with it) by the
    engine's own rule (`engine.checks.check_policy`); the strategy it runs."""
    from mambaradix.engine.checks import check_policy

    try:
        return check_policy(args.policy, args.compat, args.strategy)[1]
    except (TypeError, ValueError) as e:
        raise UsageError(f"--{str(e)}" if str(e).startswith(("policy", "strategy", "compat"))
                         else str(e)) from None  # fmt: skip


def check_device(args: argparse.Namespace) -> Any:
    """The torch device asked for; UsageError if it is not one or is absent."""
    from mambaradix.engine.device import resolve_device

    try:
        return resolve_device(args.device)
    except ValueError as e:
        raise UsageError(f"--device {args.device}: {e}") from None


def check_paging(args: argparse.Namespace) -> None:
    """Page size, strategy (and the grid mode it allows), slots and the sizes
    that must be whole pages."""
    from mambaradix.engine.checks import min_state_slots

    page, extra = args.page_size, args.strategy == EXTRA_BUFFER
    if not takes_page(args.strategy, page):
        raise UsageError(f"--page-size {page} needs --strategy extra_buffer: {PAGE_RULE}")
    if args.track_interval and not extra:
        raise UsageError("--track-interval has no effect without --strategy extra_buffer")
    if args.deterministic and extra:
        raise UsageError(
            "--deterministic needs --strategy no_buffer: states are cached only on the grid"
        )
    least = min_state_slots(True, args.strategy)
    if args.state_slots < least:
        raise UsageError(
            f"--state-slots {args.state_slots} is too small for {args.strategy}: a request "
            f"that reuses a cached state holds it, its copy and two track slots ({least})"
        )
    for flag, value in (
        ("--kv-tokens", args.kv_tokens),
        ("--chunk-size", args.chunk_size),
        ("--track-interval", args.track_interval or 256),
    ):
        if value % page:
            raise UsageError(f"{flag} {value} must be a multiple of --page-size {page}")


def _block_level(workload: str) -> bool:
    from mambaradix.replay.workloads import BUNDLED, TraceFormatError, detect_format

    if workload in BUNDLED:
        return workload == "mooncake"
    try:
        return Path(workload).is_file() and detect_format(workload) == "mooncake"
    except (TraceFormatError, OSError):
        return False  # the loader says what is wrong with it


def prepare(args: argparse.Namespace, device: Any, dtype: Any) -> tuple[Any, list[list[list[int]]]]:
    """Torch threads; the sessions (with the vocabulary from the model's config)
    and their sizes, checked before the model is built (a checkpoint can take
    long to load); the model (built once, on its device, for both runs) and
    its memory."""
    import torch
    from transformers.utils import logging as hf_logging

    from mambaradix.engine.models import build_model, vocab_size
    from mambaradix.replay.progress import shown

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # notes on CUDA kernels
    if args.no_progress:  # its bar loading a local checkpoint too
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    torch.set_num_threads(args.threads)
    with model_errors(args):
        vocab = vocab_size(args.model)
    with shown(not args.no_progress):
        sessions = load_sessions(args.workload, vocab, args.sessions)
    check_kv(sessions, args)
    with model_errors(args):
        net = build_model(args.model, args.seed, dtype).to(device)
        check_memory(net, args)  # probes the model's layers
    return net, sessions


@contextmanager
def model_errors(args: argparse.Namespace) -> Iterator[None]:
    """A local checkpoint directory may hold no model, or one that is not
    hybrid: a UsageError naming --model."""
    try:
        yield
    except (ValueError, OSError) as e:
        raise UsageError(f"--model {args.model}: {e}") from None


def load_sessions(workload: str, vocab: int, limit: int) -> list[list[list[int]]]:
    from mambaradix.compare import engine_sessions

    try:
        return engine_sessions(workload, vocab, limit)
    except (ValueError, OSError, ImportError) as e:
        raise UsageError(f"--workload: {e}") from None


def check_kv(sessions: list[list[list[int]]], args: argparse.Namespace) -> None:
    """UsageError naming the largest request when the KV pool cannot admit it
    alone (`scheduler.fits_alone`: prompt + new tokens + one page strictly
    below the pool, and room for the finished sequence)."""
    from mambaradix.engine.checks import kv_need
    from mambaradix.engine.workload import request_sizes
    from mambaradix.scheduler import fits_alone

    new, page, kv = args.max_new_tokens, args.page_size, args.kv_tokens
    s, t, prompt = max(request_sizes(sessions, new), key=lambda x: x[2])
    if not fits_alone(prompt, new, page, kv):
        need, why = kv_need(
            prompt, new, page, "prompt tokens, the engine's earlier answers included,"
        )
        raise UsageError(
            f"--kv-tokens {kv:,} is too small: session {s} turn {t} needs a pool of {need:,} "
            f"tokens ({why}); use --kv-tokens >= {need:,}"
        )


def check_memory(net: Any, args: argparse.Namespace) -> None:
    """UsageError when the pools would not fit (`engine.checks.memory_shortfall`)."""
    from mambaradix.engine.checks import memory_shortfall

    kv, slots, rows = args.kv_tokens, args.state_slots, args.max_running
    short = memory_shortfall(net, kv, slots, rows, kv + args.page_size)
    if short is not None:
        raise UsageError(
            f"--kv-tokens {kv:,}, --state-slots {slots:,} and --max-running {rows:,} {short}"
        )


def print_summary(args: argparse.Namespace, n_sessions: int, data: Mapping[str, Any]) -> None:
    print(
        f"{args.model} on {args.workload}: {n_sessions} sessions, {data['requests']} requests, "
        f"{args.max_new_tokens} new tokens each (prompts carry the engine's own answers)"
    )
    print(f"device {args.device}, {args.dtype}" + (", deterministic" if args.deterministic else ""))
    print(f"outputs identical: {'yes' if data['identical'] else 'no'}")
    if not data["identical"] and args.dtype != "float32" and not args.deterministic:
        print(
            f"(in {args.dtype} a cached run computes other chunks than an uncached one and "
            "rounds differently: --deterministic cuts both on one grid)"
        )
    rows = [
        ("prompt tokens", "prompt_tokens", "{:,.0f}"),
        ("prefill tokens computed", "computed_prefill_tokens", "{:,.0f}"),
        ("hit rate", "hit_rate", "{:.1%}"),
        ("evictions (KV tokens + states)", "evictions", "{:,.0f}"),
        ("retractions", "retractions", "{:,.0f}"),
        ("time per request (s)", "s_per_request", "{:.3f}"),
        ("mean TTFT (s)", "mean_ttft_s", "{:.3f}"),
    ]
    print(f"{'':32}{'cache':>12}{'no cache':>12}")
    for label, key, fmt in rows:
        on, off = data["cache"][key], data["no cache"][key]
        print(f"{label:32}{fmt.format(on):>12}{fmt.format(off):>12}")
    pred, saved = data["replay"], data["cache"]["hit_rate"]
    if pred["token_hit_rate"] is None:
        print(
            f"prefill saved by the cache: {saved:.1%} (bound {pred['bound_token_hit_rate']:.1%}; "
            "states only on the --deterministic grid, which `mambaradix replay` does not model)"
        )
        return
    print(
        f"prefill saved by the cache: {saved:.1%}; `mambaradix replay` "
        f"predicts {pred['token_hit_rate']:.1%} for these requests and pools "
        f"(bound {pred['bound_token_hit_rate']:.1%})"
    )
