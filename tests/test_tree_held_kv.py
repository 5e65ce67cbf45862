"""The tree's record of held KV indices (`HeldKV`) against a plain set.

* Hand-computed cases for run detection, run cutting and page edges (a run across
  pages, across the template's 65536 block, at 2**32, negative and huge indices).
* A Hypothesis state machine that drives `HeldKV` directly with claims and releases
  of consecutive, fragmented (a LIFO free list after random frees) and mixed index
  streams, with held or repeated indices injected, against a Python set.
* A Hypothesis state machine over random insert / evict / reset sequences on a
  `MambaRadixCache`, fed by the same kinds of streams, that checks every refusal
  and the held record against a set kept from the tree's own contents.
"""

from __future__ import annotations

import itertools
import os
import random
from array import array
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mambaradix import MambaRadixCache
from mambaradix.core.held import PAGE, HeldKV, is_run, segments

if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci":
    MACHINE_SETTINGS = settings(max_examples=50, stateful_step_count=30, deadline=None)
else:  # "deep" (see tests/conftest.py) decides the budget
    MACHINE_SETTINGS = settings(deadline=None)
# The full budget runs in the slow tier; the default tier runs a fifteenth of it.
QUICK_SETTINGS = settings(max_examples=5, stateful_step_count=20, deadline=None)

# Where runs start: page and template-block edges, the fast path's 2**32 limit,
# int64's end, negative indices.
POOL = 10**9  # the free list's indices (no base runs into them)
BASES = [0, PAGE - 3, 65536 - 5, 3 * 65536 + 7, 2**32 - 4, 2**40 + 1, 2**63 - 40, -50]


def q(xs: Any) -> array[int]:
    return array("q", xs)


# ------------------------------------------------------------ hand-computed


def test_is_run_hand_cases() -> None:
    assert is_run(q(range(5, 9)), 0, 4, 5)
    assert not is_run(q([5, 6, 8, 9]), 0, 4, 5)  # ends agree, the middle does not
    assert not is_run(q([5, 7, 6, 8]), 0, 4, 5)  # a permutation of the run
    assert is_run(q([1, 5, 6, 7]), 1, 3, 5)
    assert not is_run(q([1, 5, 6, 7]), 1, 3, 4)
    for a in (65536 - 2, 2**32 - 2, 2**48 - 2, 2**56 - 2):  # across byte carries
        assert is_run(q(range(a, a + 4)), 0, 4, a)
        assert not is_run(q([a, a + 1, a + 2 + 2**16, a + 3]), 0, 4, a)
    assert not is_run(q([-2, -1, 0, 1]), 0, 4, -2)  # negative starts are never runs
    assert is_run(q([2**63 - 2, 2**63 - 1]), 0, 2, 2**63 - 2)  # int64's last two
    assert not is_run(q([2**63 - 2, 2**63 - 1, -(2**63)]), 0, 3, 2**63 - 2)  # no wrap-around
    big = q(range(10, 10 + 3 * PAGE))
    assert is_run(big, 0, len(big), 10)
    big[2 * PAGE + 1] += 1
    assert not is_run(big, 0, len(big), 10)


def test_segments_cut_runs_and_loose_pieces() -> None:
    run1 = list(range(1000, 1100))  # 100 >= PROBE
    loose = [7, 3, 9]
    run2 = list(range(5000, 5070))  # 70
    values = q(run1 + loose + run2)
    assert list(segments(values, 0, len(values))) == [
        (0, 100, True),
        (100, 164, False),  # at most PROBE loose positions, even where a run starts inside
        (164, 173, False),
    ]
    values = q(run1 + run2)  # two runs back to back: the first one ends exactly
    assert list(segments(values, 0, len(values))) == [(0, 100, True), (100, 170, True)]


def test_claim_release_hand_cases() -> None:
    h = HeldKV()
    a = PAGE - 2  # a run across a page edge
    assert h.claim(q(range(a, a + 5)), 0, 0) is True
    assert h.indices() == set(range(a, a + 5))
    assert h.claim(q([a + 4, 99]), 0, 0) is None  # held
    assert h.claim(q([99, 98, 99]), 0, 0) is None  # repeated
    assert h.claim(q([1, a, 2]), 1, 1) is None  # held at a checked position
    assert h.indices() == set(range(a, a + 5))  # refusals change nothing
    assert h.claim(q([1, 2, 3]), 0, 2) is True  # checks 1..3, keeps only 3
    assert h.indices() == set(range(a, a + 5)) | {3}
    assert h.claim(q([a, 500, 400]), 1, 3) is False  # checks 500, 400, keeps nothing
    assert h.claim(q([-7, 2**62, 11]), 1, 1) is False  # loose; -7 is before `start`
    assert {2**62, 11} <= h.indices() and 2**62 in h and 12 not in h and -7 not in h
    for bad in ([2**61, -7], [-1], list(range(-3, 100)), [*range(1000, 1100), -2]):
        assert h.claim(q(bad), 0, 0) is None  # negative indices are refused
    assert h.indices() == set(range(a, a + 5)) | {3, 11, 2**62}
    b = 2 * PAGE  # a run at a page's first slot
    assert h.claim(q(range(b, b + 3)), 0, 0) is True
    assert h.claim(q(range(b, b + 9)), 0, 0) is None  # held at the run's first slot
    assert h.claim(q(range(b - 4, b + 1)), 0, 0) is None  # ... and at its last
    h.release(q(range(b, b + 3)), True)
    h.release(q(range(a, a + 2)), True)  # pieces of a run, as after a split
    h.release(q(range(a + 2, a + 5)), True)
    h.release(q([3]), True)
    h.release(q([11, 2**62]), False)
    assert h.indices() == set()
    h.check()


