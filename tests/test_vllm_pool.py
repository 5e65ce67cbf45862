"""vLLM's block pool as the `vllm` row keeps it (`mambaradix.policies.vllm_pool`), by hand:
what is free, held and cached, the order cached blocks are evicted in, pins, and the
allocators the lifecycle sees."""

from __future__ import annotations

import pytest

from mambaradix.policies.vllm_pool import BlockPool, PoolKV, PoolSlots


def pool_with(evicted: list[object], refuse: set[object] = frozenset()) -> BlockPool:  # type: ignore[assignment]
    pool = BlockPool(6)

    def evict(key: object) -> bool:
        if key in refuse:
            return False
        evicted.append(key)
        return True

    pool.evict = evict
    return pool


def test_released_blocks_are_free_cached_ones_wait_in_release_order() -> None:
    evicted: list[object] = []
    pool = pool_with(evicted)
    pool.reserve(5)
    pool.hold(["a", "b", "c", "d", "e"])
    assert (pool.free, pool.reclaimable()) == (1, 1)
    pool.cache("c")  # released with a hash: queued, oldest first
    pool.cache("a")
    pool.release("b")  # no hash: free at once
    assert (pool.free, list(pool.queue.values()), pool.reclaimable()) == (2, ["c", "a"], 4)
    assert pool.reserve(3)  # two free, then the head of the queue goes
    assert evicted == ["c"] and list(pool.queue.values()) == ["a"]
    pool.check()


def test_a_hit_takes_a_cached_block_and_references_count() -> None:
    evicted: list[object] = []
    pool = pool_with(evicted)
    pool.reserve(2)
    pool.hold(["a", "b"])
    pool.cache("a")
    pool.cache("b")
    pool.touch("a")  # hit: out of the queue
    pool.touch("a")  # a second request hits it too
    pool.cache("a")  # one lets go: still held
    assert list(pool.queue.values()) == ["b"] and pool.held == {"a": 1}
    pool.cache("a")  # the last: queued again, at the tail (LRU by release)
    assert list(pool.queue.values()) == ["b", "a"]
    pool.check()


def test_pinned_and_refused_blocks_are_skipped_in_place() -> None:
    evicted: list[object] = []
    pool = pool_with(evicted, refuse={"b"})
    pool.reserve(4)
    pool.hold(["a", "b", "c", "d"])
    for key in "abcd":
        pool.cache(key)
    pool.pin("a")
    assert pool.reserve(4)  # two free + two popped: a is pinned, b refused (locked)
    assert evicted == ["c", "d"]
    assert list(pool.queue.values()) == ["a", "b"]  # still at the head, in order
    assert not pool.reserve(5)  # only the skipped ones left
    pool.check()


def test_kv_pages_continue_and_are_reused_only_when_nobody_has_them() -> None:
    pool = BlockPool(3)
    kv = PoolKV(pool, block=4)
    assert kv.page_size == 4 and kv.available_size() == 12
    first = kv.alloc_extend(None, 6)  # a page and a half
    assert first is not None and list(first) == [0, 1, 2, 3, 4, 5]
    more = kv.alloc_extend(first[-1], 3)  # fills page 1, then a new page
    assert more is not None and list(more) == [6, 7, 8]
    assert pool.free == 0 and kv.alloc_extend(None, 1) is None  # nothing left, nothing changed
    kv.claim(0)  # the policy put page 0 in the request's block table
    pool.cache(("kv", 0))  # the request lets go of page 0 (hashed) ...
    kv.free(first[:4])  # ... and of its indices: page 0 stays cached, not reusable
    assert kv.owned_on(0) == 0 and pool.is_cached(("kv", 0))

    def evict(key: object) -> bool:  # the policy's mirror: the page is gone
        assert isinstance(key, tuple)
        kv.page_released(key[1])
        return True

    pool.evict = evict
    again = kv.alloc_extend(None, 1)  # pops page 0; now its id is reused
    assert again is not None and list(again) == [0]
    pool.check()


