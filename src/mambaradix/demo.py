"""A short demo of the cache: the same multi-turn sessions served with the
default behaviour and with compat="sglang" (SGLang 0.5.23), side by side.

Sessions share a few long system prompts; every turn's prompt is the session's
whole history plus a new user message; some prompts are re-sent verbatim (a
retry). Requests run one after another through the scheduler (the same driver the
engine and the replay use) with a stand-in model and small pools, so eviction
happens.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Callable

from mambaradix.core.tree import MambaRadixCache
from mambaradix.lifecycle import CacheManager
from mambaradix.pools import (
    FingerprintStatePool,
    ReqToTokenTable,
    StateSlotAllocator,
    TokenKVAllocator,
)
from mambaradix.scheduler import (
    FingerprintForward,
    Scheduler,
    SchedulerConfig,
    Sequence,
    admission_need,
    fits_alone,
    slots_alone,
)
from mambaradix.validate import HOST_BYTES_PER_ID, as_count, as_int, as_positive, available_bytes

Turn = tuple[list[int], list[int]]


def demo_sessions(sessions: int, turns: int, seed: int, vocab: int = 32_000) -> list[Turn]:
    """(prompt, answer) pairs of interleaved multi-turn sessions."""
    rng = random.Random(seed)
    systems = [[rng.randrange(vocab) for _ in range(rng.randint(500, 2000))] for _ in range(3)]
    histories = [list(rng.choice(systems)) for _ in range(sessions)]
    out: list[Turn] = []
    for _ in range(turns):
        for s in rng.sample(range(sessions), sessions):
            prompt = histories[s] + [rng.randrange(vocab) for _ in range(rng.randint(20, 200))]
            answer = [rng.randrange(vocab) for _ in range(rng.randint(50, 400))]
            out.append((prompt, answer))
            if rng.random() < 0.1:
                out.append((prompt, answer))  # a client retry: the same prompt again
            histories[s] = prompt + answer
    return out


def serve_all(
    compat: str | None,
    turns: list[Turn],
    kv_tokens: int,
    slots: int,
    chunk: int,
    on_request: Callable[[int], object] | None = None,
) -> dict[str, float]:
    """Serve the turns through the scheduler, one at a time, with a stand-in
    model; `on_request(1)` after each (a progress bar)."""
    pool = FingerprintStatePool(slots)
    context = max(len(p) + len(a) for p, a in turns)
    mgr = CacheManager(
        MambaRadixCache(page_size=1, chunk_size=64, compat=compat),
        TokenKVAllocator(kv_tokens),
        StateSlotAllocator(slots),
        pool,
        ReqToTokenTable(1, context + 1),
    )
    sched = Scheduler(
        mgr,
        FingerprintForward(mgr, pool),
        config=SchedulerConfig(chunk_tokens=chunk, max_running=1),
    )
    seqs = []
    for i, (prompt, answer) in enumerate(turns):
        seq = Sequence(array("q", prompt), len(answer), script=array("q", answer), id=i)
        sched.submit(seq)
        seqs.append(seq)
        sched.run()
        if on_request is not None:
            on_request(1)
    mgr.tree.check_invariants()
    mgr.check_conservation()
    prompt_tokens = sum(s.prompt_tokens for s in seqs)
    cached = sum(s.cached_tokens for s in seqs)
    return {
        "requests": len(turns),
        "prompt tokens": prompt_tokens,
        "cached tokens": cached,
        "token hit rate": cached / prompt_tokens,
        "KV tokens evicted": mgr.evictions["kv_tokens"],
        "states evicted": mgr.evictions["states"],
        "tree nodes": mgr.tree.node_count(),
    }


def tiny_tree() -> str:
    """A four-insert example showing a split, a tombstone and a namespace."""
    cache = MambaRadixCache()
    cache.insert([1, 2, 3], [10, 11, 12], state=0)
    # prev_prefix_len: the positions below it are the tree's own indices (the
    # tree refuses an index it already holds from there on)
    cache.insert([1, 2, 3, 4, 5, 6, 7], [10, 11, 12, 13, 14, 15, 16], state=1, prev_prefix_len=3)
    cache.insert([1, 2, 3, 4, 5, 60, 70], [10, 11, 12, 13, 14, 17, 18], state=2, prev_prefix_len=5)
    cache.insert([1, 2, 3], [20, 21, 22], state=3, extra_key="lora-b")
    cache.evict(states=1)  # the least recently used state, [1,2,3], becomes a tombstone
    return cache.pretty()


MIN_SLOTS = slots_alone(0)  # a request locks the state it matched and runs in a copy
MIN_REQUEST_BYTES = 16 * 520  # the least prompt (500 system + 20 user tokens), 8 B a token
# in its list and again in the scheduler's array


def memory_shortfall(sessions: int, turns: int, kv_tokens: int, slots: int) -> str | None:
    """None, or 'need at least X GB ...' when the demo's requests (a lower
    bound: every prompt at its least) and its pools' free lists would not
    fit in half of this machine's available memory."""
    have = available_bytes()
    work = sessions * turns * MIN_REQUEST_BYTES
    pools = HOST_BYTES_PER_ID * kv_tokens + (HOST_BYTES_PER_ID + 8) * slots
    if have is None or work + pools <= have // 2:
        return None
    return (
        f"need at least {(work + pools) / 1e9:.1f} GB of this machine's memory ({work / 1e9:.1f}"
        f" GB of prompts, {pools / 1e9:.1f} GB of pools; half stays free) and only "
        f"{have / 1e9:.1f} GB is available"
    )


