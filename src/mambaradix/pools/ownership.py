"""`SlotOwners`: one byte per KV slot saying who holds it, for the KV allocators.

    byte:  1 FREE      in the pool                 (alloc -> REQUEST)
           0 REQUEST   the caller's (a request's)  (free -> FREE, the tree's claim -> TREE)
           2 TREE      the radix tree's            (the tree's release -> REQUEST)

FREE = 1 and REQUEST = 0 are the `FreeStack` flags of a token allocator, so there the map is
the free list's own; a paged allocator keeps one beside its page flags. The tree asks
through `core.ownership.KVOwner` (`claim`, `release`), which the allocators implement
with this class: an insert may hand the tree only indices a request holds, once each.

Speed: as `FreeStack`, short batches go through C-level `map` over the bytearray, long
ones (>= VECTOR_MIN) through numpy views of it. A long run of consecutive indices (what an
allocator hands out for a prefill) is proven one by comparing its bytes with those of
the run (`is_run`), then checked and marked as one slice of the map.
"""

from __future__ import annotations

import sys
from array import array
from collections import deque
from itertools import repeat

import numpy as np

from mambaradix.pools._checks import VECTOR_MIN
from mambaradix.pools._freelist import set_in_place

try:  # Cython's pure-Python mode (ownership.pxd); the pure module needs no Cython at all
    import cython  # type: ignore[import-not-found, unused-ignore]
except ImportError:
    COMPILED = False
else:
    COMPILED = bool(cython.compiled)  # True only in the compiled build

FREE, REQUEST, TREE = 1, 0, 2
_TREE_BYTE = bytes((TREE,))

# range(65536) as 8-byte items: bytes 0-1 of every index of a 65536-aligned block.
_TEMPLATE = bytearray(array("q", range(1 << 16)).tobytes())
_COL = tuple(range(8)) if sys.byteorder == "little" else tuple(range(7, -1, -1))
_BYTE = [bytearray((c,)) for c in range(256)]  # bytearray: strided writes need no copy


_RUNS_MAX = 1 << 22  # 0, 1, 2, ... kept up to here (32 MiB at most, shared by all pools)
_runs = array("q")


def is_run(values: array[int], lo: int) -> bool:
    """Whether `values` == range(lo, lo + len(values)), for lo >= 0. Below _RUNS_MAX: one
    memcmp with a slice of 0, 1, 2, ... (made once per process, grown as needed). Above:
    byte compares with the run's bytes built block by block from a template (about 1 ns an
    index, where `array('q', range(...))` alone costs 30): the two low bytes come from the
    template, each non-zero higher byte (the same across a block) is written into its
    column."""
    global _runs
    n = len(values)
    if lo + n <= _RUNS_MAX:
        if lo + n > len(_runs):
            size = min(_RUNS_MAX, max(lo + n, 2 * len(_runs), 1 << 16))
            _runs = array("q", np.arange(size, dtype=np.int64).tobytes())
        return values == _runs[lo : lo + n]
    i = 0
    with memoryview(values) as view:
        while i < n:
            low = (lo + i) & 0xFFFF
            m = min(n - i, 0x10000 - low)
            want = _TEMPLATE[8 * low : 8 * (low + m)]
            high, k = (lo + i) >> 16, 2
            while high:
                if high & 255:
                    want[_COL[k] :: 8] = _BYTE[high & 255] * m
                high >>= 8
                k += 1
            if want != view[i : i + m]:
                return False
            i += m
    return True


