"""The lifecycle over real state tensors: every cached state equals the state
recomputed from scratch over its path, after copy-on-write, checkpoints,
donation and eviction.

The "model" is a toy recurrence on the pool's own tensors: each token shifts
the conv window and decays the SSM state, so any slot mix-up, missed copy or
missed clear changes the numbers.
"""

from __future__ import annotations

from array import array

import pytest
import torch

from mambaradix import MambaRadixCache
from mambaradix.core.node import TreeNode
from mambaradix.lifecycle import CacheManager
from mambaradix.pools import (
    PagedKVAllocator,
    ReqToTokenTable,
    StateGeometry,
    StateSlotAllocator,
    TokenKVAllocator,
)
from mambaradix.pools.torch_state import TorchStatePool
from mambaradix.scheduler import (
    DecodeStep,
    Extend,
    Scheduler,
    SchedulerConfig,
    ScriptedForward,
    Sequence,
)

GEOMETRY = StateGeometry.mamba2(
    num_layers=2, num_heads=2, head_dim=4, state_size=4, n_groups=1, conv_kernel=4
)


def feed(pool: TorchStatePool, slot: int, tokens: array[int]) -> None:
    for t in tokens:
        for conv in pool.conv:
            conv[:, slot] = torch.roll(conv[:, slot], -1, dims=-1)
            conv[:, slot, ..., -1] = float(t)
        pool.ssm[:, slot] = pool.ssm[:, slot] * 0.5 + float(t % 7)


def fresh_state(tokens: array[int]) -> list[torch.Tensor]:
    scratch = TorchStatePool(GEOMETRY, 1)
    feed(scratch, 0, tokens)
    return [t[:, 0].clone() for t in scratch.tensors()]


def assert_state(pool: TorchStatePool, slot: int, tokens: array[int]) -> None:
    for got, want in zip([t[:, slot] for t in pool.tensors()], fresh_state(tokens), strict=True):
        assert torch.equal(got, want), f"slot {slot} does not hold the state of its tokens"


def cached_states(node: TreeNode, path: array[int]):  # type: ignore[no-untyped-def]
    for child in node.children.values():
        p = path + child.key
        if child.state is not None:
            yield p, child.state
        yield from cached_states(child, p)


class ToyForward(ScriptedForward):
    """The toy recurrence as the scheduler's forward (tracked states included)."""

    def __init__(self, pool: TorchStatePool) -> None:
        self.pool = pool

    def prefill(self, batch: list[Extend]) -> list[int | None]:
        for e in batch:
            req = e.seq.req
            assert req.slot is not None
            cut = e.track_at if e.track_slot is not None else e.end
            assert cut is not None
            feed(self.pool, req.slot, req.tokens[e.start : cut])
            if e.track_slot is not None:
                self.pool.copy([req.slot], [e.track_slot])
                feed(self.pool, req.slot, req.tokens[cut : e.end])
        return super().prefill(batch)

    def decode(self, batch: list[DecodeStep]) -> list[int]:
        for d in batch:
            req = d.seq.req
            assert req.slot is not None
            feed(self.pool, req.slot, req.tokens[req.computed - 1 : req.computed])
            if d.track_slot is not None:
                self.pool.copy([req.slot], [d.track_slot])
        return super().decode(batch)


def serve(sched: Scheduler, prompt: list[int], answer: list[int]) -> int:
    seq = Sequence(array("q", prompt), len(answer), script=array("q", answer))
    sched.submit(seq)
    sched.run()
    return seq.cached_tokens


@pytest.mark.parametrize("strategy,page", [("no_buffer", 1), ("extra_buffer", 4)])
def test_cached_states_equal_recomputed_states(strategy: str, page: int) -> None:
    slots = 6 if strategy == "no_buffer" else 9
    pool = TorchStatePool(GEOMETRY, slots)
    kv = TokenKVAllocator(66) if page == 1 else PagedKVAllocator(72, page)
    mgr = CacheManager(
        MambaRadixCache(page_size=page, chunk_size=page * 2),
        kv,
        StateSlotAllocator(slots),
        pool,
        ReqToTokenTable(2, 256),
        strategy=strategy,
    )
    cfg = SchedulerConfig(chunk_tokens=8, max_running=2, track_interval=page * 2)
    sched = Scheduler(mgr, ToyForward(pool), config=cfg)
    history: list[int] = list(range(1, 20))
    hits = []
    for turn in range(6):
        prompt = history + [100 + turn, 200 + turn, 300 + turn]
        answer = [turn + 1, turn + 2, turn + 3, turn + 4]
        hits.append(serve(sched, prompt, answer))
        hits.append(serve(sched, prompt, answer))  # identical re-send
        serve(sched, list(range(1000 + 40 * turn, 1020 + 40 * turn)), [5, 6])  # unrelated
        history = prompt + answer
        for path, slot in cached_states(mgr.tree.root, array("q")):
            assert_state(pool, slot, path)
        mgr.tree.check_invariants()
        mgr.check_conservation()
    assert all(h > 0 for h in hits[1:])  # every request after the first reuses a state
    assert mgr.evictions["kv_tokens"] > 0 and mgr.evictions["states"] > 0, mgr.evictions
