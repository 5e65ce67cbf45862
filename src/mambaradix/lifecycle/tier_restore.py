"""A load from the lower tiers carried out through a `CacheManager`: device memory for the
units past the device's usable prefix and a state slot (allocating may evict, hence
demote), the check that the depth is still usable after that, the caller's `load` (the
engine copies the bytes in; the replay counts them), then the tree's public `insert`. The
state becomes visible on the device only after `load` returned: publish after write.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mambaradix.core.results import InsertResult
from mambaradix.lifecycle.manager import CacheManager

Usable = Callable[[Sequence[int], int, int], bool]
# (start, kv_on_device, kv, slot) -> whether every byte arrived (False: a store miss)
Load = Callable[[int, int, "array[int]", int], bool]


@dataclass(frozen=True)
class Restored:
    """A load that went in: the device's usable prefix `start` before it, how far its KV
    reached (`kv_on_device`), the KV indices and slot allocated (those past `start`), and
    the insert's result."""

    start: int
    kv_on_device: int
    kv: array[int]
    slot: int
    result: InsertResult


def restore(
    cache: CacheManager,
    key: Sequence[int],
    extra_key: Any,
    depth: int,
    usable: Usable,
    load: Load,
) -> Restored | None:
    """Put `key[:depth]` on the device from below; None (nothing changed but evictions)
    when there is no device memory for it, the depth stopped being usable, or `load`
    reports bytes missing."""
    tree = cache.tree
    m = tree.match_prefix(key, extra_key, read_only=True)
    start = m.prefix_len
    lock = tree.inc_lock_ref(m.node) if start else None
    try:
        got = _alloc(cache, depth - start)
    finally:
        if lock is not None:
            tree.dec_lock_ref(lock)
    if got is None:
        return None
    kv, slot = got
    m = tree.match_prefix(key, extra_key, read_only=True)  # allocation may evict
    usable_now = m.prefix_len == start and usable(key, depth, m.kv_hit_len)
    if not usable_now or not load(start, m.kv_hit_len, kv, slot):
        cache.kv.free(kv)  # the units a failed load wrote to are never inserted
        cache.slots.free([slot])
        return None
    values = array("q", m.kv_indices) + array("q", kv)
    result = tree.insert(key[:depth], values, slot, start, extra_key)
    if result.freed_kv:
        cache.kv.free(result.freed_kv)
    if result.state_existed:
        cache.slots.free([slot])
    return Restored(start, m.kv_hit_len, array("q", kv), slot, result)


def _alloc(cache: CacheManager, units: int) -> tuple[Any, int] | None:
    cache.evict_kv_for(units)
    kv = cache.kv.alloc(units)
    if kv is None:
        return None
    slot = cache.alloc_slot()
    if slot is None:
        cache.kv.free(kv)
        return None
    return kv, slot