def check_demo_args(
    sessions: int, turns: int, kv_tokens: int, slots: int, chunk: int, seed: int
) -> None:
    """TypeError / ValueError naming the first argument that makes no sense."""
    for value, name in ((sessions, "sessions"), (turns, "turns"), (kv_tokens, "kv_tokens")):
        as_positive(value, name)
    if as_int(slots, "slots") < MIN_SLOTS:
        raise ValueError(f"slots must be >= {MIN_SLOTS} (the matched state and the running one)")
    as_positive(chunk, "chunk")
    as_count(seed, "seed")


def check_fits(work: list[Turn], kv_tokens: int) -> None:
    """ValueError unless the KV pool admits the largest request alone: the
    scheduler wants its prompt, its answer and one token more strictly free."""
    needs = [admission_need(len(p), len(a), 1) + 1 for p, a in work]
    i = max(range(len(needs)), key=needs.__getitem__)
    if not fits_alone(len(work[i][0]), len(work[i][1]), 1, kv_tokens):
        raise ValueError(
            f"kv_tokens {kv_tokens:,} is too small: request {i} ({len(work[i][0]):,} prompt + "
            f"{len(work[i][1]):,} answer tokens) needs a pool of {needs[i]:,}; "
            f"use kv_tokens >= {needs[i]:,}"
        )


def run_demo(sessions: int, turns: int, kv_tokens: int, slots: int, chunk: int, seed: int) -> str:
    """The demo's report; ValueError / TypeError first for arguments that make
    no sense or a KV pool too small for the largest request."""
    check_demo_args(sessions, turns, kv_tokens, slots, chunk, seed)
    short = memory_shortfall(sessions, turns, kv_tokens, slots)
    if short is not None:
        raise ValueError(
            f"sessions={sessions:,}, turns={turns:,}, kv_tokens={kv_tokens:,} and "
            f"slots={slots:,} {short}"
        )
    work = demo_sessions(sessions, turns, seed)
    check_fits(work, kv_tokens)
    return report(work, f"{sessions} sessions x {turns} turns", kv_tokens, slots, chunk)


def report(
    work: list[Turn],
    what: str,
    kv_tokens: int,
    slots: int,
    chunk: int,
    on_request: Callable[[int], object] | None = None,
) -> str:
    """Serve checked `work` with both tree behaviours; the side-by-side report.
    `on_request(1)` after each request of either (a progress bar)."""
    rows = {
        name: serve_all(compat, work, kv_tokens, slots, chunk, on_request)
        for name, compat in (("mambaradix", None), ("sglang-0.5.23", "sglang-0.5.23"))
    }
    lines = [
        f"{what}, KV pool {kv_tokens} tokens, {slots} state slots, prefill chunk {chunk}",
        "",
        f"{'':22}" + "".join(f"{name:>16}" for name in rows),
    ]
    for metric in next(iter(rows.values())):
        cells = [rows[name][metric] for name in rows]
        fmt = "{:>16.1%}" if metric == "token hit rate" else "{:>16,}"
        lines.append(f"{metric:22}" + "".join(fmt.format(c) for c in cells))
    lines += ["", "A tiny tree (a split, a tombstone, a namespace):", tiny_tree()]
    return "\n".join(lines)
