"""What the debug thread guard (core/threads.py) costs, guarded against plain, side by side.

    .venv/bin/python bench/bench_thread_guard.py            # 2,000 turns, 7 rounds

One workload (multi-turn sessions: match, insert, an eviction every 50 turns) on a plain
cache and on a guarded one, alternated round by round; medians and their ratio. Off (the
default) the cache is the plain class, so the guard's whole cost there is the one check in
the constructor, timed last.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from mambaradix import MambaRadixCache


def workload(turns: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    sessions: list[list[int]] = [[] for _ in range(32)]
    keys = []
    for _ in range(turns):
        s = sessions[rng.randrange(len(sessions))]
        if len(s) > 1_000:  # the session ends; a new one starts
            s.clear()
        s += [rng.randrange(50_000) for _ in range(rng.randrange(20, 100))]
        keys.append(list(s))
    return keys


def serve(cache: MambaRadixCache, keys: list[list[int]]) -> float:
    start = time.perf_counter()
    kv = 0
    for i, key in enumerate(keys):
        hit = cache.match_prefix(key).prefix_len
        new = len(key) - hit
        cache.insert(key[: hit + new], list(range(kv, kv + len(key))), kv, prev_prefix_len=0)
        kv += len(key)
        if i % 50 == 49:
            cache.evict(kv_tokens=2_000, states=10)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--turns", type=int, default=2_000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    keys = workload(args.turns)
    plain, guarded = [], []
    for _ in range(args.rounds):
        plain.append(serve(MambaRadixCache(check_threads=False), keys))
        guarded.append(serve(MambaRadixCache(check_threads=True), keys))
    p, g = statistics.median(plain), statistics.median(guarded)
    print(
        f"{args.turns} turns, median of {args.rounds}: plain {p * 1e3:.1f} ms, guarded "
        f"{g * 1e3:.1f} ms, guarded / plain {g / p:.3f}"
    )
    n = 20_000
    start = time.perf_counter()
    for _ in range(n):
        MambaRadixCache(check_threads=False)
    build = (time.perf_counter() - start) / n
    start = time.perf_counter()
    for _ in range(n):
        MambaRadixCache()
    default = (time.perf_counter() - start) / n
    print(
        f"constructor: check_threads=False {build * 1e6:.2f} us, default (reads the "
        f"environment) {default * 1e6:.2f} us"
    )


if __name__ == "__main__":
    main()
