"""SGLang 0.5.23's eviction rules, for trees built with compat="sglang-0.5.23".

0.5.23 caches hybrid models in `UnifiedRadixCache`: a tree core whose FULL
component (KV) evicts device leaves and whose MAMBA component (states) evicts
from an LRU list. What differs from 0.5.15.post1 (file:line in the 0.5.23
wheel, `sglang/srt/mem_cache/`):

* Deleting a leaf deletes that node only. A state-less ancestor left childless
  survives as a KV-only leaf (`unified_cache/unified_tree_core.py:1903-1929`,
  `_iteratively_delete_tombstone_ancestors` at 2289-2346 stops at the first
  node holding KV), and is evicted later like any leaf: KV eviction pops the
  least recently used unlocked leaf from a heap by last access time, pushing a
  victim's parent when it becomes a leaf (`components/full.py:209-244`). The
  tree's KV list is kept in that order, so the heap's pick is the least
  recently used unlocked leaf of the list.
* One tracker counts both resources across both phases
  (`unified_radix_cache.py:805-839, 952-1058`): a KV-evicted leaf's state counts
  toward the states asked for, a state-evicted leaf's KV toward the tokens, and
  the state phase is skipped when the KV phase already freed enough states.
* State eviction walks the state list from its least recently used unlocked
  end: an unlocked leaf is deleted (its KV with it), any other node loses its
  state (`components/mamba.py:373-463`).

Allocation-driven eviction (`evict_for_alloc`, `allocator/base.py:155-169`)
evicts to an availability target, stopping at the first victim that meets it;
the caller gets that by asking for the shortfall (`MambaRadixCache.evict`
stops at the first victim that reaches the count, and every token or state it
frees becomes available).
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

from mambaradix.core.node import Resource, TreeNode
from mambaradix.core.results import EvictResult

if TYPE_CHECKING:
    from mambaradix.core.tree import MambaRadixCache

KV, STATE = Resource.KV, Resource.STATE


class _Freed:
    """What one eviction call freed, counted by resource (SGLang's tracker)."""

    __slots__ = ("got", "kv", "states")

    def __init__(self) -> None:
        self.got = [0, 0]  # indexed by Resource: KV tokens, states
        self.kv: array[int] = array("q")
        self.states: list[int] = []

    def result(self) -> EvictResult:
        return EvictResult(self.got[KV], self.got[STATE], self.kv, self.states)


def evict(tree: MambaRadixCache, want_kv: int, want_states: int) -> EvictResult:
    """`MambaRadixCache.evict` under 0.5.23's rules (see the module docstring)."""
    freed = _Freed()
    if freed.got[KV] < want_kv:
        _evict_kv(tree, want_kv, freed)
    if freed.got[STATE] < want_states:
        _evict_states(tree, want_states, freed)
    return freed.result()


def _evict_kv(tree: MambaRadixCache, want: int, freed: _Freed) -> None:
    lru = tree.lru[KV]
    x = lru.lru_unlocked_leaf()
    while freed.got[KV] < want and x is not None:
        nxt = lru.lru_unlocked_leaf(x)
        node = x.node
        assert node is not None and node.parent is not None
        parent = node.parent
        _delete_leaf(tree, node, freed)
        if parent is not tree.root and not parent.children and not parent.kv.lock:
            nxt = lru.lru_unlocked_leaf()  # the parent is a leaf now, maybe the oldest one
        x = nxt


def _evict_states(tree: MambaRadixCache, want: int, freed: _Freed) -> None:
    lru = tree.lru[STATE]
    x = lru.lru_unlocked()
    while freed.got[STATE] < want and x is not None:
        nxt = lru.lru_unlocked(x)
        node = x.node
        assert node is not None
        drop_state(tree, node, freed)
        x = nxt


def drop_state(tree: MambaRadixCache, node: TreeNode, freed: _Freed) -> None:
    """Free node's state: an unlocked leaf is deleted with its KV, any other
    node becomes a tombstone (its KV stays)."""
    if node.children or node.kv.lock:
        _free_state(tree, node, freed)
    else:
        _delete_leaf(tree, node, freed)


def evict_state_of(tree: MambaRadixCache, node: TreeNode) -> EvictResult:
    freed = _Freed()
    drop_state(tree, node, freed)
    return freed.result()


def evict_leaf(tree: MambaRadixCache, node: TreeNode) -> EvictResult:
    freed = _Freed()
    _delete_leaf(tree, node, freed)
    return freed.result()


def _free_state(tree: MambaRadixCache, node: TreeNode, freed: _Freed) -> None:
    state = node.state
    assert state is not None and node.st.lock == 0
    freed.states.append(state)
    freed.got[STATE] += 1
    tree._held_states.discard(state)
    tree.lru[STATE].remove(node.st)
    node.state = None
    tree._evictable[STATE] -= 1
    for listener in tree._listeners:
        listener.state_removed(node)


def _delete_leaf(tree: MambaRadixCache, leaf: TreeNode, freed: _Freed) -> None:
    """Delete an unlocked leaf (its state, if any, and its KV); its ancestors stay."""
    assert not leaf.children and leaf.kv.lock == 0
    if leaf.state is not None:
        _free_state(tree, leaf, freed)
    freed.got[KV] += tree._detach(leaf, freed.kv)


__all__ = ["drop_state", "evict", "evict_leaf", "evict_state_of"]