# ---------------------------------------------------------- HeldKV vs a set


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
SIZES = st.sampled_from([1, 2, 5, 63, 64, 65, 200, PAGE - 1, PAGE + 3])


class HeldMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.held = HeldKV()
        self.model: set[int] = set()
        self.kept: list[tuple[list[int], bool]] = []  # what claims kept, with run flags
        self.streams = Streams(0)

    @rule(
        data=st.data(),
        kind=KINDS,
        n=SIZES,
        base=st.sampled_from(BASES),
        inject=st.sampled_from(["none", "none", "held", "repeat"]),
    )
    def claim(self, data: st.DataObject, kind: str, n: int, base: int, inject: str) -> None:
        fresh = self.streams.draw(kind, n, base)
        prefix = data.draw(st.integers(0, 3), label="positions before start")
        values = [data.draw(st.integers(-5, 10**6)) for _ in range(prefix)] + fresh
        start = prefix
        if inject == "held" and self.kept:
            at = data.draw(st.integers(start, len(values) - 1), label="held at")
            some = self.kept[data.draw(st.integers(0, len(self.kept) - 1))][0]
            values[at] = some[data.draw(st.integers(0, len(some) - 1), label="held index")]
        elif inject == "repeat" and len(fresh) > 1:
            pair = st.lists(
                st.integers(start, len(values) - 1), min_size=2, max_size=2, unique=True
            )
            i, j = sorted(data.draw(pair, label="repeat"))
            values[j] = values[i]
        keep = data.draw(st.integers(start, len(values)), label="keep")
        checked = values[start:]
        refused = (
            bool(self.model.intersection(checked))
            or len(set(checked)) != len(checked)
            or any(x < 0 for x in checked)
        )
        result = self.held.claim(q(values), start, keep)
        assert (result is None) == refused
        if result is None:
            self.streams.give_back(fresh)
            return
        kept = values[keep:]
        if result:
            assert kept == list(range(kept[0], kept[0] + len(kept))) if kept else True
        self.model.update(kept)
        self.streams.give_back([x for x in values[start:keep] if x not in self.model])
        if kept:
            self.kept.append((kept, bool(result)))

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        """Release one kept array, in one or two pieces (as a split leaves it)."""
        if not self.kept:
            return
        kept, run = self.kept.pop(data.draw(st.integers(0, len(self.kept) - 1)))
        cut = data.draw(st.integers(0, len(kept)), label="cut")
        for part in (kept[:cut], kept[cut:]):
            if part:
                self.held.release(q(part), run)
        self.model.difference_update(kept)
        self.streams.give_back(kept)

    @rule()
    def reset(self) -> None:
        for kept, _ in self.kept:
            self.streams.give_back(kept)
        self.held, self.model, self.kept = HeldKV(), set(), []

    @invariant()
    def same_as_set(self) -> None:
        assert self.held.indices() == self.model
        probe = [*itertools.islice(self.model, 20), min(self.model, default=0) - 1, 10**12]
        for x in probe:
            assert (x in self.held) == (x in self.model)
        self.held.check()


TestHeldAgainstSet = pytest.mark.slow(HeldMachine.TestCase)
TestHeldAgainstSet.settings = MACHINE_SETTINGS
TestHeldAgainstSetQuick = type("HeldMachineQuick", (HeldMachine,), {}).TestCase
TestHeldAgainstSetQuick.settings = QUICK_SETTINGS


# ------------------------------------------------ the tree vs a set (insert/evict/reset)


class TreeHeldMachine(RuleBasedStateMachine):
    """Inserts fed by the index streams above; the expected refusal and the held
    record come from the tree's contents before the call (brute force)."""

    PAGE_SIZE = 1

    def __init__(self) -> None:
        super().__init__()
        self.cache = MambaRadixCache(page_size=self.PAGE_SIZE, chunk_size=4 * self.PAGE_SIZE)
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
        assert self.cache._held_kv.indices() == self.held_now()
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
