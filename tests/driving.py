"""Test helpers: the scheduler over a stand-in model, checked after every step.

The "model" is a `FingerprintStatePool`: running a token folds it into the
slot's fingerprint, so every slot carries a hash of exactly the tokens it
consumed, and any state mix-up (a missed copy-on-write, a wrong donation, a
stale tracked slot) shows as a fingerprint mismatch. `check_everything` checks
the tree's invariants, conservation of every KV index / page and state slot,
every cached state and every running state.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mambaradix import MambaRadixCache
from mambaradix.core.node import TreeNode
from mambaradix.lifecycle import CacheManager
from mambaradix.pools import (
    FingerprintStatePool,
    PagedKVAllocator,
    ReqToTokenTable,
    StateSlotAllocator,
    TokenKVAllocator,
    fingerprint_of,
)
from mambaradix.scheduler import (
    STALLED,
    FingerprintForward,
    Scheduler,
    SchedulerConfig,
    Sequence,
)

CONFIGS = [  # (strategy, page size)
    ("no_buffer", 1),
    ("extra_buffer", 1),
    ("extra_buffer", 16),
    ("extra_buffer", 64),
]


@dataclass
class Job:
    prompt: list[int]
    answer: list[int]
    extra_key: object = None


def tree_snapshot(cache: MambaRadixCache) -> tuple[Any, ...]:
    """Everything observable about a tree, LRU orders and clocks included: equal
    snapshots before and after a refused call show it changed nothing."""
    kv_list, st_list = cache.lru
    return (
        cache.pretty(),
        cache.full_evictable_size(),
        cache.full_protected_size(),
        cache.state_evictable_size(),
        cache.state_protected_size(),
        cache.node_count(),
        list(cache.all_kv_indices()),
        cache.all_states(),
        [link.node.id for link in kv_list],
        [link.node.id for link in st_list],
        kv_list.clock,
        st_list.clock,
    )


def make_manager(
    kv_tokens: int,
    state_slots: int,
    rows: int = 8,
    compat: str | None = None,
    strategy: str = "no_buffer",
    page: int = 1,
    max_context: int = 8192,
) -> tuple[CacheManager, FingerprintStatePool]:
    pool = FingerprintStatePool(state_slots)
    kv = TokenKVAllocator(kv_tokens) if page == 1 else PagedKVAllocator(kv_tokens, page)
    mgr = CacheManager(
        MambaRadixCache(page_size=page, chunk_size=max(16, page), compat=compat),
        kv,
        StateSlotAllocator(state_slots),
        pool,
        ReqToTokenTable(rows, max_context),
        strategy=strategy,
    )
    return mgr, pool


def make_scheduler(
    mgr: CacheManager, pool: FingerprintStatePool, chunk: int | None = 64, running: int = 8
) -> Scheduler:
    interval = max(16, mgr.page_size)
    cfg = SchedulerConfig(chunk_tokens=chunk, max_running=running, track_interval=interval)
    return Scheduler(mgr, FingerprintForward(mgr, pool), config=cfg)


def sequence(job: Job, i: int = 0) -> Sequence:
    return Sequence(
        array("q", job.prompt),
        len(job.answer),
        extra_key=job.extra_key,  # type: ignore[arg-type]
        script=array("q", job.answer),
        id=i,
    )


def check_everything(mgr: CacheManager, pool: FingerprintStatePool) -> None:
    mgr.tree.check_invariants()
    mgr.check_conservation()
    for path, node in state_nodes(mgr.tree.root, array("q")):
        assert node.state is not None
        assert pool.fingerprint(node.state) == fingerprint_of(path), f"tree state {node!r} is wrong"
    for req in mgr.active:
        assert req.slot is not None
        want = fingerprint_of(req.tokens[: req.computed])
        assert pool.fingerprint(req.slot) == want, "a running state is wrong"
        if req.track_slots and req.last_track_len is not None:
            kept = req.track_slots[req.keep_track_index()]
            want = fingerprint_of(req.tokens[: req.last_track_len])
            assert pool.fingerprint(kept) == want, "a tracked state is wrong"


def state_nodes(node: TreeNode, path: array[int]) -> Iterator[tuple[array[int], TreeNode]]:
    for child in node.children.values():
        p = path + child.key
        if child.state is not None:
            yield p, child
        yield from state_nodes(child, p)


def multi_turn_jobs(
    seed: int, sessions: int, turns: int, system_len: int = 40, vocab: int = 50
) -> list[Job]:
    """Sessions sharing a few system prompts; each turn's prompt is the whole
    history (previous prompt + answer + a new user message). Turns of
    different sessions interleave; some prompts are re-sent verbatim."""
    rng = random.Random(seed)
    systems = [[rng.randrange(vocab) for _ in range(system_len)] for _ in range(3)]
    histories = [list(rng.choice(systems)) for _ in range(sessions)]
    jobs = []
    for _ in range(turns):
        for s in rng.sample(range(sessions), sessions):
            prompt = histories[s] + [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
            answer = [rng.randrange(vocab) for _ in range(rng.randint(1, 12))]
            jobs.append(Job(prompt, answer, "tenant-b" if s % 5 == 4 else None))
            if rng.random() < 0.15:  # an identical re-send of the same prompt
                jobs.append(Job(list(prompt), list(answer), jobs[-1].extra_key))
            histories[s] = prompt + answer
    return jobs


def drive(
    sched: Scheduler,
    pool: FingerprintStatePool,
    jobs: list[Job],
    seed: int,
    abort_rate: float = 0.03,
    check: bool = True,
) -> list[Sequence]:
    """Submit the jobs a few at a time, step, abort at random (waiting,
    part-way through a prefill, or decoding), and check after every step."""
    rng = random.Random(seed)
    seqs, pending = [], list(jobs)
    while pending or sched.busy:
        for _ in range(rng.randint(0, 3) if sched.busy else 1):
            if pending:
                seq = sequence(pending.pop(0), len(seqs))
                seqs.append(seq)
                sched.submit(seq)
        if sched.step() == STALLED:
            sched.abort(sched.waiting[0])
        if rng.random() < abort_rate:
            live = sched.waiting + sched.prefilling + sched.running
            if live:
                sched.abort(rng.choice(live))
        if check:
            check_everything(sched.cache, pool)
    return seqs
