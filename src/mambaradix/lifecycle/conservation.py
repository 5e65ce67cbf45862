"""Conservation of memory (reference doc I9, I10): every KV index (every KV
page, with a paged allocator) and every state slot is free, held by the tree,
or held by exactly one request, exactly once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from mambaradix.lifecycle.manager import CacheManager


def check_conservation(mgr: CacheManager) -> None:
    """Raise AssertionError naming what leaked or is owned twice."""
    held_kv: list[int] = []
    held_slots: list[int] = []
    for req in mgr.active:
        assert req.row is not None and req.slot is not None
        held_kv += mgr.rows.read(req.row, req.prefix_len, req.computed)
        held_slots.append(req.slot)
        held_slots += req.track_slots or []
    held_slots += [r.slot for r in mgr.staged if r.slot is not None]
    page = mgr.page_size
    tree_kv = sorted({i // page for i in mgr.tree.all_kv_indices()}) if page > 1 else None
    if tree_kv is None:
        _check_owned("KV index", mgr.kv, list(mgr.tree.all_kv_indices()), held_kv, 1)
    else:
        _check_owned("KV page", mgr.kv, tree_kv, sorted({i // page for i in held_kv}), page)
    _check_owned("state slot", mgr.slots, mgr.tree.all_states(), held_slots, 1)
    _check_pool_map(mgr, held_kv)


def _check_pool_map(mgr: CacheManager, held_kv: list[int]) -> None:
    """With the KV pool as the tree's owner (`core/ownership.py`), its map holds the
    tree's KV indices exactly, and none of a request's."""
    owner = mgr.tree.kv_owner
    if owner is None or owner is not cast(object, mgr.kv):
        return
    if owner.tree_indices() != set(mgr.tree.all_kv_indices()):
        raise AssertionError("the KV pool's map of the tree's slots differs from the tree")
    if any(owner.held_by_tree(i) for i in held_kv):
        raise AssertionError("a KV index is held by a request and by the tree at once")


def _check_owned(what: str, pool: Any, tree: list[int], held: list[int], unit: int) -> None:
    owned = tree + held
    # A pool that shares a byte budget reports less than its free list as
    # available; conservation is about the free list itself.
    free = getattr(pool, "free_list_size", pool.available_size)() // unit
    capacity = pool.capacity // unit
    if any(pool.is_free(i * unit) for i in owned):
        raise AssertionError(f"a {what} is owned and free at once")
    if free + len(owned) != capacity or len(set(owned)) != len(owned):
        raise AssertionError(
            f"{what} leak or double ownership: free {free} + tree {len(tree)} "
            f"+ requests {len(held)} != capacity {capacity} (or an entry is owned twice)"
        )
