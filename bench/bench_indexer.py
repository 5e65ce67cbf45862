"""The indexer's speed: events applied per second, and query time for a 16k-token prompt.

    .venv/bin/python bench/bench_indexer.py [--workers 4 --ops 20000 --block-size 16 --json F]
        [--against FILE_OR_GIT_REV --rounds 9]

Event streams: the serving-like workload of `workload.py` (tenants' system prompts,
multi-turn sessions, eviction under a KV / state budget; matches and locks dropped) is
replayed into one `MambaRadixCache` per worker, each with its own seed, with an
`EventEmitter` on it; the events of each op form one batch. Then, on one core:

* `apply`: `Indexer.apply` on the in-process events (a router fed in-process);
* `feed (RELEASE)`: the same batches encoded as that release sends them, through
  `WorkerFeed.offer` (msgpack decoding, sequence checks, apply): what `mambaradix index`
  does per ZMQ message. vLLM 0.33.0: tagged maps; SGLang 0.5.15.post1: tagged arrays, one
  event per block, no state events; SGLang 0.5.23: tagged maps, consecutive stores
  coalesced, no state events;
* `query`: 8 workers hold a 16,384-token prompt (their first 8,192 tokens shared, states
  every 512 tokens); the time of `Indexer.query` on that prompt plus one token (median
  of the repeats), and on a prompt that shares only the first 8,192 tokens;
* `query_tiers`: the same prompt, answered per tier (device, host, disk), with every
  worker's blocks copied to the host and its states to disk;
* `--against FILE_OR_REV`: another `indexer.py` (a file, or the one of a git revision)
  timed beside this one in the same process, alternating,
  `--rounds` (9), CPU time, least and median: in-process `apply`, `feed (vLLM 0.33.0)` and `query`.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mambaradix import MambaRadixCache  # noqa: E402
from mambaradix.events import DISK, HOST, BlockStored, Event, EventEmitter  # noqa: E402
from mambaradix.events.wire import decode_batch, encode_batch  # noqa: E402
from mambaradix.index import Indexer  # noqa: E402
from mambaradix.index.feed import WorkerFeed  # noqa: E402
from workload import EVICT_CHECK, INSERT, WorkloadConfig, generate  # noqa: E402


def stream(seed: int, n_ops: int, block: int) -> list[list[Event]]:
    """One worker's batches: the workload's inserts and evictions on a tree."""
    w = generate(WorkloadConfig(seed=seed, n_ops=n_ops))
    tree = MambaRadixCache(page_size=1)
    emitter = EventEmitter(tree, block)
    budget_kv, budget_st = w.config.kv_budget, w.config.state_budget
    batches: list[list[Event]] = []
    for op in w.ops:
        if op[0] == INSERT:
            _, seq, n, _, base, state = op
            tree.insert(w.seqs[seq][:n], array("q", range(base, base + n)), state)
        elif op[0] == EVICT_CHECK:
            kv, st = tree.total_size()
            if kv > budget_kv or st > budget_st:
                tree.evict(max(kv - budget_kv, 0), max(st - budget_st, 0))
        else:
            continue
        events = emitter.take()
        if events:
            batches.append(events)
    return batches


def time_apply(
    streams: dict[int, list[list[Event]]], block: int, cls: Any = Indexer, clock: Any = None
) -> float:
    ix = cls(block)
    clock = clock or time.perf_counter
    t0 = clock()
    for worker, batches in streams.items():
        for batch in batches:
            ix.apply(worker, batch)
    return clock() - t0


def time_feed(
    payloads: dict[int, list[bytes]], block: int, cls: Any = Indexer, clock: Any = None
) -> float:
    ix = cls(block)
    feeds = {w: WorkerFeed(ix, w) for w in payloads}
    clock = clock or time.perf_counter
    t0 = clock()
    for worker, items in payloads.items():
        offer = feeds[worker].offer
        for seq, payload in enumerate(items):
            offer(seq, payload, 0.0)
    elapsed = clock() - t0
    assert all(f.last == len(payloads[w]) - 1 for w, f in feeds.items())
    return elapsed


def query_setup(
    block: int, workers: int = 8, tokens: int = 16_384, cls: Any = Indexer
) -> tuple[Any, list[int]]:
    rng = random.Random(0)
    shared = [rng.randrange(32_000) for _ in range(tokens // 2)]
    ix = cls(block)
    prompt: list[int] = []
    for w in range(workers):
        seq = shared + [rng.randrange(32_000) for _ in range(tokens - len(shared))]
        prompt = prompt or seq
        hashes = list(range(w << 32, (w << 32) + tokens // block))
        ix.apply(w, [BlockStored(tuple(hashes), None, seq, block)])
        states = [h for k, h in enumerate(hashes) if (k + 1) * block % 512 == 0]
        ix.apply(w, [BlockStored((h,), None, [0] * block, block, 1, "mamba") for h in states])
    return ix, prompt


def time_query(ix: Any, prompt: list[int], repeats: int, tiers: bool = False) -> float:
    ask = ix.query_tiers if tiers else ix.query
    ask(prompt)  # warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        ask(prompt)
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--ops", type=int, default=20_000, help="workload ops per worker")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=300, help="queries timed")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--against", default=None, help="another indexer.py (a file or a git revision) beside this"
    )
    ap.add_argument("--rounds", type=int, default=9, help="alternating rounds for --against")
    args = ap.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    block = args.block_size
    t0 = time.perf_counter()
    streams = {w: stream(w, args.ops, block) for w in range(args.workers)}
    events = sum(len(b) for s in streams.values() for b in s)
    blocks = sum(
        len(getattr(e, "block_hashes", ())) for s in streams.values() for b in s for e in b
    )
    print(
        f"streams: {args.workers} workers, {events:,} events ({blocks:,} blocks) "
        f"in {sum(map(len, streams.values())):,} batches, made in {time.perf_counter() - t0:.1f} s"
    )
    rows: dict[str, Any] = {"events": events, "blocks": blocks}
    s = time_apply(streams, block)
    rows["apply"] = {"s": s, "events_per_s": events / s, "blocks_per_s": blocks / s}
    singles = {w: [_one_block_each(b) for b in bs] for w, bs in streams.items()}
    n = sum(len(b) for bs in singles.values() for b in bs)
    s = time_apply(singles, block)
    rows["apply_1block"] = {"s": s, "events": n, "events_per_s": n / s, "blocks_per_s": blocks / s}
    for release in ("vllm-0.33.0", "sglang-0.5.15.post1", "sglang-0.5.23"):
        payloads = {w: [encode_batch(b, release) for b in bs] for w, bs in streams.items()}
        n = sum(len(decode_batch(p).events) for ps in payloads.values() for p in ps)
        s = time_feed(payloads, block)
        rows[f"feed_{release}"] = {
            "s": s,
            "events": n,
            "events_per_s": n / s,
            "blocks_per_s": blocks / s,
        }
    for name, row in rows.items():
        if isinstance(row, dict):
            rate, blocks_rate = row["events_per_s"], row["blocks_per_s"]
            print(f"{name:24s} {rate:>12,.0f} events/s {blocks_rate:>12,.0f} blocks/s")
    ix, prompt = query_setup(block)
    full = time_query(ix, prompt + [1], args.repeats)
    half = time_query(ix, prompt[: len(prompt) // 2] + [7] * (len(prompt) // 2) + [1], args.repeats)
    answer = ix.query(prompt + [1])[0]
    rows["query_16k_us"] = {"full_match": full, "half_match": half}
    print(
        f"query, 16,385-token prompt, 8 workers: {full:,.0f} µs (all 16,384 cached; "
        f"worker 0: {answer}), {half:,.0f} µs (8,192 shared)"
    )
    lower_tiers(ix, block)
    tiered = time_query(ix, prompt + [1], args.repeats, tiers=True)
    rows["query_tiers_16k_us"] = tiered
    print(f"query_tiers, the same prompt, blocks also on host, states on disk: {tiered:,.0f} µs")
    if args.against:
        other = indexer_source(args.against)
        rows["against"] = against(other, streams, block, args.repeats, args.rounds)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


def lower_tiers(ix: Indexer, block: int) -> None:
    """Every worker's blocks copied to the host and its states to disk (by hash)."""
    for w in ix.worker_ids():
        events = [e for e in ix.dump(w) if isinstance(e, BlockStored)]
        kv = [h for e in events if e.group == 0 for h in e.block_hashes]
        states = [h for e in events if e.group == 1 for h in e.block_hashes]
        ix.apply(w, [BlockStored(tuple(kv), None, [], 0, medium=HOST)])
        ix.apply(w, [BlockStored(tuple(states), None, [], 0, 1, "mamba", DISK)])


