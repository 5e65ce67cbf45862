"""Tests for `mambaradix.pools`: allocators, state pools, the request table
and state geometry."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
from array import array

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
)

from mambaradix.pools import (
    EMPTY_FINGERPRINT,
    FingerprintStatePool,
    PagedKVAllocator,
    ReqToTokenTable,
    StateGeometry,
    StateSlotAllocator,
    TokenKVAllocator,
    advance_fingerprint,
    fingerprint_of,
)
from mambaradix.pools.torch_state import TorchStatePool

Allocator = TokenKVAllocator | StateSlotAllocator | PagedKVAllocator

# ---------------------------------------------------------------- helpers


def free_map(a: Allocator) -> list[bool]:
    return [a.is_free(i) for i in range(a.capacity)]


def assert_unchanged(before: Allocator, after: Allocator) -> None:
    """Same free set, and the same order of future allocations."""
    assert free_map(after) == free_map(before)
    assert after.available_size() == before.available_size()
    after.check_invariants()
    b, a = copy.deepcopy(before), copy.deepcopy(after)
    n = b.available_size()
    assert list(a.alloc(n) or []) == list(b.alloc(n) or [])


def expect_error(a: Allocator, exc: type[Exception], match: str, fn: object, *args: object) -> None:
    """Call fn(*args), expect `exc`, and check `a` did not change."""
    before = copy.deepcopy(a)
    with pytest.raises(exc, match=match):
        fn(*args)  # type: ignore[operator]
    assert_unchanged(before, a)


# ---------------------------------------------------------------- TokenKVAllocator


class TestTokenKVAllocator:
    def test_fresh_alloc_is_ascending_and_returns_array(self) -> None:
        a = TokenKVAllocator(8)
        got = a.alloc(3)
        assert isinstance(got, array) and got.typecode == "q"
        assert list(got) == [0, 1, 2]
        assert list(a.alloc(2) or []) == [3, 4]
        assert a.available_size() == 3 and a.capacity == 8

    def test_lifo_reuse_in_freed_order(self) -> None:
        a = TokenKVAllocator(8)
        a.alloc(5)
        a.free([4, 1, 3])
        assert list(a.alloc(3) or []) == [4, 1, 3]
        assert list(a.alloc(2) or []) == [5, 6]

    def test_alloc_zero_gives_empty_array_and_changes_nothing(self) -> None:
        a = TokenKVAllocator(4)
        got = a.alloc(0)
        assert got is not None and len(got) == 0 and got.typecode == "q"
        assert a.available_size() == 4

    def test_round_trip_conserves_capacity(self) -> None:
        a = TokenKVAllocator(10)
        held = [a.alloc(3), a.alloc(4), a.alloc(3)]
        assert a.available_size() == 0
        assert sorted(i for h in held for i in h or []) == list(range(10))
        for h in held:
            assert h is not None
            a.free(h)
        assert a.available_size() == 10
        assert all(free_map(a))
        a.check_invariants()

    def test_exhaustion_returns_none_and_changes_nothing(self) -> None:
        a = TokenKVAllocator(5)
        a.alloc(3)
        before = copy.deepcopy(a)
        assert a.alloc(3) is None
        assert_unchanged(before, a)
        assert list(a.alloc(2) or []) == [3, 4]
        assert a.alloc(1) is None

    def test_free_does_not_mutate_callers_array(self) -> None:
        a = TokenKVAllocator(4)
        got = a.alloc(3)
        assert got is not None
        a.free(got)
        assert list(got) == [0, 1, 2]

    @pytest.mark.parametrize(
        "bad, match",
        [
            ([1, 1], "more than once"),
            ([5], "already free"),
            ([0, 5], "already free"),
            ([2, 8], "out of range"),
            ([-1], "out of range"),
        ],
    )
    def test_bad_free_raises_and_frees_nothing(self, bad: list[int], match: str) -> None:
        a = TokenKVAllocator(8)
        a.alloc(4)  # 0..3 held, 4..7 free
        expect_error(a, ValueError, match, a.free, bad)
        assert a.available_size() == 4

    @pytest.mark.parametrize(
        "bad, match",
        [
            ([*range(100), 100], "already free"),
            ([*range(100), 5], "index 5 appears more than once"),
            ([*range(100), 300], "out of range"),
            ([-1, *range(100)], "out of range"),
        ],
    )
    def test_bad_long_free_raises_and_frees_nothing(self, bad: list[int], match: str) -> None:
        """Batches of >= 64 ids take the numpy path; same checks, same result."""
        a = TokenKVAllocator(200)
        a.alloc(100)  # 0..99 held, 100..199 free
        expect_error(a, ValueError, match, a.free, bad)
        assert a.available_size() == 100

    def test_long_batches_keep_lifo_order(self) -> None:
        a = TokenKVAllocator(300)
        first = a.alloc(200)
        assert list(first or []) == list(range(200))
        batch = [*range(150, 50, -1)]
        a.free(batch)
        assert list(a.alloc(100) or []) == batch
        assert list(a.alloc(3) or []) == [200, 201, 202]
        a.check_invariants()

    def test_double_free_across_calls(self) -> None:
        a = TokenKVAllocator(4)
        got = a.alloc(2)
        assert got is not None
        a.free(got)
        expect_error(a, ValueError, "already free", a.free, got)

    @pytest.mark.parametrize("bad", ["ab", b"\x00" * 8, [1.0], 3, [2**70]])
    def test_free_rejects_non_int_sequences(self, bad: object) -> None:
        a = TokenKVAllocator(4)
        a.alloc(4)
        with pytest.raises((TypeError, ValueError)):
            a.free(bad)  # type: ignore[arg-type]
        assert a.available_size() == 0

    def test_free_accepts_int_sequences_of_all_kinds(self) -> None:
        a = TokenKVAllocator(12)
        a.alloc(12)
        a.free(array("q", [0, 1]))
        a.free((2, 3))
        a.free(range(4, 6))
        a.free(np.array([6, 7], dtype=np.int32))
        a.free(torch.tensor([8, 9]))
        a.free([np.int64(10), 11])  # type: ignore[list-item]
        assert a.available_size() == 12

    @pytest.mark.parametrize("bad, exc", [(-1, ValueError), (1.0, TypeError), (True, TypeError)])
    def test_alloc_rejects_bad_counts(self, bad: object, exc: type[Exception]) -> None:
        a = TokenKVAllocator(4)
        expect_error(a, exc, "n must", a.alloc, bad)

    @pytest.mark.parametrize("bad, exc", [(0, ValueError), (-3, ValueError), ("4", TypeError)])
    def test_size_validation(self, bad: object, exc: type[Exception]) -> None:
        with pytest.raises(exc, match="size"):
            TokenKVAllocator(bad)  # type: ignore[arg-type]

    def test_is_free_range_checked(self) -> None:
        a = TokenKVAllocator(4)
        with pytest.raises(ValueError, match="out of range"):
            a.is_free(4)


# ---------------------------------------------------------------- PagedKVAllocator


class TestPagedKVAllocator:
    def test_alloc_gives_whole_pages(self) -> None:
        a = PagedKVAllocator(16, 4)
        got = a.alloc(8)
        assert list(got or []) == [0, 1, 2, 3, 4, 5, 6, 7]
        assert a.available_size() == 8 and a.capacity == 16 and a.num_pages == 4
        a.free([0])  # any index of page 0 frees page 0
        assert list(a.alloc(4) or []) == [0, 1, 2, 3]

    def test_alloc_must_be_page_aligned(self) -> None:
        a = PagedKVAllocator(16, 4)
        expect_error(a, ValueError, "multiple of page_size", a.alloc, 6)

    def test_alloc_exhaustion(self) -> None:
        a = PagedKVAllocator(8, 4)
        a.alloc(4)
        before = copy.deepcopy(a)
        assert a.alloc(8) is None
        assert_unchanged(before, a)

    def test_alloc_extend_fills_partial_page_first(self) -> None:
        a = PagedKVAllocator(16, 4)
        first = a.alloc_extend(None, 3)
        assert list(first or []) == [0, 1, 2]
        assert a.available_size() == 12
        # one slot left on page 0, then a new page (page 1)
        assert list(a.alloc_extend(2, 3) or []) == [3, 4, 5]
        assert a.available_size() == 8
        # fits in page 1's tail: no new page taken
        assert list(a.alloc_extend(5, 2) or []) == [6, 7]
        assert a.available_size() == 8
        # page 1 full: next token opens page 2
        assert list(a.alloc_extend(7, 1) or []) == [8]
        assert a.available_size() == 4

    def test_alloc_extend_after_lifo_reuse_follows_the_page(self) -> None:
        a = PagedKVAllocator(16, 4)
        a.alloc(8)
        a.free([4])  # page 1 back on top of the stack
        got = a.alloc_extend(1, 5)  # request ends at index 1 on page 0
        assert list(got or []) == [2, 3, 4, 5, 6]

    def test_alloc_extend_short_returns_none_and_changes_nothing(self) -> None:
        a = PagedKVAllocator(8, 4)
        a.alloc_extend(None, 2)  # page 0: indices 0, 1
        a.alloc(4)  # page 1: everything gone
        before = copy.deepcopy(a)
        assert a.alloc_extend(1, 3) is None  # tail has 2, needs a page
        assert_unchanged(before, a)
        assert list(a.alloc_extend(1, 2) or []) == [2, 3]  # tail alone is fine

    def test_alloc_extend_zero_and_validation(self) -> None:
        a = PagedKVAllocator(8, 4)
        empty = a.alloc_extend(None, 0)
        assert empty is not None and len(empty) == 0 and a.available_size() == 8
        expect_error(a, ValueError, "which is free", a.alloc_extend, 0, 1)
        expect_error(a, ValueError, "out of range", a.alloc_extend, 8, 1)
        expect_error(a, ValueError, "n must", a.alloc_extend, None, -1)

    def test_free_errors(self) -> None:
        a = PagedKVAllocator(16, 4)
        a.alloc(4)
        expect_error(a, ValueError, "page 1 is already free", a.free, [0, 4])
        expect_error(a, ValueError, "out of range", a.free, [16])
        expect_error(a, ValueError, "out of range", a.free, [-1])
        a.free([0, 1, 2, 1])  # several indices of one page: one page freed
        assert a.available_size() == 16
        expect_error(a, ValueError, "already free", a.free, [3])

    @pytest.mark.parametrize("n_pages", [2, 40])  # short and long (numpy) paths
    def test_free_returns_pages_in_first_seen_order(self, n_pages: int) -> None:
        a = PagedKVAllocator(4 * n_pages, 4)
        a.alloc(4 * n_pages)
        order = list(range(n_pages))[::-1]
        # every index of each page, pages in `order`, some indices repeated
        idx = [p * 4 + k for p in order for k in (0, 1, 2, 3, 1)]
        a.free(idx)
        assert a.available_size() == a.capacity
        got = a.alloc(4 * n_pages)
        assert got is not None and list(got[::4]) == [p * 4 for p in order]
        a.check_invariants()

    def test_long_alloc_pages_are_consecutive(self) -> None:
        a = PagedKVAllocator(800, 8)
        got = a.alloc(400)
        assert list(got or []) == list(range(400))
        a.free(range(8, 400))  # pages 1..49
        again = a.alloc_extend(3, 200)  # tail of page 0, then pages 1, 2, ...
        assert list(again or []) == list(range(4, 204))

    @pytest.mark.parametrize("size, ps", [(10, 4), (0, 4), (8, 0)])
    def test_geometry_validation(self, size: int, ps: int) -> None:
        with pytest.raises(ValueError):
            PagedKVAllocator(size, ps)

    def test_page_size_one_matches_token_allocator(self) -> None:
        p, t = PagedKVAllocator(6, 1), TokenKVAllocator(6)
        for alloc in (p, t):
            alloc.alloc(4)
            alloc.free([2, 0])
        assert list(p.alloc(3) or []) == list(t.alloc(3) or []) == [2, 0, 4]

    @settings(max_examples=60, deadline=None)
    @given(
        ps=st.integers(1, 5),
        chunks=st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=6), max_size=4),
    )
    def test_growing_requests_keep_page_layout(self, ps: int, chunks: list[list[int]]) -> None:
        """Requests grown chunk by chunk: position p of a request lives at
        offset p % ps of its (p // ps)-th page, and each request holds exactly
        ceil(len / ps) pages."""
        a = PagedKVAllocator(ps * 200, ps)  # never exhausted here
        reqs: list[array[int]] = []
        for sizes in chunks:
            req = array("q")
            for n in sizes:
                got = a.alloc_extend(req[-1] if req else None, n)
                assert got is not None and len(got) == n
                req.extend(got)
            reqs.append(req)
        pages_held = 0
        for req in reqs:
            for p, idx in enumerate(req):
                assert idx % ps == p % ps
                assert idx // ps == req[p - p % ps] // ps
            pages_held += -(-len(req) // ps)
        all_idx = [i for r in reqs for i in r]
        assert len(set(all_idx)) == len(all_idx)
        assert a.available_size() == a.capacity - pages_held * ps
        a.check_invariants()


# ---------------------------------------------------------------- stateful models


class TokenAllocatorMachine(RuleBasedStateMachine):
    """TokenKVAllocator against a set-based model."""

    held = Bundle("held")

    SIZE = 400

    def __init__(self) -> None:
        super().__init__()
        self.alloc = TokenKVAllocator(self.SIZE)
        self.model_free = set(range(self.SIZE))

    @rule(target=held, n=st.one_of(st.integers(0, 8), st.integers(60, 150)))
    def take(self, n: int) -> array[int]:
        got = self.alloc.alloc(n)
        if n > len(self.model_free):
            assert got is None
            return array("q")
        assert got is not None and len(got) == n
        assert set(got) <= self.model_free
        self.model_free -= set(got)
        return got

    @rule(batch=consumes(held))
    def give_back(self, batch: array[int]) -> None:
        self.alloc.free(batch)
        self.model_free |= set(batch)

    @rule(batch=held, i=st.integers(-2, SIZE + 2))
    def bad_free(self, batch: array[int], i: int) -> None:
        """A held batch plus one id that is free, repeated or out of range."""
        if 0 <= i < self.SIZE and i not in self.model_free and i not in batch:
            return  # that would be a valid free; not this rule's business
        before = copy.deepcopy(self.alloc)
        with pytest.raises(ValueError):
            self.alloc.free([*batch, i])
        assert_unchanged(before, self.alloc)

    @invariant()
    def agrees_with_model(self) -> None:
        self.alloc.check_invariants()
        assert self.alloc.available_size() == len(self.model_free)
        assert {i for i in range(self.SIZE) if self.alloc.is_free(i)} == self.model_free


# The full budgets run in the slow tier; the default tier runs a quarter of them.
TestTokenAllocatorMachine = pytest.mark.slow(TokenAllocatorMachine.TestCase)
TestTokenAllocatorMachine.settings = settings(max_examples=40, deadline=None)
TestTokenAllocatorMachineQuick = type("TokenAllocatorQuick", (TokenAllocatorMachine,), {}).TestCase
TestTokenAllocatorMachineQuick.settings = settings(max_examples=10, deadline=None)


class PagedRequestsMachine(RuleBasedStateMachine):
    """PagedKVAllocator driven like a scheduler: requests grow with
    alloc_extend and are freed whole. Held pages + free pages == all pages."""

    PS = 3
    PAGES = 10

    def __init__(self) -> None:
        super().__init__()
        self.alloc = PagedKVAllocator(self.PS * self.PAGES, self.PS)
        self.reqs: list[array[int]] = []

    def pages_held(self) -> int:
        return sum(-(-len(r) // self.PS) for r in self.reqs)

    @rule(n=st.integers(1, 8))
    def start(self, n: int) -> None:
        got = self.alloc.alloc_extend(None, n)
        if -(-n // self.PS) > self.PAGES - self.pages_held():
            assert got is None
        else:
            assert got is not None
            self.reqs.append(got)

    @rule(k=st.integers(0, 9), n=st.integers(0, 8))
    def extend(self, k: int, n: int) -> None:
        if not self.reqs:
            return
        req = self.reqs[k % len(self.reqs)]
        new_pages = -(-(len(req) + n) // self.PS) - -(-len(req) // self.PS)
        before = copy.deepcopy(self.alloc)
        got = self.alloc.alloc_extend(req[-1], n)
        if new_pages > self.PAGES - self.pages_held():
            assert got is None
            assert_unchanged(before, self.alloc)
        else:
            assert got is not None
            req.extend(got)

    @rule(k=st.integers(0, 9))
    def finish(self, k: int) -> None:
        if self.reqs:
            self.alloc.free(self.reqs.pop(k % len(self.reqs)))

    @invariant()
    def conservation(self) -> None:
        self.alloc.check_invariants()
        assert self.alloc.available_size() == (self.PAGES - self.pages_held()) * self.PS
        idx = [i for r in self.reqs for i in r]
        assert len(set(idx)) == len(idx)
        assert not any(self.alloc.is_free(i) for i in idx)


TestPagedRequestsMachine = pytest.mark.slow(PagedRequestsMachine.TestCase)
TestPagedRequestsMachine.settings = settings(max_examples=40, deadline=None)
TestPagedRequestsMachineQuick = type("PagedRequestsQuick", (PagedRequestsMachine,), {}).TestCase
TestPagedRequestsMachineQuick.settings = settings(max_examples=10, deadline=None)


# ---------------------------------------------------------------- StateSlotAllocator


class TestStateSlotAllocator:
    def test_round_trip_returns_int_lists(self) -> None:
        a = StateSlotAllocator(4)
        got = a.alloc(3)
        assert got == [0, 1, 2] and all(type(s) is int for s in got)
        assert a.available_size() == 1
        a.free(got)
        assert a.available_size() == 4 == a.capacity
        assert a.alloc(0) == []

    def test_exhaustion_and_double_free(self) -> None:
        a = StateSlotAllocator(3)
        got = a.alloc(2)
        assert got is not None
        before = copy.deepcopy(a)
        assert a.alloc(2) is None
        assert_unchanged(before, a)
        expect_error(a, ValueError, "slot 2 is already free", a.free, [0, 2])
        expect_error(a, ValueError, "out of range", a.free, [3])
        a.free([1])
        expect_error(a, ValueError, "slot 1 is already free", a.free, [1])
        assert a.alloc(2) == [1, 2]


# ---------------------------------------------------------------- fingerprints

tokens_st = st.lists(st.integers(0, 200_000), max_size=40)


class TestFingerprints:
    @given(a=tokens_st, b=tokens_st)
    def test_incremental(self, a: list[int], b: list[int]) -> None:
        assert fingerprint_of(a + b) == advance_fingerprint(fingerprint_of(a), b)

    @given(chunks=st.lists(tokens_st, max_size=5))
    def test_pool_advance_chain_equals_whole(self, chunks: list[list[int]]) -> None:
        pool = FingerprintStatePool(2)
        for c in chunks:
            pool.advance(1, array("q", c))
        flat = [t for c in chunks for t in c]
        assert pool.fingerprint(1) == FingerprintStatePool.fingerprint_of(flat)
        assert pool.fingerprint(0) == FingerprintStatePool.EMPTY == EMPTY_FINGERPRINT

    def test_distinguishes_small_sequences(self) -> None:
        seqs = [[], [0], [0, 0], [1], [0, 1], [1, 0], [5], [0, 5], [1, 2], [2, 1]]
        fps = [fingerprint_of(s) for s in seqs]
        assert len(set(fps)) == len(seqs)
        assert fingerprint_of([]) == EMPTY_FINGERPRINT

    def test_copy_is_a_snapshot(self) -> None:
        pool = FingerprintStatePool(4)
        pool.advance(0, [1, 2, 3])
        pool.copy([0], [2])
        pool.advance(0, [4])
        assert pool.fingerprint(2) == fingerprint_of([1, 2, 3])
        assert pool.fingerprint(0) == fingerprint_of([1, 2, 3, 4])

    def test_copy_batched_reads_before_writing(self) -> None:
        pool = FingerprintStatePool(3)
        pool.advance(0, [10])
        pool.advance(1, [20])
        pool.copy([0, 1], [1, 0])  # swap
        assert pool.fingerprint(0) == fingerprint_of([20])
        assert pool.fingerprint(1) == fingerprint_of([10])
        pool.copy([0, 0], [1, 2])  # fan-out
        assert pool.fingerprint(1) == pool.fingerprint(2) == fingerprint_of([20])

    def test_clear(self) -> None:
        pool = FingerprintStatePool(3)
        for s in range(3):
            pool.advance(s, [s])
        pool.clear([0, 2, 2])
        assert [pool.fingerprint(s) for s in range(3)] == [
            EMPTY_FINGERPRINT,
            fingerprint_of([1]),
            EMPTY_FINGERPRINT,
        ]

    @pytest.mark.parametrize(
        "src, dst, match",
        [
            ([0], [0, 1], "differ in length"),
            ([0, 1], [2, 2], "more than once"),
            ([3], [0], "out of range"),
            ([0], [-1], "out of range"),
        ],
    )
    def test_bad_copy_changes_nothing(self, src: list[int], dst: list[int], match: str) -> None:
        pool = FingerprintStatePool(3)
        for s in range(3):
            pool.advance(s, [s, s])
        before = [pool.fingerprint(s) for s in range(3)]
        with pytest.raises(ValueError, match=match):
            pool.copy(src, dst)
        assert [pool.fingerprint(s) for s in range(3)] == before

    def test_bad_slot_and_tokens(self) -> None:
        pool = FingerprintStatePool(2)
        pool.advance(0, [1])
        with pytest.raises(ValueError, match="out of range"):
            pool.advance(2, [1])
        with pytest.raises(TypeError, match="tokens"):
            pool.advance(0, [1.5])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="out of range"):
            pool.clear([0, 9])
        assert pool.fingerprint(0) == fingerprint_of([1])


# ---------------------------------------------------------------- ReqToTokenTable


class TestReqToTokenTable:
    def test_write_read_round_trip(self) -> None:
        t = ReqToTokenTable(rows=3, max_context=8)
        r = t.alloc()
        assert r == 0
        t.write(r, 0, array("q", [7, 8, 9]))
        t.write(r, 3, [10, 11])
        got = t.read(r, 1, 5)
        assert isinstance(got, array) and got.typecode == "q"
        assert list(got) == [8, 9, 10, 11]
        assert list(t.read(r, 2, 2)) == []
        assert t.table.dtype == np.int64 and t.table.shape == (3, 8)

    def test_rows_alloc_free(self) -> None:
        t = ReqToTokenTable(2, 4)
        assert [t.alloc(), t.alloc(), t.alloc()] == [0, 1, None]
        t.free(0)
        assert t.available_size() == 1 and t.is_free(0)
        with pytest.raises(ValueError, match="not allocated"):
            t.free(0)
        assert t.alloc() == 0
        t.check_invariants()

    def test_bounds_checks_leave_table_unchanged(self) -> None:
        t = ReqToTokenTable(2, 4)
        r = t.alloc()
        assert r is not None
        t.write(r, 0, [1, 2, 3, 4])
        snapshot = t.table.copy()
        with pytest.raises(ValueError, match="max_context"):
            t.write(r, 2, [5, 6, 7])
        with pytest.raises(ValueError, match="start must be >= 0"):
            t.write(r, -1, [5])
        with pytest.raises(ValueError, match="not allocated"):
            t.write(1, 0, [5])
        with pytest.raises(ValueError, match="out of range"):
            t.write(2, 0, [5])
        with pytest.raises(TypeError):
            t.write(r, 0, [1.5])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="start <= end"):
            t.read(r, 3, 2)
        with pytest.raises(ValueError, match="start <= end"):
            t.read(r, 0, 5)
        with pytest.raises(ValueError, match="not allocated"):
            t.read(1, 0, 1)
        assert np.array_equal(t.table, snapshot)
        assert t.available_size() == 1


# ---------------------------------------------------------------- StateGeometry


class TestStateGeometry:
    def test_mamba2_by_hand(self) -> None:
        g = StateGeometry.mamba2(
            num_layers=2, num_heads=4, head_dim=8, state_size=16, n_groups=1, conv_kernel=4
        )
        # conv_dim = 4*8 + 2*1*16 = 64; conv (64, 3) = 192 elems; ssm 4*8*16 = 512
        assert g.conv_shapes == ((64, 3),)
        assert g.ssm_shape == (4, 8, 16)
        assert g.conv_bytes_per_slot == 2 * 192 * 4
        assert g.ssm_bytes_per_slot == 2 * 512 * 4
        assert g.bytes_per_slot == 2 * (192 + 512) * 4 == 5632

    def test_mamba2_mixed_dtypes(self) -> None:
        g = StateGeometry.mamba2(2, 4, 8, 16, 1, 4, conv_dtype="bfloat16")
        assert g.bytes_per_slot == 2 * (192 * 2 + 512 * 4) == 4864

    def test_gated_delta_net_by_hand(self) -> None:
        g = StateGeometry.gated_delta_net(
            num_layers=3, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16, conv_kernel=4
        )
        # conv_dim = 2*2*8 + 4*16 = 96; conv (96, 3) = 288; ssm 4*8*16 = 512
        assert g.conv_shapes == ((96, 3),)
        assert g.ssm_shape == (4, 8, 16)
        assert g.bytes_per_slot == 3 * (288 + 512) * 4 == 9600

    def test_several_conv_tensors_and_normalisation(self) -> None:
        g = StateGeometry(1, [[4, 3], (2, 3)], [2, 2], ssm_dtype="float16")  # type: ignore[arg-type]
        assert g.conv_shapes == ((4, 3), (2, 3)) and g.ssm_shape == (2, 2)
        assert g.bytes_per_slot == (12 + 6) * 4 + 4 * 2
        assert hash(g) == hash(StateGeometry(1, ((4, 3), (2, 3)), (2, 2), ssm_dtype="float16"))
        with pytest.raises(dataclasses.FrozenInstanceError):
            g.num_layers = 2  # type: ignore[misc]

    @pytest.mark.parametrize(
        "kwargs, exc, match",
        [
            (dict(num_layers=0), ValueError, "num_layers"),
            (dict(num_layers=True), TypeError, "num_layers"),
            (dict(conv_shapes=((4, 0),)), ValueError, r"conv_shapes\[0\]\[1\]"),
            (dict(conv_shapes=((),)), ValueError, "at least one"),
            (dict(conv_shapes=(4, 3)), TypeError, r"conv_shapes\[0\]"),
            (dict(ssm_shape=(2, -1)), ValueError, "ssm_shape"),
            (dict(ssm_shape=(2.0,)), TypeError, "ssm_shape"),
            (dict(conv_dtype="float12"), ValueError, "unknown dtype"),
        ],
    )
    def test_validation(self, kwargs: dict[str, object], exc: type[Exception], match: str) -> None:
        base: dict[str, object] = dict(num_layers=1, conv_shapes=((4, 3),), ssm_shape=(2, 2))
        with pytest.raises(exc, match=match):
            StateGeometry(**{**base, **kwargs})  # type: ignore[arg-type]

    def test_constructor_validation(self) -> None:
        with pytest.raises(ValueError, match="conv_kernel"):
            StateGeometry.mamba2(1, 1, 1, 1, 1, conv_kernel=1)
        with pytest.raises(ValueError, match="n_groups"):
            StateGeometry.mamba2(1, 1, 1, 1, 0, 4)
        with pytest.raises(ValueError, match="head_v_dim"):
            StateGeometry.gated_delta_net(1, 1, 1, 1, 0, 4)


# ---------------------------------------------------------------- TorchStatePool


def small_pool(size: int = 4) -> TorchStatePool:
    g = StateGeometry(num_layers=3, conv_shapes=((4, 2), (2, 2)), ssm_shape=(2, 3, 2))
    return TorchStatePool(g, size)


def fill_distinct(pool: TorchStatePool) -> None:
    """Every element of every tensor gets a distinct value."""
    base = 0
    for t in pool.tensors():
        t.copy_(torch.arange(base, base + t.numel(), dtype=t.dtype).reshape(t.shape))
        base += t.numel()


class TestTorchStatePool:
    def test_layout_and_zero_init(self) -> None:
        g = StateGeometry.mamba2(2, 4, 8, 16, 1, 4, conv_dtype="bfloat16")
        pool = TorchStatePool(g, 5)
        assert [tuple(c.shape) for c in pool.conv] == [(2, 5, 64, 3)]
        assert tuple(pool.ssm.shape) == (2, 5, 4, 8, 16)
        assert pool.conv[0].dtype == torch.bfloat16 and pool.ssm.dtype == torch.float32
        assert all(not t.any() for t in pool.tensors())
        bytes_ = sum(t.numel() * t.element_size() for t in pool.tensors())
        assert bytes_ == 5 * g.bytes_per_slot
        assert pool.capacity == 5 and pool.device == torch.device("cpu")

    def test_copy_all_layers_then_mutating_src_leaves_dst(self) -> None:
        pool = small_pool()
        fill_distinct(pool)
        pool.copy([1], [3])
        for t in pool.tensors():
            assert torch.equal(t[:, 3], t[:, 1])
        src_fp = pool.slot_fingerprint(1)
        assert pool.slot_fingerprint(3) == src_fp
        convs, ssm = pool.layer(2)
        ssm[1] += 1.0
        convs[1][1] -= 5.0
        assert pool.slot_fingerprint(3) == src_fp != pool.slot_fingerprint(1)
        assert not torch.equal(pool.ssm[2, 3], pool.ssm[2, 1])

    def test_copy_batched_swap_and_fan_out(self) -> None:
        pool = small_pool()
        fill_distinct(pool)
        old = [t.clone() for t in pool.tensors()]
        pool.copy(torch.tensor([0, 1]), torch.tensor([1, 0]))
        for t, o in zip(pool.tensors(), old, strict=True):
            assert torch.equal(t[:, 0], o[:, 1]) and torch.equal(t[:, 1], o[:, 0])
            assert torch.equal(t[:, 2:], o[:, 2:])
        pool.copy([2, 2], [0, 3])
        for t, o in zip(pool.tensors(), old, strict=True):
            assert torch.equal(t[:, 0], o[:, 2]) and torch.equal(t[:, 3], o[:, 2])

    def test_clear_zeroes_only_those_slots(self) -> None:
        pool = small_pool()
        fill_distinct(pool)
        old = [t.clone() for t in pool.tensors()]
        pool.clear([0, 2])
        for t, o in zip(pool.tensors(), old, strict=True):
            assert not t[:, 0].any() and not t[:, 2].any()
            assert torch.equal(t[:, 1], o[:, 1]) and torch.equal(t[:, 3], o[:, 3])
        assert pool.slot_fingerprint(0) == 0.0
        pool.clear([])

    @pytest.mark.parametrize(
        "src, dst, exc, match",
        [
            ([0], [1, 2], ValueError, "differ in length"),
            ([0, 1], [2, 2], ValueError, "more than once"),
            ([4], [0], ValueError, "out of range"),
            ([0], [-1], ValueError, "out of range"),
            (torch.tensor([0.0]), [1], TypeError, "integers"),
            (torch.tensor([[0]]), [1], ValueError, "1-D"),
            ([0.5], [1], TypeError, "src"),
        ],
    )
    def test_bad_copy_changes_nothing(
        self, src: object, dst: object, exc: type[Exception], match: str
    ) -> None:
        pool = small_pool()
        fill_distinct(pool)
        old = [t.clone() for t in pool.tensors()]
        with pytest.raises(exc, match=match):
            pool.copy(src, dst)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="out of range"):
            pool.clear([1, 4])
        for t, o in zip(pool.tensors(), old, strict=True):
            assert torch.equal(t, o)

    @pytest.mark.parametrize(
        "dtype",
        ["float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8"],
    )
    def test_copy_and_clear_every_dtype(self, dtype: str) -> None:
        g = StateGeometry(2, ((3, 2),), (2, 2), conv_dtype=dtype, ssm_dtype=dtype)
        pool = TorchStatePool(g, 3)
        for t in pool.tensors():
            t.copy_((torch.arange(t.numel()) % 7 + 1).reshape(t.shape).to(t.dtype))
        pool.copy([0], [2])
        for t in pool.tensors():
            assert t.dtype == getattr(torch, dtype)
            assert torch.equal(t[:, 2].float(), t[:, 0].float())
        pool.clear([2])
        assert all(not t[:, 2].float().any() for t in pool.tensors())
        assert all(t[:, 1].float().all() for t in pool.tensors())

    def test_layer_views_and_range(self) -> None:
        pool = small_pool()
        convs, ssm = pool.layer(1)
        assert [tuple(c.shape) for c in convs] == [(4, 4, 2), (4, 2, 2)]
        assert tuple(ssm.shape) == (4, 2, 3, 2)
        ssm[2].fill_(7.0)
        assert torch.all(pool.ssm[1, 2] == 7.0) and not pool.ssm[0].any()
        with pytest.raises(ValueError, match="layer"):
            pool.layer(3)
        with pytest.raises(ValueError, match="slot"):
            pool.slot_fingerprint(4)

    def test_constructor_validation(self) -> None:
        with pytest.raises(TypeError, match="StateGeometry"):
            TorchStatePool("mamba", 4)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="size"):
            small_pool(0)


def test_pools_import_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import mambaradix.pools as p\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "assert p.TokenKVAllocator(2).alloc(1) is not None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
