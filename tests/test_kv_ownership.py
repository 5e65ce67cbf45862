"""Who holds each KV index: the pool's one byte per slot (`pools/ownership.py`) and a
tree alone's opt-in record (`core/ownership.py`), against brute force.

* Hand-computed cases for the pool's map through both KV allocators: claims of runs and
  of scattered indices, short and long (the map's two code paths), each refusal, release,
  and `free` refusing what the tree holds.
* A Hypothesis state machine over a tree attached to a KV pool: requests allocate from the
  pool, insert (with tree-held, free, repeated or out-of-range indices injected), the tree
  evicts and resets; every refusal and the map are checked against sets kept by the test.
* A Hypothesis state machine over a tree alone with `check_kv=True`, fed by consecutive,
  fragmented and mixed index streams at page edges and huge or negative indices.
"""

from __future__ import annotations

import os
import random
from array import array
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mambaradix import MambaRadixCache
from mambaradix.pools import PagedKVAllocator, TokenKVAllocator
from mambaradix.pools.ownership import is_run

if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci":
    MACHINE_SETTINGS = settings(max_examples=50, stateful_step_count=30, deadline=None)
else:  # "deep" (see tests/conftest.py) decides the budget
    MACHINE_SETTINGS = settings(deadline=None)
# The full budget runs in the slow tier; the default tier runs a fifteenth of it.
QUICK_SETTINGS = settings(max_examples=5, stateful_step_count=20, deadline=None)

PAGE = 1 << 14  # stream sizes around a 16 Ki edge (the old record's page)
POOL = 10**9  # the free list's indices (no base runs into them)
BASES = [0, PAGE - 3, 65536 - 5, 3 * 65536 + 7, 2**32 - 4, 2**40 + 1, 2**63 - 40, -50]


def q(xs: Any) -> array[int]:
    return array("q", xs)


# ------------------------------------------------------------ hand-computed


@pytest.mark.parametrize("page", [1, 4])
def test_pool_map_hand_cases(page: int) -> None:
    """Both claim paths (short: < 64 indices, long: numpy), runs and scattered."""
    kv = TokenKVAllocator(512) if page == 1 else PagedKVAllocator(512, page)
    got = kv.alloc(200)
    assert got is not None and list(got) == list(range(200))
    assert kv.claim(q(range(0, 8)), 0, 0)  # short run
    assert kv.tree_indices() == set(range(8))
    assert kv.claim(q(range(8, 108)), 0, 0)  # long run
    scattered = [150, 120, 199, 111, 140]
    assert kv.claim(q([5, 6, *scattered]), 2, 2)  # 5, 6 are cached: before `start`
    long_scattered = list(range(198, 120, -1))  # 78 indices, descending: not a run
    assert not kv.claim(q(long_scattered), 0, 0)  # 199, 150, 140 are the tree's now
    held = set(range(108)) | set(scattered)
    assert kv.tree_indices() == held
    assert kv.held_by_tree(199) and not kv.held_by_tree(198) and not kv.held_by_tree(-1)
    assert not kv.is_free(5)
    long_bad = ([*range(112, 180), 112], [*range(112, 180), -1], [*range(112, 180), 600])
    for bad in ([108, 109, 3], [112, 112], [-1], [300], [600], *long_bad):
        before = kv.tree_indices()
        assert not kv.claim(q(bad), 0, 0), bad
        assert kv.tree_indices() == before
    assert kv.refusal(300) is not None and "free" in str(kv.refusal(300))  # never allocated
    assert kv.refusal(600) == "is outside the KV pool [0, 512)"
    assert kv.refusal(112) is None
    with pytest.raises(ValueError, match="held by the radix tree"):
        kv.free(q([0]))
    kv.release(q(range(0, 8)))
    kv.release(q(range(8, 108)))
    kv.release(q(scattered))
    assert kv.tree_indices() == set()
    kv.free(got)
    assert kv.available_size() == 512
    kv.check_invariants()


def test_pool_keep_takes_only_the_kept_part() -> None:
    kv = TokenKVAllocator(300)
    got = kv.alloc(300)
    assert got is not None
    assert kv.claim(got, 10, 250)  # checks 10.., takes 250..
    assert kv.tree_indices() == set(range(250, 300))
    assert kv.claim(q([3, 1, 2, 7]), 1, 2)
    assert kv.tree_indices() == set(range(250, 300)) | {2, 7}


