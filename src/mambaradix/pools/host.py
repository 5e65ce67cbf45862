"""Host-memory (L2) pools: copies of device state slots and KV tokens in CPU tensors.

    HostStatePool(like, size)    like: a device state group, e.g. state_group(TorchStatePool)
                                 conv0.., ssm: [layers, size, *shape]; units = state slots
    HostKVPool(like, tokens, page_size)
                                 like: a device KV group, e.g. kv_group(k, v)
                                 k, v: [layers, tokens, heads, head_dim]; units = KV tokens,
                                 allocated a page at a time

The host tensors have the device tensors' dtypes and layout (units on dim 1), so
`transfer.Mover` copies units either way with one gather and one scatter, and a unit's bytes
are ``t[:, unit]`` on both sides. They are pinned (page-locked) where CUDA is available, so
copies to and from the device run asynchronously; on a CPU-only torch they are plain memory.

Each pool owns its allocator (the device pools' `StateSlotAllocator` / `PagedKVAllocator`:
LIFO, deterministic, a refused allocation returns None and changes nothing) and offers the
allocator's methods, so the tree's host residency frees into it exactly as device residency
frees into the device allocators. `check_conservation(held)` checks that every unit is free or
held exactly once.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

import torch

from mambaradix.pools._checks import as_index_array, as_positive
from mambaradix.pools.kv import PagedKVAllocator
from mambaradix.pools.state import StateSlotAllocator
from mambaradix.pools.torch_state import TorchStatePool
from mambaradix.pools.transfer import Group, Mover, Transfer, group_layout

__all__ = ["HostKVPool", "HostPool", "HostStatePool", "kv_group", "state_group"]


def state_group(pool: TorchStatePool) -> dict[str, torch.Tensor]:
    """The tensors of a state pool by part name: ``conv0``, ``conv1``, ..., ``ssm``."""
    if not isinstance(pool, TorchStatePool):
        raise TypeError(f"pool must be a TorchStatePool, got {type(pool).__name__}")
    return {**{f"conv{i}": t for i, t in enumerate(pool.conv)}, "ssm": pool.ssm}


def kv_group(k: torch.Tensor, v: torch.Tensor) -> dict[str, torch.Tensor]:
    """A KV pool's tensors by part name (``k``, ``v``: [layers, tokens, heads, head_dim])."""
    return {"k": k, "v": v}


