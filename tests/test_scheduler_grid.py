"""`SchedulerConfig.truncation_align_size`: prefill extends cut on a grid.

Each scenario's extends are worked out by hand in the comments from the
budget rules (`mambaradix.scheduler.budget`), with and without the grid;
default (None) keeps SGLang's behaviour.
"""

from __future__ import annotations

from array import array

import pytest

from mambaradix.core.tree import MambaRadixCache
from mambaradix.lifecycle import CacheManager, Request
from mambaradix.policies import SGLang
from mambaradix.pools import FingerprintStatePool, ReqToTokenTable, StateSlotAllocator
from mambaradix.pools import TokenKVAllocator as KV
from mambaradix.scheduler import (
    Extend,
    Scheduler,
    SchedulerConfig,
    ScriptedForward,
    Sequence,
)


class Recording(ScriptedForward):
    def __init__(self) -> None:
        self.batches: list[list[tuple[int, int, int]]] = []

    def prefill(self, batch: list[Extend]) -> list[int | None]:
        self.batches.append([(e.seq.id, e.start, e.end) for e in batch])
        return super().prefill(batch)


class OffGridStops(SGLang):
    def stops(self, req: Request) -> list[int]:
        return [s for s in (5, 19) if req.computed < s < req.total_len]


def run(chunk: int, align: int | None, policy: SGLang | None = None) -> Recording:
    mgr = CacheManager(
        MambaRadixCache(page_size=1, chunk_size=64),
        KV(512),
        StateSlotAllocator(16),
        FingerprintStatePool(16),
        ReqToTokenTable(4, 512),
    )
    fwd = Recording()
    cfg = SchedulerConfig(chunk_tokens=chunk, max_running=4, truncation_align_size=align)
    sched = Scheduler(mgr, fwd, policy or SGLang(), cfg, lambda: 0.0)
    a = Sequence(array("q", range(100, 120)), 1, script=array("q", [7]), id=0)  # 20 tokens
    b = Sequence(array("q", range(200, 213)), 1, script=array("q", [7]), id=1)  # 13 tokens
    sched.submit(a)
    sched.submit(b)
    sched.run()
    mgr.check_conservation()
    return fwd


def test_without_a_grid_chunks_are_cut_by_the_budget_only() -> None:
    # chunk 16: A takes the whole budget [0, 16) (B does not fit in 0 left);
    # then A's last 4 and B's first 12, then B's last token.
    assert run(16, None).batches == [[(0, 0, 16)], [(0, 16, 20), (1, 0, 12)], [(1, 12, 13)]]


def test_extends_never_cross_a_grid_point_and_truncated_ones_end_on_it() -> None:
    # grid 8, chunk 16: A gets one cell [0, 8) (8 of the budget left), B the
    # next 8 = [0, 8); then A [8, 16) and B's rest [8, 13) (its prompt end);
    # then A [16, 20).
    want = [[(0, 0, 8), (1, 0, 8)], [(0, 8, 16), (1, 8, 13)], [(0, 16, 20)]]
    assert run(16, 8).batches == want
    # stops off the grid (5, 19) are ignored: the same extends
    assert run(16, 8, OffGridStops()).batches == want


def test_a_request_that_cannot_reach_the_grid_waits() -> None:
    # grid 8, chunk 12: A [0, 8) leaves 4; B would end at 4, off the grid:
    # SGLang's rule (trunc_len < truncation_align_size -> OTHER), B waits;
    # the same after A [8, 16); A's last 4 leave 8: B [0, 8), then B [8, 13).
    want = [[(0, 0, 8)], [(0, 8, 16)], [(0, 16, 20), (1, 0, 8)], [(1, 8, 13)]]
    assert run(12, 8).batches == want


def test_off_grid_stops_apply_without_a_grid() -> None:
    # no grid, chunk 16: A stops at 5 (11 left), B too (6 left); then A runs
    # to its stop at 19 (14 of 16) and B gets the 2 left, [5, 7); then the rest.
    assert run(16, None, OffGridStops()).batches == [
        [(0, 0, 5), (1, 0, 5)],
        [(0, 5, 19), (1, 5, 7)],
        [(0, 19, 20), (1, 7, 13)],
    ]


def test_bad_grid_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="truncation_align_size must be a positive int"):
        SchedulerConfig(truncation_align_size=0)
    with pytest.raises(ValueError, match=r"truncation_align_size \(32\) must be <= chunk_tokens"):
        SchedulerConfig(chunk_tokens=16, truncation_align_size=32)