def indexer_source(spec: str) -> Path:
    """`spec` if it is a file, else the indexer.py of git revision `spec`, in a temp file."""
    if Path(spec).is_file():
        return Path(spec)
    root = Path(__file__).resolve().parents[1]
    show = ["git", "-C", str(root), "show", f"{spec}:src/mambaradix/index/indexer.py"]
    done = subprocess.run(show, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"--against: {spec!r} is neither a file nor a git revision")
    out = Path(tempfile.mkdtemp()) / f"indexer_{spec}.py"
    out.write_text(done.stdout)
    return out


def against(
    path: Path, streams: dict[int, list[list[Event]]], block: int, repeats: int, rounds: int
) -> Any:
    """This indexer and the one in `path`, side by side, `rounds` alternating rounds
    (each first half the time; CPU time, garbage collection off: other processes on a
    shared machine inflate wall time): this one's time over the other's, least and
    median."""
    spec = importlib.util.spec_from_file_location("other_indexer", path)
    assert spec is not None and spec.loader is not None
    other = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = other  # dataclasses look their module up
    spec.loader.exec_module(other)
    payloads = {w: [encode_batch(b, "vllm-0.33.0") for b in bs] for w, bs in streams.items()}
    times: dict[tuple[str, str], list[float]] = {}
    cpu = time.process_time
    gc.disable()  # a collection would land on whichever indexer happens to be timed
    pair = [("this", Indexer), ("other", other.Indexer)]
    for r in range(rounds):
        for name, cls in pair if r % 2 else pair[::-1]:  # each goes first half the time
            gc.collect()
            ix, prompt = query_setup(block, cls=cls)
            t0 = cpu()
            for _ in range(repeats):
                ix.query(prompt + [1])
            queries = (cpu() - t0) / repeats
            for measure, s in (
                ("apply", time_apply(streams, block, cls, cpu)),
                ("feed_vllm-0.33.0", time_feed(payloads, block, cls, cpu)),
                ("query_16k", queries),
            ):
                times.setdefault((measure, name), []).append(s)
    gc.enable()
    out = {}
    for measure in ("apply", "feed_vllm-0.33.0", "query_16k"):
        this, that = times[(measure, "this")], times[(measure, "other")]
        least = min(this) / min(that)
        middle = statistics.median(this) / statistics.median(that)
        out[measure] = {"this_s": this, "other_s": that, "least": least, "median": middle}
        print(
            f"against {path.name}: {measure:18s} {least:.3f}x the time (least), "
            f"{middle:.3f}x (median) of {rounds} rounds"
        )
    return out


def _one_block_each(batch: list[Event]) -> list[Event]:
    """The batch with every multi-block BlockStored split into one event per block."""
    out: list[Event] = []
    for e in batch:
        if isinstance(e, BlockStored) and len(e.block_hashes) > 1:
            size, parent = e.block_size, e.parent_block_hash
            for i, h in enumerate(e.block_hashes):
                tokens = e.token_ids[i * size : (i + 1) * size]
                out.append(BlockStored((h,), parent, tokens, size, e.group, e.kind, e.medium))
                parent = h
        else:
            out.append(e)
    return out


if __name__ == "__main__":
    sys.exit(main())
