"""Result records returned by the tree. The tree never frees memory: every
index or slot a caller must free comes back in one of these."""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from mambaradix.core.node import TreeNode


class MatchResult(NamedTuple):
    """What `match_prefix` found.

    prefix_len: tokens usable from the cache (ends at the deepest matched node
        that holds a state; 0 when only the root matched).
    kv_indices: KV indices of those tokens, `array('q')`, len == prefix_len.
    node: the node at prefix_len (holds a state, or is the root); lock it.
    branching_len: chunk-aligned total KV-matched length when the KV match
        goes past the last state, else None (SGLang's mamba_branching_seqlen).
    kv_hit_len: every matched token, including those past the last state.
    """

    prefix_len: int
    kv_indices: array[int]
    node: TreeNode
    branching_len: int | None
    kv_hit_len: int


class InsertResult(NamedTuple):
    """What `insert` did.

    prefix_len: tokens of the key that were already in the tree.
    state_existed: True when a state already sat at the key's end; the caller
        keeps ownership of the state it passed (and must free it).
    freed_kv: the caller's duplicate KV indices in [prev_prefix_len, prefix_len)
        that the tree did not take; the caller must free them.
    node: the node that ends at the key's end and holds its state (the root for an
        empty key), so that a caller needs no second walk to lock or read it. None
        only from a stand-in that cannot say (the upstream adapters of the tests).
    """

    prefix_len: int
    state_existed: bool
    freed_kv: array[int]
    node: TreeNode | None = None


class EvictResult(NamedTuple):
    """What an eviction removed (`evict`, `evict_leaf`, `evict_state_of`, `reset`).

    kv_tokens: KV tokens freed by KV eviction: the deleted leaves and the
        tombstones they left childless (0 from `evict_state_of` and `reset`).
    states: states freed by state eviction (0 from `evict_leaf` and `reset`).
    freed_kv / freed_states: everything freed, which the caller must free. They
        also hold what a phase frees on the side and does not count, as SGLang:
        a KV-evicted leaf's state, a state-evicted leaf's KV.
    """

    kv_tokens: int
    states: int
    freed_kv: array[int]
    freed_states: list[int]
