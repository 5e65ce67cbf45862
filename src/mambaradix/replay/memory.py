"""The replay's memory: a byte budget turned into a KV pool and a state pool.

Two disciplines:

* split (default): `state_fraction` of the budget is the state pool, the rest
  the KV pool (SGLang's `--mamba-full-memory-ratio` style);
* shared (`sequential`, Marconi's simulator): one byte budget that KV units
  and states draw from together.

The state pool is a stand-in that holds nothing: only slot ids matter here.
"""

from __future__ import annotations

from array import array
from typing import Any

from mambaradix.pools import PagedKVAllocator, StateSlotAllocator, TokenKVAllocator
from mambaradix.validate import check_page_multiple


class NullStatePool:
    """State contents are irrelevant to hit rates: copies and clears are free."""

    def copy(self, src: Any, dst: Any) -> None:
        pass

    def clear(self, slots: Any) -> None:
        pass


class SharedBudget:
    """One byte budget for KV units and state slots (Marconi's simulator)."""

    def __init__(self, budget: int, kv_unit_bytes: int, state_bytes: int) -> None:
        self.budget, self.kv_unit_bytes, self.state_bytes = budget, kv_unit_bytes, state_bytes
        self.kv_used = self.states_used = 0

    def free_bytes(self) -> int:
        return self.budget - self.kv_used * self.kv_unit_bytes - self.states_used * self.state_bytes


class BudgetedKV(TokenKVAllocator):
    """KV units drawn from a shared byte budget."""

    def __init__(self, size: int, shared: SharedBudget) -> None:
        super().__init__(size)
        self.shared = shared

    def available_size(self) -> int:
        return min(super().available_size(), self.shared.free_bytes() // self.shared.kv_unit_bytes)

    def free_list_size(self) -> int:
        return super().available_size()

    def alloc(self, n: int) -> array[int] | None:
        if n > self.available_size():
            return None
        got = super().alloc(n)
        if got is not None:
            self.shared.kv_used += n
        return got

    def free(self, indices: Any) -> None:
        super().free(indices)
        self.shared.kv_used -= len(indices)


class BudgetedSlots(StateSlotAllocator):
    """State slots drawn from a shared byte budget."""

    def __init__(self, size: int, shared: SharedBudget) -> None:
        super().__init__(size)
        self.shared = shared

    def available_size(self) -> int:
        return min(super().available_size(), self.shared.free_bytes() // self.shared.state_bytes)

    def free_list_size(self) -> int:
        return super().available_size()

    def alloc(self, n: int) -> list[int] | None:
        if n > self.available_size():
            return None
        got = super().alloc(n)
        if got is not None:
            self.shared.states_used += n
        return got

    def free(self, slots: Any) -> None:
        slots = list(slots)
        super().free(slots)
        self.shared.states_used -= len(slots)


def split_pools(
    budget: int, state_fraction: float, kv_unit_bytes: int, state_bytes: int, page: int
) -> tuple[TokenKVAllocator | PagedKVAllocator, StateSlotAllocator]:
    """A KV pool (in units, whole pages) and a state pool from a byte budget."""
    kv_units, n_slots = split_sizes(budget, state_fraction, kv_unit_bytes, state_bytes, page)
    if kv_units < page or n_slots < 2:
        raise ValueError(
            f"{budget / 1e9:g} GB holds {kv_units} KV units and {n_slots} states: too small"
        )
    kv = TokenKVAllocator(kv_units) if page == 1 else PagedKVAllocator(kv_units, page)
    return kv, StateSlotAllocator(n_slots)


def split_sizes(
    budget: int, state_fraction: float, kv_unit_bytes: int, state_bytes: int, page: int
) -> tuple[int, int]:
    """`split_pools`' sizes: KV units (whole pages) and state slots."""
    kv_units = int(budget * (1 - state_fraction)) // kv_unit_bytes // page * page
    return kv_units, int(budget * state_fraction) // state_bytes


def shared_sizes(budget: int, kv_unit_bytes: int, state_bytes: int) -> tuple[int, int]:
    """`shared_pools`' free-list sizes (the byte budget binds first)."""
    return max(1, budget // kv_unit_bytes), max(1, budget // state_bytes)


def shared_pools(
    budget: int, kv_unit_bytes: int, state_bytes: int
) -> tuple[BudgetedKV, BudgetedSlots]:
    shared = SharedBudget(budget, kv_unit_bytes, state_bytes)
    kv_units, n_slots = shared_sizes(budget, kv_unit_bytes, state_bytes)
    return BudgetedKV(kv_units, shared), BudgetedSlots(n_slots, shared)


def exact_pools(
    kv_units: int, state_slots: int, page: int
) -> tuple[TokenKVAllocator | PagedKVAllocator, StateSlotAllocator]:
    """Pools of exactly these sizes (e.g. an engine's, to predict its hits)."""
    check_page_multiple(kv_units, "kv_units", page, "the page")
    kv = TokenKVAllocator(kv_units) if page == 1 else PagedKVAllocator(kv_units, page)
    return kv, StateSlotAllocator(state_slots)
