"""The optional pool capabilities (`pools.defaults`): the pools that had one keep their own
answer, the others get the default, and the lifecycle's protocols see both (issue 20)."""

from __future__ import annotations

from array import array

from mambaradix.lifecycle.manager import KVAllocator, SlotAllocator
from mambaradix.policies.vllm_pool import BlockPool, PoolKV
from mambaradix.pools import PagedKVAllocator, ReqToTokenTable, StateSlotAllocator
from mambaradix.pools import TokenKVAllocator as TokenKV
from mambaradix.replay.memory import BudgetedKV, BudgetedSlots, SharedBudget


def test_a_token_pool_has_the_defaults() -> None:
    kv: KVAllocator = TokenKV(8)
    assert kv.page_size == 1 and kv.reclaims_cache is False
    assert kv.alloc_extend(None, 3) == array("q", [0, 1, 2])  # alloc(3) on a fresh pool
    assert kv.alloc_extend(2, 2) == array("q", [3, 4])  # a page of 1 has no rest to fill
    assert kv.free_list_size() == kv.available_size() == 3
    slots: SlotAllocator = StateSlotAllocator(4)
    slots.alloc(1)
    assert slots.free_list_size() == slots.available_size() == 3


def test_a_paged_pool_keeps_its_page_and_fills_it_first() -> None:
    kv: KVAllocator = PagedKVAllocator(12, 4)
    assert kv.page_size == 4 and kv.reclaims_cache is False
    assert kv.alloc_extend(None, 2) == array("q", [0, 1])  # page 0, two left on it
    assert kv.alloc_extend(1, 3) == array("q", [2, 3, 4])  # the rest of page 0, then page 1
    assert kv.free_list_size() == kv.available_size() == 4  # page 2


def test_a_budgeted_pool_counts_its_free_list_apart() -> None:
    shared = SharedBudget(budget=100, kv_unit_bytes=10, state_bytes=30)
    kv, slots = BudgetedKV(8, shared), BudgetedSlots(4, shared)
    assert slots.alloc(2) is not None  # 60 of the 100 bytes: 4 KV units left
    assert (kv.available_size(), kv.free_list_size()) == (4, 8)
    assert (slots.available_size(), slots.free_list_size()) == (1, 2)


def test_the_vllm_block_pool_reclaims_its_cache() -> None:
    kv: KVAllocator = PoolKV(BlockPool(4), block=2)
    assert kv.page_size == 2 and kv.reclaims_cache is True
    assert kv.alloc_extend(None, 1) == array("q", [0])
    assert kv.alloc_extend(0, 2) == array("q", [1, 2])  # the rest of page 0, then page 1
    assert kv.free_list_size() == 8 - 3  # 2 * 4 indices, 3 owned


def test_the_request_table_declares_its_width() -> None:
    assert ReqToTokenTable(2, 16).max_context == 16
