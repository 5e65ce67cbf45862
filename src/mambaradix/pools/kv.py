"""KV-cache index allocators: which token slots of the (external) KV buffers
are free. They hold no tensors; they hand out `array('q')` indices that the
radix tree stores and later returns for the caller to free here.

`TokenKVAllocator` hands out single token indices (page size 1).
`PagedKVAllocator` hands out whole pages of `page_size` consecutive indices:

    page:     0            1            2
    index:  0 1 2 3 |  4 5 6 7 |  8 9 10 11     (page_size = 4)

Both are LIFO (see `_freelist.FreeStack`): the most recently freed indices
(pages) are reused first, in the order they were freed; a fresh allocator
hands out 0, 1, 2, ... in ascending order.

Both know, one byte per index, whether it is free, a request's or the radix
tree's (`pools/ownership.py`), and are the tree's `KVOwner` (`core/ownership.py`):
`CacheManager` attaches its allocator to its tree, which then takes only indices
a request holds, and `free` refuses the ones the tree holds.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

import numpy as np

from mambaradix.pools._checks import (
    VECTOR_MIN,
    as_count,
    as_index_array,
    as_int,
    as_positive,
    check_in_range,
)
from mambaradix.pools._freelist import FreeStack
from mambaradix.pools.ownership import FREE, REQUEST, TREE, SlotOwners

__all__ = ["PagedKVAllocator", "TokenKVAllocator"]


class _OwnerMethods:
    """`core.ownership.KVOwner` for an allocator, through its `_owners` map."""

    __slots__ = ()
    _owners: SlotOwners

    def claim(self, values: array[int], start: int, keep: int) -> bool:
        """The tree takes values[keep:] (see `KVOwner.claim`)."""
        return self._owners.claim(values, start, keep)

    def release(self, values: array[int]) -> None:
        """The tree hands `values` back: the caller's again (to free)."""
        self._owners.release(values)

    def held_by_tree(self, index: int) -> bool:
        return self._owners.held_by_tree(index)

    def refusal(self, index: int) -> str | None:
        return self._owners.refusal(index)

    def tree_indices(self) -> set[int]:
        """Every index the tree holds. O(capacity)."""
        return self._owners.tree_indices()


class TokenKVAllocator(_OwnerMethods):
    """Token indices 0..size-1, one at a time (page size 1).

    Invariant: available_size() + (indices held by callers) == capacity.
    Every method either succeeds or raises leaving the allocator unchanged.
    """

    __slots__ = ("_free", "_owners")

    def __init__(self, size: int) -> None:
        self._free = FreeStack(as_positive(size, "size"), "index")
        # The free list's flags are the owner map (FREE = 1, REQUEST = 0, TREE = 2).
        self._owners = SlotOwners(self._free._flags)

    @property
    def capacity(self) -> int:
        """Total number of indices. Pure."""
        return self._free.size

    def available_size(self) -> int:
        """Number of free indices. Pure."""
        return self._free.available()

    def is_free(self, i: int) -> bool:
        """Whether index `i` is free. Pure; ValueError if out of range."""
        i = as_int(i, "i")
        if not 0 <= i < self.capacity:
            raise ValueError(f"i: {i} is out of range [0, {self.capacity})")
        return self._free.is_free(i)

    def alloc(self, n: int) -> array[int] | None:
        """Take `n` free indices, returned as a new `array('q')` the caller
        owns; `n == 0` gives an empty array. Returns None and changes nothing
        when fewer than `n` are free. Mutates on success."""
        return self._free.alloc(as_count(n, "n"))

    def free(self, indices: Iterable[int]) -> None:
        """Return `indices` (any iterable of ints; not mutated) to the pool.

        Raises ValueError and frees nothing if any index is out of range,
        repeated within the call, or already free."""
        self._free.free(as_index_array(indices, "indices"), "indices")

    def check_invariants(self) -> None:
        """O(capacity) self-check; raises RuntimeError on corruption. Pure."""
        self._free.check_invariants()

    def __repr__(self) -> str:
        return f"TokenKVAllocator(capacity={self.capacity}, available={self.available_size()})"


