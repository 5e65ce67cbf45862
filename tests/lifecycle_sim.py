"""A tiny virtual serving loop over CacheManager, for lifecycle stress tests.

Requests arrive from a workload, are admitted when a row and a state slot can
be had, prefill in chunks (checkpointing at each stop), decode their
predetermined output tokens one at a time, and finish; some abort midway.
The "model" is a FingerprintStatePool: running a token folds it into the
request's slot fingerprint, so every slot carries a hash of exactly the tokens
it consumed, and any state mix-up shows up as a fingerprint mismatch.
"""

from __future__ import annotations

import random
from array import array
from collections import deque
from dataclasses import dataclass

from mambaradix import MambaRadixCache
from mambaradix.core.node import TreeNode
from mambaradix.lifecycle import CacheManager, Request
from mambaradix.pools import (
    FingerprintStatePool,
    ReqToTokenTable,
    StateSlotAllocator,
    TokenKVAllocator,
    fingerprint_of,
)
from mambaradix.sim import run_tokens as step


@dataclass
class Job:
    input_ids: list[int]
    output_ids: list[int]
    extra_key: object = None


def make_manager(
    kv_tokens: int,
    state_slots: int,
    rows: int = 8,
    compat: str | None = None,
    max_context: int = 4096,
) -> tuple[CacheManager, FingerprintStatePool]:
    pool = FingerprintStatePool(state_slots)
    mgr = CacheManager(
        MambaRadixCache(page_size=1, chunk_size=16, compat=compat),
        TokenKVAllocator(kv_tokens),
        StateSlotAllocator(state_slots),
        pool,
        ReqToTokenTable(rows, max_context),
    )
    return mgr, pool


def check_everything(mgr: CacheManager, pool: FingerprintStatePool) -> None:
    mgr.tree.check_invariants()
    mgr.check_conservation()
    for path, node in _state_nodes(mgr.tree.root, array("q")):
        assert node.state is not None
        assert pool.fingerprint(node.state) == fingerprint_of(path), f"tree state {node!r} is wrong"
    for req in mgr.active:
        assert req.slot is not None
        expected = fingerprint_of(req.tokens[: req.computed])
        assert pool.fingerprint(req.slot) == expected, "running state"


def _state_nodes(node: TreeNode, path: array[int]):  # type: ignore[no-untyped-def]
    for child in node.children.values():
        p = path + child.key
        if child.state is not None:
            yield p, child
        yield from _state_nodes(child, p)


class Simulator:
    """Interleaves many requests; every event is followed by a full check."""

    def __init__(
        self,
        mgr: CacheManager,
        pool: FingerprintStatePool,
        seed: int,
        chunk: int = 16,
        abort_rate: float = 0.03,
        check: bool = True,
    ) -> None:
        self.mgr, self.pool, self.chunk = mgr, pool, chunk
        self.rng = random.Random(seed)
        self.abort_rate = abort_rate
        self.check = check
        self.stats = {
            "admitted": 0,
            "finished": 0,
            "aborted": 0,
            "retracted": 0,
            "refused": 0,
            "prompt_tokens": 0,
            "cached_tokens": 0,
        }

    def run(self, jobs: list[Job], max_running: int = 4) -> dict[str, int]:
        waiting = deque(jobs)
        running: list[tuple[Request, list[int]]] = []
        while waiting or running:
            if waiting and len(running) < max_running and self.rng.random() < 0.5:
                self._try_admit(waiting, running)
            elif running:
                self._advance(running, waiting)
            elif waiting:
                self._try_admit(waiting, running)
            if self.check:
                check_everything(self.mgr, self.pool)
        return self.stats

    def _try_admit(self, waiting: deque[Job], running: list[tuple[Request, list[int]]]) -> None:
        job = waiting[0]
        req = Request(array("q", job.input_ids), job.extra_key)
        req.output_ids = list(job.output_ids)
        if not self.mgr.admit(req):
            self.stats["refused"] += 1
            if not running:
                raise AssertionError("an idle cache refused a request")
            return
        waiting.popleft()
        self.stats["admitted"] += 1
        self.stats["prompt_tokens"] += len(job.input_ids)
        self.stats["cached_tokens"] += req.cached_len
        running.append((req, self.mgr.plan_prefill(req, self.chunk)))

    def _advance(self, running: list[tuple[Request, list[int]]], waiting: deque[Job]) -> None:
        i = self.rng.randrange(len(running))
        req, stops = running[i]
        if self.rng.random() < self.abort_rate:
            self.mgr.abort(req)
            running.pop(i)
            self.stats["aborted"] += 1
            return
        end = len(req.input_ids) + len(req.output_ids) - 1
        n = stops[0] - req.computed if stops else 1
        if not stops and req.computed >= end:
            self.mgr.finish(req)
            running.pop(i)
            self.stats["finished"] += 1
            return
        if not step(self.mgr, self.pool, req, n):
            self.mgr.abort(req)  # retraction: give everything back, retry later
            running.pop(i)
            waiting.appendleft(Job(list(req.input_ids), req.output_ids, req.extra_key))
            self.stats["retracted"] += 1
            self.stats["prompt_tokens"] -= len(req.input_ids)
            self.stats["cached_tokens"] -= req.cached_len
            self.stats["admitted"] -= 1
            return
        if stops and req.computed == stops[0]:
            stops.pop(0)
            self.mgr.cache_unfinished(req)


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
            if rng.random() < 0.15:
                # an identical re-send of the same prompt
                jobs.append(Job(list(prompt), list(answer), jobs[-1].extra_key))
            histories[s] = prompt + answer
    return jobs
