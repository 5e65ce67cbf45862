"""`mambaradix demo`: multi-turn sessions through the cache, both tree behaviours."""

from __future__ import annotations

import argparse
import time

from mambaradix.cli.checks import UsageError, count


def add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sessions", type=count(1), default=24, help="conversations")
    p.add_argument("--turns", type=count(1), default=6, help="turns per conversation")
    p.add_argument("--kv-tokens", type=count(1), default=60_000, help="KV pool size in tokens")
    p.add_argument("--state-slots", type=count(2), default=48, help="state pool size in slots")
    p.add_argument("--chunk", type=count(1), default=512, help="prefill chunk size in tokens")
    p.add_argument("--seed", type=count(0), default=0, help="of the made-up conversations")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from mambaradix.demo import check_fits, demo_sessions, memory_shortfall, report
    from mambaradix.replay import progress

    start = time.perf_counter()
    short = memory_shortfall(args.sessions, args.turns, args.kv_tokens, args.state_slots)
    if short is not None:
        raise UsageError(
            f"--sessions {args.sessions:,}, --turns {args.turns:,}, --kv-tokens "
            f"{args.kv_tokens:,} and --state-slots {args.state_slots:,} {short}"
        )
    work = demo_sessions(args.sessions, args.turns, args.seed)
    try:
        check_fits(work, args.kv_tokens)
    except ValueError as e:
        raise UsageError(str(e).replace("kv_tokens", "--kv-tokens")) from None
    what = f"{args.sessions} sessions x {args.turns} turns"
    desc = "serving (mambaradix, then sglang's rules)"
    show = not args.no_progress
    bar = progress.counter(2 * len(work), desc, "req", show=show, delay=progress.DELAY_S)
    try:
        text = report(work, what, args.kv_tokens, args.state_slots, args.chunk, bar.update)
    finally:
        bar.close()
    print(text)
    print(f"\n({time.perf_counter() - start:.1f} s)")
    return 0