class PagedKVAllocator(_OwnerMethods):
    """Token indices 0..size-1 grouped in pages of `page_size` consecutive
    indices; page p holds p*page_size .. p*page_size + page_size - 1.

    Memory is taken and given back a whole page at a time; `available_size`
    counts tokens on free pages. A request's last page may be partly used:
    `alloc_extend` fills its tail before taking new pages.
    Every method either succeeds or raises leaving the allocator unchanged.
    """

    __slots__ = ("_pages", "_page_size", "_owners", "_fills")

    def __init__(self, size: int, page_size: int) -> None:
        size = as_positive(size, "size")
        page_size = as_positive(page_size, "page_size")
        if size % page_size:
            raise ValueError(f"size ({size}) must be a multiple of page_size ({page_size})")
        self._page_size = page_size
        self._pages = FreeStack(size // page_size, "page")
        self._owners = SlotOwners(bytearray((FREE,)) * size)
        self._fills = {v: bytearray((v,)) * page_size for v in (FREE, REQUEST)}

    @property
    def capacity(self) -> int:
        """Total number of token indices. Pure."""
        return self._pages.size * self._page_size

    @property
    def page_size(self) -> int:
        return self._page_size

    @property
    def num_pages(self) -> int:
        return self._pages.size

    def available_size(self) -> int:
        """Number of free token indices (free pages x page_size). Pure."""
        return self._pages.available() * self._page_size

    def is_free(self, i: int) -> bool:
        """Whether the page holding token index `i` is free. Pure."""
        i = self._check_index(i, "i")
        return self._pages.is_free(i // self._page_size)

    def alloc(self, n: int) -> array[int] | None:
        """Take `n // page_size` whole free pages and return all their token
        indices, page by page, as a new `array('q')`. `n` must be a multiple
        of page_size (ValueError). Returns None and changes nothing when too
        few pages are free. Mutates on success."""
        n = as_count(n, "n")
        if n % self._page_size:
            raise ValueError(f"n ({n}) must be a multiple of page_size ({self._page_size})")
        pages = self._pages.alloc(n // self._page_size)
        if pages is None:
            return None
        self._mark_pages(pages, REQUEST)
        return self._expand(pages)

    def alloc_extend(self, last_index: int | None, n: int) -> array[int] | None:
        """Indices for `n` more tokens of a request whose last token sits at
        `last_index` (None for a request with no tokens yet).

        The request owns the page of `last_index`, and the positions after it
        on that page are unused: they come first (no allocation), then whole
        new pages, of which only the first indices needed are returned (the
        rest of the last new page stays reserved for the request's next
        tokens). Returns None and changes nothing when too few pages are free;
        ValueError when `last_index` is out of range or on a free page.
        Mutates on success (only when new pages are needed)."""
        n = as_count(n, "n")
        ps = self._page_size
        if last_index is None:
            start, tail = 0, 0
        else:
            last = self._check_index(last_index, "last_index")
            if self._pages.is_free(last // ps):
                raise ValueError(f"last_index: {last} lies on page {last // ps}, which is free")
            start, tail = last + 1, ps - 1 - last % ps
        take = min(n, tail)
        need = n - take
        pages = self._pages.alloc(-(-need // ps))
        if pages is None:
            return None
        self._mark_pages(pages, REQUEST)
        out = array("q", range(start, start + take))
        new = self._expand(pages)
        del new[need:]
        out.extend(new)
        return out

    def free(self, indices: Iterable[int]) -> None:
        """Free every page that holds one of `indices` (any iterable of ints;
        not mutated). A page is freed whole even if only some of its indices
        are given, and once however many of its indices are given. Pages go
        back in order of first appearance (LIFO: the first is reused first).

        Raises ValueError and frees nothing if an index is out of range or
        lies on a page that is already free or holds an index of the tree."""
        idx = as_index_array(indices, "indices")
        check_in_range(idx, self.capacity, "indices")
        pages = self._pages_of(idx)
        self._check_not_tree(pages)
        self._pages.free(pages, "indices")
        self._mark_pages(pages, FREE)

    def check_invariants(self) -> None:
        """O(num_pages) self-check; raises RuntimeError on corruption. Pure."""
        self._pages.check_invariants()

    def _mark_pages(self, pages: array[int], value: int) -> None:
        """Every index of `pages` (valid) now has owner `value` (FREE or REQUEST)."""
        ps, owners = self._page_size, self._owners.owners
        if len(pages) * ps < VECTOR_MIN:
            fill = self._fills[value]
            for p in pages:
                owners[p * ps : p * ps + ps] = fill
        else:
            rows = np.frombuffer(owners, dtype=np.uint8).reshape(-1, ps)
            rows[np.frombuffer(pages, dtype=np.int64)] = value

    def _check_not_tree(self, pages: array[int]) -> None:
        """ValueError, naming the index, if the tree holds an index of `pages`."""
        ps, owners = self._page_size, self._owners
        if len(pages) * ps < VECTOR_MIN:
            for p in pages:
                at = owners.first_tree_held(p * ps, p * ps + ps)
                if at >= 0:
                    break
            else:
                return
        else:
            rows = np.frombuffer(owners.owners, dtype=np.uint8).reshape(-1, ps)
            hit = np.flatnonzero(rows[np.frombuffer(pages, dtype=np.int64)].ravel() == TREE)
            if not hit.size:
                return
            at = int(pages[int(hit[0]) // ps]) * ps + int(hit[0]) % ps
        raise ValueError(
            f"indices: index {at} is held by the radix tree: free only what it hands back"
        )

    def _check_index(self, value: object, name: str) -> int:
        i = as_int(value, name)
        if not 0 <= i < self.capacity:
            raise ValueError(f"{name}: {i} is out of range [0, {self.capacity})")
        return i

    def _expand(self, pages: array[int]) -> array[int]:
        """All token indices of `pages`, page by page. Pure."""
        ps = self._page_size
        if ps == 1:
            return pages
        out = array("q")
        if len(pages) * ps < VECTOR_MIN:
            for p in pages:
                out.extend(range(p * ps, p * ps + ps))
        else:
            first = np.frombuffer(pages, dtype=np.int64) * ps
            out.frombytes((first[:, None] + np.arange(ps, dtype=np.int64)).tobytes())
        return out

    def _pages_of(self, idx: array[int]) -> array[int]:
        """Unique page ids of (range-checked) `idx`, in first-seen order. Pure."""
        ps = self._page_size
        if len(idx) < VECTOR_MIN:
            pages = array("q", (i // ps for i in idx))
        else:
            # Indices usually come page by page: dropping runs in numpy keeps
            # first-seen order and leaves about len(idx) / ps ids to dedup.
            v = np.frombuffer(idx, dtype=np.int64) // ps
            pages = array("q")
            pages.frombytes(v[np.concatenate(([True], v[1:] != v[:-1]))].tobytes())
        return self._pages.unique(pages)

    def __repr__(self) -> str:
        return (
            f"PagedKVAllocator(capacity={self.capacity}, page_size={self._page_size}, "
            f"available={self.available_size()})"
        )
