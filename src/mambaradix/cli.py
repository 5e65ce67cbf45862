"""Command line: `mambaradix demo`."""

from __future__ import annotations

import argparse
import sys
import time

from mambaradix.demo import run_demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mambaradix", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="multi-turn sessions through the cache, both behaviours")
    demo.add_argument("--sessions", type=int, default=24)
    demo.add_argument("--turns", type=int, default=6)
    demo.add_argument("--kv-tokens", type=int, default=60_000, help="KV pool size in tokens")
    demo.add_argument("--state-slots", type=int, default=48, help="state pool size in slots")
    demo.add_argument("--chunk", type=int, default=512, help="prefill chunk size in tokens")
    demo.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    print(
        run_demo(args.sessions, args.turns, args.kv_tokens, args.state_slots, args.chunk, args.seed)
    )
    print(f"\n({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