def test_tree_on_a_pool_refuses_free_indices() -> None:
    kv = TokenKVAllocator(64)
    cache = MambaRadixCache()
    cache.attach_kv_owner(kv)
    mine = kv.alloc(3)
    assert mine is not None
    with pytest.raises(ValueError, match=r"^kv_indices\[2\] = 40 is free in the KV pool"):
        cache.insert([1, 2, 3], [mine[0], mine[1], 40], 0)
    with pytest.raises(ValueError, match=r"^kv_indices\[1\] = 99 is outside the KV pool"):
        cache.insert([1, 2, 3], [mine[0], 99, mine[2]], 0)
    assert cache.node_count() == 0 and kv.tree_indices() == set()
    cache.insert([1, 2, 3], mine, 0)
    assert kv.tree_indices() == {0, 1, 2}
    with pytest.raises(ValueError, match="needs an empty tree"):
        cache.attach_kv_owner(TokenKVAllocator(64))
    kv.free(cache.reset().freed_kv)  # reset hands everything back
    assert kv.available_size() == 64


def test_is_run_hand_cases() -> None:
    """Runs across the template's 65536 blocks and byte carries, against range()."""
    for lo in (0, 5, 65536 - 3, 3 * 65536 + 7, 2**24 - 2, 2**32 - 4, 2**48 - 2, 2**62):
        for n in (1, 2, 7, 70000):
            run = list(range(lo, lo + n))
            assert is_run(q(run), lo)
            assert not is_run(q(run), lo + 1)
            if n > 1:
                for at in (0, n // 2, n - 1):
                    bad = run.copy()
                    bad[at] += 2**40 if at % 2 else -1
                    assert not is_run(q(bad), lo), (lo, n, at)
    assert is_run(q([]), 3)


def test_pool_long_claims_of_near_runs() -> None:
    """Long claims that look like runs (right ends) but are not: the general path."""
    kv = TokenKVAllocator(70_000)
    got = kv.alloc(70_000)
    assert got is not None
    swapped = list(range(100, 200))
    swapped[10], swapped[11] = swapped[11], swapped[10]  # same set, not a run
    assert kv.claim(q(swapped), 0, 0) and kv.tree_indices() == set(range(100, 200))
    repeated = list(range(300, 400))
    repeated[50] = 301  # right ends, a repeat inside
    assert not kv.claim(q(repeated), 0, 0)
    assert kv.claim(q(range(65_000, 67_000)), 0, 1_000)  # across a 65536 block
    assert kv.tree_indices() == set(range(100, 200)) | set(range(66_000, 67_000))
    assert not kv.claim(q(range(66_500, 66_600)), 0, 0)  # held by the tree
    kv.release(q(swapped))
    assert kv.tree_indices() == set(range(66_000, 67_000))


# ------------------------------------------------- a tree on a pool vs sets


class PoolTreeMachine(RuleBasedStateMachine):
    """Requests allocate from the pool and insert; the expected outcome of every call
    comes from sets the machine keeps (which indices are whose)."""

    PAGE_SIZE = 1
    CAPACITY = 1024

    def __init__(self) -> None:
        super().__init__()
        p = self.PAGE_SIZE
        self.kv = TokenKVAllocator(self.CAPACITY) if p == 1 else PagedKVAllocator(self.CAPACITY, p)
        self.cache = MambaRadixCache(page_size=p, chunk_size=4 * p)
        self.cache.attach_kv_owner(self.kv)
        self.next_state = 0
        self.keys: list[list[int]] = [[]]

    def tree_now(self) -> set[int]:
        return set(self.cache.all_kv_indices())

    @rule(
        data=st.data(),
        inject=st.sampled_from(["none", "none", "none", "held", "repeat", "free", "outside"]),
        pages=st.sampled_from([1, 2, 5, 20, 70]),
    )
    def insert(self, data: st.DataObject, inject: str, pages: int) -> None:
        p = self.PAGE_SIZE
        old = data.draw(st.sampled_from(self.keys), label="base key")
        cut = data.draw(st.integers(0, len(old) // p), label="cut pages") * p
        key = old[:cut] + [data.draw(st.integers(0, 3)) for _ in range(pages * p)]
        if self.kv.available_size() < len(key):  # before the match, which it changes
            self.kv.free(self.cache.evict(kv_tokens=len(key)).freed_kv)
        match = self.cache.match_prefix(key)
        prev, off = match.prefix_len, match.kv_hit_len
        fresh = self.kv.alloc(len(key) - prev)
        if fresh is None:
            return
        values = list(match.kv_indices) + list(fresh)
        start, tree = min(prev, off), self.tree_now()
        at = data.draw(st.integers(start, len(key) - 1), label="at") if start < len(key) else -1
        if at >= 0 and inject == "held" and tree:
            values[at] = sorted(tree)[data.draw(st.integers(0, len(tree) - 1))]
        elif at >= 0 and inject == "repeat" and at > start:
            values[at] = values[data.draw(st.integers(start, at - 1))]
        elif at >= 0 and inject == "free":
            free = [i for i in range(self.CAPACITY) if self.kv.is_free(i)]
            if free:
                values[at] = free[data.draw(st.integers(0, len(free) - 1))]
        elif at >= 0 and inject == "outside":
            values[at] = self.CAPACITY + data.draw(st.integers(0, 5))
        checked = values[start:]
        ok = all(0 <= x < self.CAPACITY and not self.kv.is_free(x) for x in checked)
        refused = not ok or bool(tree & set(checked)) or len(set(checked)) != len(checked)
        self.next_state += 1
        before = self.cache.pretty(), self.kv.tree_indices()
        if refused:
            with pytest.raises(ValueError, match=r"^kv_indices\[\d+\] = -?\d+ "):
                self.cache.insert(key, values, self.next_state, prev)
            assert (self.cache.pretty(), self.kv.tree_indices()) == before
            self.kv.free(fresh)
            return
        r = self.cache.insert(key, values, self.next_state, prev)
        assert r.prefix_len == off
        assert self.tree_now() == tree | set(values[off:])
        self.kv.free(r.freed_kv)
        self.keys.append(key)

    @rule(tokens=st.sampled_from([1, 5, 64, 400]))
    def evict(self, tokens: int) -> None:
        tree = self.tree_now()
        r = self.cache.evict(kv_tokens=tokens)
        assert self.tree_now() == tree - set(r.freed_kv)
        if r.freed_kv:
            self.kv.free(r.freed_kv)

    @rule(go=st.integers(0, 5))
    def reset(self, go: int) -> None:
        if not go:
            self.kv.free(self.cache.reset().freed_kv)
            self.keys = [[]]

    @invariant()
    def map_is_exact(self) -> None:
        tree = self.tree_now()
        assert self.kv.tree_indices() == tree
        free = {i for i in range(self.CAPACITY) if self.kv.is_free(i)}
        assert not free & tree and len(free) + len(tree) == self.CAPACITY  # nothing leaks
        self.cache.check_invariants()
        self.kv.check_invariants()


TestPoolTree = pytest.mark.slow(PoolTreeMachine.TestCase)
TestPoolTree.settings = MACHINE_SETTINGS
TestPoolTreeQuick = type("PoolTreeMachineQuick", (PoolTreeMachine,), {}).TestCase
TestPoolTreeQuick.settings = QUICK_SETTINGS


class PoolTreeMachinePaged(PoolTreeMachine):
    PAGE_SIZE = 4


TestPoolTreePaged = pytest.mark.slow(PoolTreeMachinePaged.TestCase)
TestPoolTreePaged.settings = MACHINE_SETTINGS
TestPoolTreePagedQuick = type("PoolTreeMachinePagedQuick", (PoolTreeMachinePaged,), {}).TestCase
TestPoolTreePagedQuick.settings = QUICK_SETTINGS


# ------------------------------------------------ a tree alone (check_kv=True) vs a set


class Streams:
    """Index streams: a bump allocator per base (consecutive), and a LIFO free list
    shuffled at the start (indices freed in random order: fragmented)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.bump = {b: b for b in BASES}
        pool = list(range(POOL, POOL + 4 * PAGE))
        self.rng.shuffle(pool)
        self.free = pool

    def draw(self, kind: str, n: int, base: int) -> list[int]:
        if n == 0:
            return []
        if kind == "run":
            start = self.bump[base]
            if start + n > 2**63 - 1:  # int64's end: start over below it
                start = 2**63 - 1 - n
            self.bump[base] = start + n
            return list(range(start, start + n))
        if kind == "lifo":
            if len(self.free) < n:
                return self.draw("run", n, base)
            out = self.free[-n:]
            del self.free[-n:]
            return out
        half = n // 2  # "mixed": a run, then free-list indices
        return self.draw("run", half, base) + self.draw("lifo", n - half, base)

    def give_back(self, xs: list[int]) -> None:
        self.free.extend(x for x in xs if POOL <= x < POOL + 4 * PAGE)





KINDS = st.sampled_from(["run", "run", "lifo", "mixed"])


class TreeHeldMachine(RuleBasedStateMachine):
    """Inserts fed by the index streams above; the expected refusal and the held
    record come from the tree's contents before the call (brute force)."""

    PAGE_SIZE = 1

    def __init__(self) -> None:
        super().__init__()
        self.cache = MambaRadixCache(
            page_size=self.PAGE_SIZE, chunk_size=4 * self.PAGE_SIZE, check_kv=True
        )
        self.streams = Streams(1)
        self.next_state = 0
        self.keys: list[list[int]] = [[]]

    def held_now(self) -> set[int]:
        held = self.cache.all_kv_indices()
        out = set(held)
        assert len(out) == len(held)  # no index held twice
        return out

    @rule(
        data=st.data(),
        kind=KINDS,
        base=st.sampled_from(BASES),
        inject=st.sampled_from(["none", "none", "none", "held", "repeat"]),
    )
    def insert(self, data: st.DataObject, kind: str, base: int, inject: str) -> None:
        page = self.PAGE_SIZE
        old = data.draw(st.sampled_from(self.keys), label="base key")
        cut = data.draw(st.integers(0, len(old) // page), label="cut pages") * page
        ext = data.draw(st.sampled_from([1, 2, 5, 70, 300]), label="new pages") * page
        key = old[:cut] + [data.draw(st.integers(0, 3)) for _ in range(ext)]
        match = self.cache.match_prefix(key)
        prev, off = match.prefix_len, match.kv_hit_len  # default mode: the insert's walk
        fresh = self.streams.draw(kind, len(key) - prev, base)
        values = list(match.kv_indices) + fresh
        start = min(prev, off)
        held = self.held_now()
        if inject == "held" and held and start < len(key):
            at = data.draw(st.integers(start, len(key) - 1), label="held at")
            some = self.cache.all_kv_indices()
            values[at] = some[data.draw(st.integers(0, len(some) - 1), label="held index")]
        elif inject == "repeat" and len(key) - start > 1:
            pair = st.lists(st.integers(start, len(key) - 1), min_size=2, max_size=2, unique=True)
            i, j = sorted(data.draw(pair, label="repeat"))
            values[j] = values[i]
        checked = values[start:]
        refused = (
            bool(held.intersection(checked))
            or len(set(checked)) != len(checked)
            or any(x < 0 for x in checked)
        )
        self.next_state += 1
        before = self.cache.pretty()
        if refused:
            with pytest.raises(ValueError, match=r"^kv_indices\[\d+\] = -?\d+ "):
                self.cache.insert(key, values, self.next_state, prev)
            assert self.cache.pretty() == before and self.held_now() == held
            self.streams.give_back(fresh)
            return
        r = self.cache.insert(key, values, self.next_state, prev)
        assert r.prefix_len == off
        assert self.held_now() == held | set(values[off:])
        self.streams.give_back(list(r.freed_kv))
        self.keys.append(key)

    @rule(tokens=st.sampled_from([1, 5, 64, 400]))
    def evict(self, tokens: int) -> None:
        held = self.held_now()
        r = self.cache.evict(kv_tokens=tokens)
        assert self.held_now() == held - set(r.freed_kv)
        self.streams.give_back(list(r.freed_kv))

    @rule(go=st.integers(0, 5))
    def reset(self, go: int) -> None:
        if go:
            return
        r = self.cache.reset()
        self.streams.give_back(list(r.freed_kv))
        self.keys = [[]]

    @invariant()
    def record_is_exact(self) -> None:
        owner = self.cache.kv_owner
        assert owner is not None and owner.tree_indices() == self.held_now()
        self.cache.check_invariants()


TestTreeHeldAgainstSet = pytest.mark.slow(TreeHeldMachine.TestCase)
TestTreeHeldAgainstSet.settings = MACHINE_SETTINGS
TestTreeHeldAgainstSetQuick = type("TreeHeldMachineQuick", (TreeHeldMachine,), {}).TestCase
TestTreeHeldAgainstSetQuick.settings = QUICK_SETTINGS


class TreeHeldMachinePaged(TreeHeldMachine):
    PAGE_SIZE = 4


TestTreeHeldAgainstSetPaged = pytest.mark.slow(TreeHeldMachinePaged.TestCase)
TestTreeHeldAgainstSetPaged.settings = MACHINE_SETTINGS
TestTreeHeldAgainstSetPagedQuick = type(
    "TreeHeldMachinePagedQuick", (TreeHeldMachinePaged,), {}
).TestCase
TestTreeHeldAgainstSetPagedQuick.settings = QUICK_SETTINGS
