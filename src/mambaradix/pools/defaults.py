"""The optional capabilities of an index pool, declared once with a plain free list's answer.

The lifecycle, the scheduler and the replay ask every pool these (they are members of the
`KVAllocator` and `SlotAllocator` protocols of `lifecycle.manager`); a pool inherits the
answer here and overrides what it does differently:

    free_list_size()   indices nobody holds (conservation checks, peaks); overridden by a
                       pool whose `available_size` counts something else (the replay's
                       shared byte budget, vLLM's block pool with its cached blocks)
    page_size          KV indices per page (1: single tokens); a paged pool's own
    alloc_extend(l, n) n more KV indices for a request whose last index is `l`; a paged
                       pool fills the rest of `l`'s page first, a token pool has no rest
    reclaims_cache     whether `available_size` already counts what the tree caches (vLLM's
                       block pool pops cached blocks itself; the scheduler's budget then
                       adds no evictable KV)
"""

from __future__ import annotations

from array import array

__all__ = ["KVPoolDefaults", "SlotPoolDefaults"]


class SlotPoolDefaults:
    """A pool whose free list is what it can hand out."""

    __slots__ = ()

    def available_size(self) -> int:
        raise NotImplementedError  # every pool has its own

    def free_list_size(self) -> int:
        """Indices nobody holds, of `capacity`: here all that `available_size` counts."""
        return self.available_size()


class KVPoolDefaults(SlotPoolDefaults):
    """A KV pool of single-token pages that reclaims nothing by itself."""

    __slots__ = ()
    reclaims_cache = False

    @property
    def page_size(self) -> int:
        return 1

    def alloc(self, n: int) -> array[int] | None:
        raise NotImplementedError  # every pool has its own

    def alloc_extend(self, last_index: int | None, n: int) -> array[int] | None:
        """`n` more indices for a request whose last index is `last_index`: a page of one
        token has no room after it, so these are `alloc(n)`'s."""
        return self.alloc(n)
