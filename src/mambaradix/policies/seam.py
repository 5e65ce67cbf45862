"""`PolicyTree`: the part of the radix tree a policy may touch, and nothing more.

Policies are typed against this Protocol, not against `MambaRadixCache`, so what
they may do to the tree is listed in one place (the tree satisfies it
structurally; `tests/test_layers.py` checks that it does and that no policy reaches
for a private attribute). A policy also reads the public fields of the nodes these
methods hand out (`TreeNode.parent`, `children`, `key`, `state`, `kv_lock`,
`state_lock`, `depth_tokens()`), and never writes them.

Every method here is called between forwards, from a policy hook or from the
evictor (`Policy.evict`), never from inside a listener callback: a listener must
not call back into the tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from mambaradix.core.node import TreeNode
from mambaradix.core.results import EvictResult, MatchResult
from mambaradix.core.tree import TreeListener

__all__ = ["PolicyTree"]


class PolicyTree(Protocol):
    """The tree methods policies use (`mambaradix.core.tree.MambaRadixCache`'s).

    Mutating: `evict`, `evict_leaf`, `evict_state_of` remove what they name and
    return the freed KV indices and state slots, which the caller must give back
    to the pools (the cache manager does for the evictor's result; a policy that
    evicts outside the evictor releases them through `CacheManager.release`).
    `add_listener` registers a `TreeListener` for the tree's lifetime.

    Read-only: `match_prefix(..., read_only=True)` and `peek` change neither the
    recency order nor any lock; their results (nodes, lengths) are safe to use
    until the next mutating call. `state_clock()`, `state_last_use(node)`,
    `evictable_states()`, `full_evictable_size()`, `full_protected_size()` are
    snapshots of the moment they are called."""

    def add_listener(self, listener: TreeListener) -> None:
        """Call `listener`'s hooks on every structural change from now on."""
        ...

    def evict(self, kv_tokens: int = 0, states: int = 0) -> EvictResult:
        """The tree's own LRU eviction of at least that much (what it can)."""
        ...

    def evict_leaf(self, node: TreeNode) -> EvictResult:
        """Delete unlocked leaf `node` (its KV and state)."""
        ...

    def evict_state_of(self, node: TreeNode) -> EvictResult:
        """Drop `node`'s unlocked state (the node may go with it when it has no KV use)."""
        ...

    def evictable_states(self) -> list[TreeNode]:
        """The nodes whose state could be evicted now (unlocked)."""
        ...

    def state_clock(self) -> int:
        """The tree's recency clock now."""
        ...

    def state_last_use(self, node: TreeNode) -> int:
        """When `node`'s state was last used (on `state_clock`'s scale)."""
        ...

    def full_evictable_size(self) -> int:
        """KV tokens that eviction could free now."""
        ...

    def full_protected_size(self) -> int:
        """KV tokens locked by running requests."""
        ...

    def match_prefix(
        self, key: Sequence[int], extra_key: object = None, read_only: bool = False
    ) -> MatchResult:
        """The longest cached prefix of `key`; policies pass read_only=True."""
        ...

    def peek(self, key: Sequence[int], extra_key: object = None) -> TreeNode | None:
        """The node that ends exactly at `key`, if any (read-only)."""
        ...