class HostPool:
    """CPU tensors shaped like a device group but with `capacity` units, and their
    allocator. Use `HostStatePool` or `HostKVPool`."""

    __slots__ = ("tensors", "pinned", "_alloc", "_page")

    def __init__(
        self,
        like: Group,
        capacity: int,
        allocator: StateSlotAllocator | PagedKVAllocator,
        page_size: int,
        pin: bool | None,
    ) -> None:
        layout = group_layout(like, "like")
        if pin is None:
            pin = torch.cuda.is_available()
        elif not isinstance(pin, bool):
            raise TypeError(f"pin must be a bool or None, got {type(pin).__name__}")
        elif pin and not torch.cuda.is_available():
            raise ValueError("pin=True needs CUDA (pinned memory is page-locked for the GPU)")
        self.pinned = pin
        self._alloc = allocator
        self._page = page_size
        self.tensors: dict[str, torch.Tensor] = {
            part: torch.zeros((shape[0], capacity, *shape[1:]), dtype=dtype, pin_memory=pin)
            for part, (dtype, shape) in layout.items()
        }
        """Part name -> [layers, capacity, ...] on the CPU (write into, never rebind)."""

    # ------------------------------------------------------------------ allocator

    @property
    def capacity(self) -> int:
        """Units (slots or KV tokens) the pool holds. Pure."""
        return self._alloc.capacity

    @property
    def page_size(self) -> int:
        """Units taken and given back together (1 for state slots)."""
        return self._page

    @property
    def unit_bytes(self) -> int:
        """Bytes of one unit over every tensor. Pure."""
        return sum(t[:, 0].numel() * t.element_size() for t in self.tensors.values())

    def available_size(self) -> int:
        """Free units. Pure."""
        return self._alloc.available_size()

    def is_free(self, unit: int) -> bool:
        """Whether `unit` is free (ValueError if out of range). Pure."""
        return self._alloc.is_free(unit)

    def alloc(self, n: int) -> array[int] | None:
        """Take `n` units (a multiple of `page_size`), or return None and change nothing
        when the pool has too few free. Mutates on success."""
        got = self._alloc.alloc(n)
        return None if got is None else array("q", got)

    def free(self, units: Iterable[int]) -> None:
        """Give `units` back (ValueError, nothing freed, on a unit out of range, repeated or
        free already; KV: every page holding one of them is freed)."""
        self._alloc.free(units)

    def check_invariants(self) -> None:
        """The allocator's self-check and the tensors' shapes (RuntimeError). Pure."""
        self._alloc.check_invariants()
        for part, t in self.tensors.items():
            if t.shape[1] != self.capacity or t.device.type != "cpu":
                raise RuntimeError(f"host tensor {part} is {tuple(t.shape)} on {t.device}")

    def check_conservation(self, holders: Iterable[Iterable[int]]) -> None:
        """AssertionError unless every unit is free or held by exactly one holder.

        `holders`: the units each holder has (the tree's host copies, transfers in flight,
        ...). KV units count by page: a holder of any token of a page holds the page."""
        pages: list[int] = []
        for i, units in enumerate(holders):
            held = as_index_array(units, f"holders[{i}]")
            pages += dict.fromkeys(u // self._page for u in held)  # each page once per holder
        if len(set(pages)) != len(pages):
            raise AssertionError(f"a host {self._noun} is held twice")
        if any(self._alloc.is_free(p * self._page) for p in pages):
            raise AssertionError(f"a host {self._noun} is held and free at once")
        free, total = self.available_size() // self._page, self.capacity // self._page
        if free + len(pages) != total:
            raise AssertionError(
                f"host {self._noun} leak: free {free} + held {len(pages)} != capacity {total}"
            )

    @property
    def _noun(self) -> str:
        return "slot" if isinstance(self._alloc, StateSlotAllocator) else "KV page"

    # ------------------------------------------------------------------ copies

    def demote(
        self, mover: Mover, src: Group, src_idx: Sequence[int]
    ) -> tuple[array[int], Transfer[None]] | None:
        """Copy units `src_idx` of device group `src` into newly allocated host units:
        (host units, the transfer), or None when the pool is full (nothing allocated,
        nothing copied). The host units hold the bytes once the transfer is waited on;
        the caller owns them (free them here). Bad arguments raise before anything moves."""
        n = len(src_idx)
        units = self.alloc(n)
        if units is None:
            return None
        try:
            transfer = mover.copy(src, src_idx, self.tensors, units)
        except (TypeError, ValueError):
            self.free(units)
            raise
        return units, transfer

    def load(
        self, mover: Mover, units: Sequence[int], dst: Group, dst_idx: Sequence[int]
    ) -> Transfer[None]:
        """Copy host `units` into units `dst_idx` of device group `dst` (the host units
        stay allocated: free them when the tree drops the host copy)."""
        return mover.copy(self.tensors, units, dst, dst_idx)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity={self.capacity}, available={self.available_size()},"
            f" parts={list(self.tensors)}, pinned={self.pinned})"
        )


class HostStatePool(HostPool):
    """Host copies of state slots: tensors like `like`'s (e.g. `state_group(pool)`), `size`
    slots."""

    __slots__ = ()

    def __init__(self, like: Group, size: int, *, pin: bool | None = None) -> None:
        size = as_positive(size, "size")
        super().__init__(like, size, StateSlotAllocator(size), 1, pin)


class HostKVPool(HostPool):
    """Host copies of KV tokens: tensors like `like`'s (e.g. `kv_group(k, v)`), `tokens`
    units taken `page_size` at a time (`tokens` a multiple of it)."""

    __slots__ = ()

    def __init__(
        self, like: Group, tokens: int, *, page_size: int = 1, pin: bool | None = None
    ) -> None:
        alloc = PagedKVAllocator(tokens, page_size)
        super().__init__(like, alloc.capacity, alloc, alloc.page_size, pin)