class SlotOwners:
    """The KV side of `KVOwner` over `owners` (one byte per slot, see the module
    docstring)."""

    __slots__ = ("owners",)

    def __init__(self, owners: bytearray) -> None:
        self.owners = owners

    def claim(self, values: array[int], start: int, keep: int) -> bool:
        n = len(values) - start
        if n <= 0:
            return True
        if n < VECTOR_MIN:
            if COMPILED and 0 <= start <= keep and type(values) is array and values.typecode == "q":
                return _claim_in_place(self.owners, values, start, keep)
            return self._claim_short(values, start, keep)
        return self._claim_long(values, start, keep)

    def _claim_short(self, values: array[int], start: int, keep: int) -> bool:
        owners = self.owners
        if len(values) == 1 and start == keep == 0:  # the checks below, for one index
            i = values[0]
            if not 0 <= i < len(owners) or owners[i]:
                return False
            owners[i] = TREE
            return True
        part = values[start:] if start else values
        if min(part) < 0 or max(part) >= len(owners):
            return False
        if any(map(owners.__getitem__, part)) or len(set(part)) != len(part):
            return False  # not all REQUEST (0), or one index twice
        kept = values[keep:] if keep else values
        deque(map(owners.__setitem__, kept, repeat(TREE, len(kept))), maxlen=0)
        return True

    def _claim_long(self, values: array[int], start: int, keep: int) -> bool:
        owners, n = self.owners, len(values) - start
        lo = values[start]
        if lo >= 0 and lo + n <= len(owners) and values[-1] == lo + n - 1:
            part = values[start:] if start else values
            if is_run(part, lo):  # one run: a slice of the map
                if owners.count(REQUEST, lo, lo + n) != n:
                    return False
                owners[lo + keep - start : lo + n] = _TREE_BYTE * (len(values) - keep)
                return True
        v = np.frombuffer(values, dtype=np.int64)[start:]
        view = np.frombuffer(owners, dtype=np.uint8)
        ordered = np.sort(v)  # its ends bound it, repeats sit side by side (no scratch)
        if ordered[0] < 0 or ordered[-1] >= len(view) or view[ordered].any():
            return False
        if (ordered[1:] == ordered[:-1]).any():
            return False
        view[v[keep - start :]] = TREE
        return True

    def release(self, values: array[int]) -> None:
        if len(values) == 1:
            self.owners[values[0]] = REQUEST
            return
        short = len(values) < VECTOR_MIN
        compiled_loop = COMPILED and short and type(values) is array
        if compiled_loop and set_in_place(self.owners, values, REQUEST):
            return
        if short:
            owners = self.owners
            deque(map(owners.__setitem__, values, repeat(REQUEST, len(values))), maxlen=0)
            return
        lo, n = values[0], len(values)
        if lo >= 0 and lo + n <= _RUNS_MAX and values[-1] == lo + n - 1 and is_run(values, lo):
            self.owners[lo : lo + n] = bytes(n)  # one run, proven by a memcmp: one slice
            return
        view = np.frombuffer(self.owners, dtype=np.uint8)
        view[np.frombuffer(values, dtype=np.int64)] = REQUEST

    def held_by_tree(self, index: int) -> bool:
        return 0 <= index < len(self.owners) and self.owners[index] == TREE

    def refusal(self, index: int) -> str | None:
        if index >= len(self.owners):
            return f"is outside the KV pool [0, {len(self.owners)})"
        if self.owners[index] == FREE:
            return "is free in the KV pool: insert only indices a request holds (alloc them)"
        return None

    def tree_indices(self) -> set[int]:
        view = np.frombuffer(self.owners, dtype=np.uint8)
        return {int(i) for i in np.flatnonzero(view == TREE)}

    def first_tree_held(self, lo: int, hi: int) -> int:
        """The first slot in [lo, hi) the tree holds, or -1."""
        return self.owners.find(_TREE_BYTE, lo, hi)


# The compiled build's loops (ownership.pxd types the buffers as C pointers): one pass over
# a short batch in C, where the pure build makes several C-level passes through `map`
# (docs/build.md, "The pools: free list and owner map"). Called only when COMPILED.

_SEEN = 3  # a claim's mark on an index it has checked (a second occurrence is a repeat)


def _claim_in_place(owners: bytearray, values: array[int], start: int, keep: int) -> bool:
    """`SlotOwners._claim_short` for start <= keep, in one pass: every index of
    values[start:] in range, REQUEST and given once, else False and nothing changed."""
    op, vp, n, size = owners, values.data.as_longlongs, len(values), len(owners)  # type: ignore[attr-defined]
    request, tree, seen = REQUEST, TREE, _SEEN  # C constants in the loops (ownership.pxd)
    k = start
    while k < n:
        i = vp[k]
        if i < 0 or i >= size or op[i] != request:
            break
        op[i] = seen
        k += 1
    ok = k == n
    j = start
    while j < k:  # every index marked here was REQUEST
        op[vp[j]] = tree if ok and j >= keep else request
        j += 1
    return ok


__all__ = ["FREE", "REQUEST", "TREE", "SlotOwners", "is_run"]
