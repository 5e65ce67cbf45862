"""How match / insert / lock / evict time grows with key length, path depth and tree size.

    .venv/bin/python bench/bench_scaling.py [--reps 25] [--lengths 1k,2k,...] [--sizes 100,1000]

Implementations, each called the way `bench_vs_sglang.py` calls it (inputs pre-built, only the
cache call timed): SGLang 0.5.15.post1's MambaRadixCache ("sglang"), ours with
compat="sglang-0.5.15.post1" ("compat"), ours with compat=None ("default"), ours with
compat="sglang-0.5.23" ("compat23"), SGLang 0.5.23's UnifiedRadixCache over its compiled Rust
tree core ("rust", its default backend) and over its Python tree core ("py23"); `--impls`
picks a subset. Every cell is the median of `--reps` timed calls, in microseconds, with the
empty perf_counter_ns pair subtracted. Ratios: sglang / compat, sglang / default,
rust / compat23, rust / default, py23 / rust.

Table 1, key length L (1k-64k tokens), tree holding a few other sequences of length L:
  match_1edge    match a cached L-token sequence stored as one edge (full hit)
  match_chain    match a cached L-token sequence stored as a chain of 1k-token turns
                 (L/1024 nodes on the path: a multi-turn conversation), full hit
  insert_new     insert a fresh L-token sequence (no shared prefix): one new leaf; steady
                 state (a tree of 4 such leaves, the LRU one evicted untimed before each)
  insert_extend  insert chain sequence + 256 new tokens with prev_prefix_len = L (the next
                 turn: walk L cached tokens, add a 256-token leaf)
Table 2, path depth D (a 16k-token sequence cached as D equal turns):
  match, lock, unlock of the deepest node, and insert_extend (+256 tokens); then, ours only,
  the LRU refresh a match makes: match minus the same match with read_only=True (no
  refresh); compat refreshes every node of the path, the default mode one (core/tree.py).
Table 3, tree size (about N nodes: 8 tenants' 1k-token system prompts, sessions of two
  200-token turns below them): match_hit of a session (about 1.4k tokens, depth 3),
  insert_turn (+200 tokens), lock, unlock, evict_kv (1 token -> the LRU leaf), evict_state
  (1 state).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from array import array
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from drivers import (  # noqa: E402
    Ours,
    Unified,
    Upstream,
    add_common_args,
    picked,
    set_torch_threads,
    timer_overhead_ns,
    warm_allocator,
)

VOCAB = 32_000
OVERHEAD = 0


MAKERS = {
    "sglang": lambda: Upstream(),
    "compat": lambda: Ours("sglang-0.5.15.post1"),
    "default": lambda: Ours(None),
    "compat23": lambda: Ours("sglang-0.5.23"),  # before rust / py23: by_size sizes them by it
    "rust": lambda: Unified("rust"),
    "py23": lambda: Unified("python"),
}
NAMES: tuple[str, ...] = tuple(MAKERS)
RATIOS = (
    ("sglang", "compat"),
    ("sglang", "default"),
    ("rust", "compat23"),
    ("rust", "default"),
    ("py23", "rust"),
)


class Tokens:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.kv = 1 << 20
        self.state = 1

    def seq(self, n: int) -> array[int]:
        return array("q", [self.rng.randrange(VOCAB) for _ in range(n)])

    def base(self, n: int) -> int:
        self.kv += n
        return self.kv - n

    def st(self) -> int:
        self.state += 1
        return self.state


def us(samples: list[int]) -> float:
    return max(statistics.median(samples) - OVERHEAD, 0) / 1e3


def fill(impl: Any, tok: Tokens, key: array[int], prev: int = 0) -> None:
    impl.insert(impl.prep_insert(key, tok.base(len(key)), tok.st(), prev))


def chain(impl: Any, tok: Tokens, seq: array[int], step: int) -> None:
    """Cache seq as consecutive turns of `step` tokens (each turn's end holds a state)."""
    for end in range(step, len(seq) + 1, step):
        fill(impl, tok, seq[:end], end - step)


def by_length(lengths: list[int], reps: int, seed: int) -> dict[str, dict[int, dict[str, float]]]:
    out: dict[str, dict[int, dict[str, float]]] = {}
    for n in lengths:  # implementations interleaved per cell
        for name in NAMES:
            make = MAKERS[name]
            out.setdefault(name, {})
            tok = Tokens(seed)  # same tokens for every implementation
            impl = make()
            edge_seqs = [tok.seq(n) for _ in range(4)]
            chain_seqs = [tok.seq(n) for _ in range(4)]
            for s in edge_seqs:
                fill(impl, tok, s)
            for s in chain_seqs:
                chain(impl, tok, s, min(1024, n))
            res: dict[str, list[int]] = {
                k: [] for k in ("match_1edge", "match_chain", "insert_new", "insert_extend")
            }
            for i in range(reps):
                s = edge_seqs[i % 4]
                t, m = impl.match(impl.prep_match(s))
                assert m.prefix_len == n, (name, n, m.prefix_len)
                res["match_1edge"].append(t)
                s = chain_seqs[i % 4]
                t, m = impl.match(impl.prep_match(s))
                assert m.prefix_len == n, (name, n, m.prefix_len)
                res["match_chain"].append(t)
                ext = s + tok.seq(256)
                res["insert_extend"].append(
                    impl.insert(impl.prep_insert(ext, tok.base(len(ext)), tok.st(), n))[0]
                )
            # insert_new in steady state: a tree of 4 L-token leaves; before each timed insert
            # the LRU leaf is evicted (untimed), so memory is recycled as in a long-running
            # server instead of every insert page-faulting fresh memory (see evict_lru_leaf).
            impl = make()
            for _ in range(4):
                fill(impl, tok, tok.seq(n))
            for _ in range(reps):
                impl.evict_lru_leaf()
                res["insert_new"].append(
                    impl.insert(impl.prep_insert(tok.seq(n), tok.base(n), tok.st()))[0]
                )
            out[name][n] = {k: us(v) for k, v in res.items()}
    return out


def by_depth(
    depths: list[int], reps: int, seed: int, n: int = 16_384
) -> dict[str, dict[int, dict[str, float]]]:
    out: dict[str, dict[int, dict[str, float]]] = {}
    for depth in depths:  # implementations interleaved per cell
        for name in NAMES:
            make = MAKERS[name]
            out.setdefault(name, {})
            tok = Tokens(seed)
            impl = make()
            s = tok.seq(n)
            chain(impl, tok, s, n // depth)
            res: dict[str, list[int]] = {
                k: [] for k in ("match", "lock", "unlock", "insert_extend")
            }
            for rep in range(reps):
                if isinstance(impl, Ours) and rep % 2:  # either one first: neither warms the other
                    res.setdefault("match_read_only", []).append(impl.match_read_only(s))
                t, m = impl.match(impl.prep_match(s))
                assert m.prefix_len == n
                res["match"].append(t)
                if isinstance(impl, Ours) and not rep % 2:
                    res.setdefault("match_read_only", []).append(impl.match_read_only(s))
                t, h = impl.lock(m.node)
                res["lock"].append(t)
                res["unlock"].append(impl.unlock(h))
                ext = s + tok.seq(256)
                res["insert_extend"].append(
                    impl.insert(impl.prep_insert(ext, tok.base(len(ext)), tok.st(), n))[0]
                )
            out[name][depth] = {k: us(v) for k, v in res.items()}
    return out


def by_size(sizes: list[int], reps: int, seed: int) -> dict[str, dict[int, dict[str, float]]]:
    out: dict[str, dict[int, dict[str, float]]] = {}
    filled: dict[int, int] = {}  # compat23's session count per size
    counted: dict[int, int] = {}  # and its node count
    for size in sizes:  # implementations interleaved per cell
        for name in NAMES:
            make = MAKERS[name]
            out.setdefault(name, {})
            tok = Tokens(seed)
            rng = random.Random(seed + 1)
            impl = make()
            sys_prompts = [tok.seq(1024) for _ in range(8)]
            sessions: list[array[int]] = []
            # an implementation that cannot count its nodes gets as many sessions as compat23
            # (the same decisions as SGLang 0.5.23, so the same tree)
            wanted = None if impl.nodes() is not None else filled[size]
            while (impl.nodes() < size) if wanted is None else (len(sessions) < wanted):
                prompt = rng.choice(sys_prompts) + tok.seq(200)
                fill(impl, tok, prompt)
                full = prompt + tok.seq(200)
                fill(impl, tok, full, len(prompt))
                sessions.append(full)
            res: dict[str, list[int]] = {
                k: []
                for k in ("match_hit", "insert_turn", "lock", "unlock", "evict_kv", "evict_state")
            }
            nodes = impl.nodes()
            if name == "compat23":
                filled[size], counted[size] = len(sessions), nodes
            if nodes is None:
                nodes = counted[size]
            for _ in range(reps):
                s = rng.choice(sessions)
                t, m = impl.match(impl.prep_match(s))
                res["match_hit"].append(t)
                t, h = impl.lock(m.node)
                res["lock"].append(t)
                res["unlock"].append(impl.unlock(h))
                ext = s + tok.seq(200)
                res["insert_turn"].append(
                    impl.insert(impl.prep_insert(ext, tok.base(len(ext)), tok.st(), len(s)))[0]
                )
            for _ in range(reps):
                res["evict_kv"].append(impl.evict(1, 0)[0])
            for _ in range(reps):
                res["evict_state"].append(impl.evict(0, 1)[0])
            out[name][size] = {"nodes": nodes, **{k: us(v) for k, v in res.items()}}
    return out


def print_table(title: str, axis: str, data: dict[str, dict[int, dict[str, float]]]) -> None:
    print(f"\n{title}  (median µs per call; ratio = reference / side)")
    names = [n for n in NAMES if n in data]
    pairs = [(a, b) for a, b in RATIOS if a in data and b in data]
    first = data[names[0]]
    cols = [c for c in next(iter(first.values())) if c != "nodes"]
    for col in cols:
        if not all(col in data[n][x] for n in names for x in first):
            continue  # ours only (match_read_only): print_refresh shows it
        print(f"  {col}")
        print(
            f"    {axis:>11} "
            + " ".join(f"{n:>9}" for n in names)
            + " "
            + " ".join(f"{a + '/' + b:>16}" for a, b in pairs)
        )
        for x, row in first.items():
            label = f"{x}" if "nodes" not in row else f"{x} ({row['nodes']})"
            cells = " ".join(f"{data[n][x][col]:>9.1f}" for n in names)
            ratios = " ".join(
                f"{data[a][x][col] / max(data[b][x][col], 1e-3):>15.1f}x" for a, b in pairs
            )
            print(f"    {label:>11} {cells} {ratios}")


def print_refresh(data: dict[str, dict[int, dict[str, float]]]) -> None:
    """Ours only: what a match's LRU refresh costs (match minus a read-only match)."""
    ours = [n for n in ("compat", "default", "compat23") if n in data]
    if not ours:
        return
    print("\n  match's LRU refresh, ours only (match - read-only match, µs)")
    print(f"    {'depth':>8} " + " ".join(f"{n:>10}" for n in ours))
    for depth in data[ours[0]]:
        cells = [data[name][depth] for name in ours]
        print(
            f"    {depth:>8} "
            + " ".join(f"{c['match'] - c['match_read_only']:>10.1f}" for c in cells)
        )


def parse_ints(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        out.append(int(part[:-1]) * 1024 if part.endswith("k") else int(part))
    return out


def main(argv: list[str] | None = None) -> int:
    global OVERHEAD, NAMES
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lengths", default="1k,2k,4k,8k,16k,32k,64k")
    ap.add_argument("--depths", default="1,8,64,512")
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--only", choices=("length", "depth", "size"))
    add_common_args(ap, "--impls", NAMES)
    args = ap.parse_args(argv)
    impls = picked(ap, "--impls", args.impls, tuple(MAKERS))
    if any(x in impls for x in ("rust", "py23")) and "compat23" not in impls:
        impls += ("compat23",)  # by_size sizes SGLang 0.5.23's trees by it
    NAMES = tuple(n for n in MAKERS if n in impls)
    warm_allocator()
    set_torch_threads(args.torch_threads)
    OVERHEAD = timer_overhead_ns()
    print(f"timer overhead {OVERHEAD} ns (subtracted); reps={args.reps}")
    if args.only in (None, "length"):
        print_table(
            "Key length (tokens)",
            "tokens",
            by_length(parse_ints(args.lengths), args.reps, args.seed),
        )
    if args.only in (None, "depth"):
        depth_data = by_depth(parse_ints(args.depths), args.reps, args.seed)
        print_table("Path depth (16k-token key, D nodes)", "depth", depth_data)
        print_refresh(depth_data)
    if args.only in (None, "size"):
        print_table(
            "Tree size (nodes requested (actual))",
            "nodes",
            by_size(parse_ints(args.sizes), args.reps, args.seed),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