def test_a_state_slot_takes_a_block_per_group() -> None:
    pool = BlockPool(5)
    slots = PoolSlots(pool, groups=2)
    assert slots.available_size() == 2
    got = slots.alloc(2)
    assert got is not None and pool.free == 1 and slots.alloc(1) is None
    slot = got[0]
    for key in slots.keys(slot):  # kept: its blocks are cached
        pool.cache(key)
    slots.free([got[1]])  # a running state: its blocks are free at once
    assert pool.free == 3 and len(pool.queue) == 2
    slots.free([slot])  # the tree let it go, but its blocks wait in the queue
    assert slot not in slots._unused  # its id comes back only once the pool pops them
    pool.evict = lambda key: True
    assert pool.reserve(5)
    slots.slot_released(slot)
    assert slot in slots._unused
    with pytest.raises(ValueError, match="not owned"):
        slots.free([slot])


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_concurrent_runs_under_pressure_keep_pool_and_tree_in_step(seed: int) -> None:
    """Many requests in flight (retractions, refusals, hits on running requests' blocks)
    at a memory that evicts all the time: checked after every step, every block the tree
    holds is in the pool (or another copy of its hash is), the pool's counts add up, and
    nothing leaks once the trace is done."""
    from mambaradix.geometry.profile import get_profile
    from mambaradix.policies import VLLM, make_policy
    from mambaradix.replay.serving import ServingConfig, ServingModel
    from mambaradix.replay.workloads import multi_turn, shared_prefix

    trace = (shared_prefix(requests=60, seed=seed), multi_turn(sessions=10, seed=seed))[seed]
    prof = get_profile("nemotron-h-tiny")
    cfg = ServingConfig(memory_gb=1.5e-3, chunk_tokens=96, rate=50.0)  # 121 blocks of 48
    model = ServingModel(trace, prof, make_policy("vllm"), cfg)
    pol = model.policy
    assert isinstance(pol, VLLM) and pol.pool is not None and pol.slots is not None
    times, i, steps = model.arrival_times(), 0, 0
    while i < len(trace) or model.scheduler.busy:
        if i < len(trace) and model.wakes_for(times[i]):
            model.clock.wait_for(times[i])
        while i < len(trace) and times[i] <= model.clock.now:
            model.submit(i, times[i])
            i += 1
        if model.scheduler.busy:
            model.step()
            steps += 1
            if steps % 16 == 0:  # O(pool): every 16th step
                pol.pool.check()
            for slot in model.cache.tree.all_states():
                node = pol.blocks.index.slot_node[slot]
                keys = pol.slots.keys(slot)
                assert node in pol.blocks.dead or all(pol.pool.holds(k) for k in keys)
    model.settle()
    assert pol.pool.popped > 0 and len(model.outcomes) > len(trace) // 2
    assert not pol.pool.held and not pol.blocks.runs and not pol.pool.pinned
    model.cache.tree.check_invariants()
    model.cache.check_conservation()


def test_bad_retention_is_refused_before_any_work() -> None:
    from mambaradix.geometry.profile import get_profile
    from mambaradix.policies import VLLM, is_known
    from mambaradix.replay.run import replay
    from mambaradix.replay.serving import ServingConfig
    from mambaradix.replay.workloads import multi_turn

    with pytest.raises(ValueError, match="^retention must be >= 0, got -1$"):
        VLLM(retention=-1)
    with pytest.raises(ValueError, match="^retention must be a number of tokens or 'dense'"):
        VLLM(retention="often")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^checkpoint_alignment must be None, -1 or >= 1"):
        VLLM(checkpoint_alignment=0)
    assert is_known("vllm@dense") and is_known("vllm@2080") and not is_known("vllm@-5")
    trace, prof = multi_turn(sessions=2, seed=0), get_profile("nemotron-h-8b")
    with pytest.raises(ValueError, match="multiple of vLLM's block \\(1040 tokens"):
        replay(trace, prof, "vllm@1000", ServingConfig(1.0))
