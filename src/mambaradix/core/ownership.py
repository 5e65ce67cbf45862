"""Who holds each KV index: the protocol the tree asks, and a stand-in for a tree alone.

A KV slot is free, held by a request, or held by the tree: one fact, kept where the slots
live, in the KV pool (`mambaradix.pools.kv`: one byte per slot, as nano-vllm's
`BlockManager`, vLLM's `BlockPool`, mini-sglang's `CacheManager`). The tree asks its owner
through `KVOwner` when it takes indices (`insert`) and gives them back (eviction): it checks
that an insert hands over only indices the caller holds, once each, and never ones it holds
itself (upstream would hold an index twice, or hand a cached one back to be freed).

A `CacheManager` attaches its KV pool to its tree. A tree alone has no pool: the check is
off unless asked for (`MambaRadixCache(check_kv=True)`), which gives it a `HeldSet`, the
tree's own record (a set; it knows no requests, so only held-by-the-tree is checked).
"""

from __future__ import annotations

from array import array
from typing import Protocol, runtime_checkable


@runtime_checkable  # a CacheManager attaches a pool that has these methods (isinstance)
class KVOwner(Protocol):
    """What a tree asks about the KV indices it takes and gives back."""

    def claim(self, values: array[int], start: int, keep: int) -> bool:
        """Hand values[keep:] to the tree (start <= keep <= len(values)), provided every
        index of values[start:] may be (>= 0, the caller's, not the tree's) and none
        repeats there; otherwise change nothing and return False."""

    def release(self, values: array[int]) -> None:
        """The tree gives `values` (all its own) back to its caller."""

    def held_by_tree(self, index: int) -> bool:
        """Whether the tree holds `index` (any int)."""

    def refusal(self, index: int) -> str | None:
        """Why `index` (>= 0, not the tree's) may not be claimed, or None if it may
        (completes "kv_indices[i] = index ..." in the tree's error)."""

    def tree_indices(self) -> set[int]:
        """Every index the tree holds (for checks)."""


class HeldSet:
    """The KV indices a tree alone holds (`check_kv=True`): a set, C-speed per index."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held: set[int] = set()

    def claim(self, values: array[int], start: int, keep: int) -> bool:
        n = len(values) - start
        if n <= 0:
            return True
        part = values[start:] if start else values
        if min(part) < 0 or not self.held.isdisjoint(part) or len(set(part)) != n:
            return False
        self.held.update(values[keep:] if keep else values)
        return True

    def release(self, values: array[int]) -> None:
        self.held.difference_update(values)

    def held_by_tree(self, index: int) -> bool:
        return index in self.held

    def refusal(self, index: int) -> str | None:
        return None

    def tree_indices(self) -> set[int]:
        return set(self.held)


__all__ = ["HeldSet", "KVOwner"]
