"""The lifecycle over real state tensors: every cached state equals the state
recomputed from scratch over its path, after copy-on-write, checkpoints,
donation and eviction.

The "model" is a toy recurrence on the pool's own tensors: each token shifts
the conv window and decays the SSM state, so any slot mix-up, missed copy or
missed clear changes the numbers.
"""

from __future__ import annotations

from array import array

import torch

from mambaradix import MambaRadixCache
from mambaradix.core.node import TreeNode
from mambaradix.lifecycle import CacheManager, Request
from mambaradix.pools import ReqToTokenTable, StateGeometry, StateSlotAllocator, TokenKVAllocator
from mambaradix.pools.torch_state import TorchStatePool

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


def serve(mgr: CacheManager, pool: TorchStatePool, prompt: list[int], answer: list[int]) -> int:
    req = Request(array("q", prompt), output_ids=answer)
    assert mgr.admit(req)
    assert req.slot is not None
    assert_state(pool, req.slot, req.input_ids[: req.cached_len])  # COW copied the right state
    for stop in mgr.plan_prefill(req, chunk_size=8):
        start = req.computed
        assert mgr.extend(req, stop - start) is not None
        feed(pool, req.slot, req.tokens[start : req.computed])
        mgr.cache_unfinished(req)
    while req.computed < len(prompt) + len(answer) - 1:
        start = req.computed
        assert mgr.extend(req, 1) is not None
        feed(pool, req.slot, req.tokens[start : req.computed])
    mgr.finish(req)
    return req.cached_len


def test_cached_states_equal_recomputed_states() -> None:
    pool = TorchStatePool(GEOMETRY, 6)
    mgr = CacheManager(
        MambaRadixCache(),
        TokenKVAllocator(62),
        StateSlotAllocator(6),
        pool,
        ReqToTokenTable(2, 256),
    )
    history: list[int] = list(range(1, 20))
    hits = []
    for turn in range(6):
        prompt = history + [100 + turn, 200 + turn, 300 + turn]
        answer = [turn + 1, turn + 2, turn + 3, turn + 4]
        hits.append(serve(mgr, pool, prompt, answer))
        hits.append(serve(mgr, pool, prompt, answer))  # identical re-send
        history = prompt + answer
        for path, slot in cached_states(mgr.tree.root, array("q")):
            assert_state(pool, slot, path)
        mgr.tree.check_invariants()
        mgr.check_conservation()
    assert all(h > 0 for h in hits[1:])  # every request after the first reuses a state
    assert mgr.evictions["kv_tokens"] > 0 and mgr.evictions["states"] > 0, mgr.evictions
