"""`FreeStack`: the one free-list every allocator in this package is built on.

It hands out ids 0..size-1 (token indices, pages, state slots, table rows).

    free stack (array('q'))            flags (bytearray, 1 = free)
    [ ... , 9, 8, 7 ]  <- top          id:  0 1 2 3 4 5 6 7 8 9
                                             0 0 0 0 0 0 0 1 1 1

Order is LIFO: `alloc(n)` pops the top n ids, `free(ids)` pushes ids back so
that the next `alloc(len(ids))` returns them in the order they were freed.
A fresh stack hands out 0, 1, 2, ... in ascending order.

Speed: alloc is a slice, a reverse and a delete on the array (all in C).
free validates with C-level scans (`min`/`max`, `set`, `any(map(...))`) and
flips flags through `map` drained by a zero-length deque, so no Python
bytecode runs per id. Both are O(n) in the ids moved, never in the size.
"""

from __future__ import annotations

from array import array
from collections import deque
from itertools import repeat

from mambaradix.pools._checks import check_in_range, check_unique


def _set_flags(flags: bytearray, ids: array[int], value: int) -> None:
    """flags[i] = value for every i in ids, looping in C (deque drains map)."""
    deque(map(flags.__setitem__, ids, repeat(value, len(ids))), maxlen=0)


class FreeStack:
    """LIFO free list of ids 0..size-1 with double-free detection.

    `noun` names the ids in error messages ("index", "page", "slot", "row").
    """

    __slots__ = ("_size", "_noun", "_stack", "_flags")

    def __init__(self, size: int, noun: str) -> None:
        self._size = size
        self._noun = noun
        # Top of the stack is the end of the array; 0 sits on top.
        self._stack = array("q", range(size - 1, -1, -1))
        self._flags = bytearray(b"\x01") * size

    @property
    def size(self) -> int:
        return self._size

    def available(self) -> int:
        """Number of free ids. Pure."""
        return len(self._stack)

    def is_free(self, i: int) -> bool:
        """Whether id `i` (already range-checked by the caller) is free. Pure."""
        return self._flags[i] == 1

    def alloc(self, n: int) -> array[int] | None:
        """Pop `n` ids (n >= 0, checked by the caller) as a new `array('q')`,
        or return None and change nothing when fewer than n are free.
        Mutates the stack and flags on success."""
        stack = self._stack
        if n > len(stack):
            return None
        if n == 0:
            return array("q")
        cut = len(stack) - n
        out = stack[cut:]
        del stack[cut:]
        out.reverse()
        _set_flags(self._flags, out, 0)
        return out

    def free(self, ids: array[int], what: str) -> None:
        """Push `ids` back. `ids` is consumed (reversed in place); pass a copy.

        Raises ValueError, changing nothing, if an id is out of range, appears
        twice in `ids`, or is already free. `what` names the argument in
        messages."""
        if not ids:
            return
        check_in_range(ids, self._size, what)
        check_unique(ids, what)
        flags = self._flags
        if any(map(flags.__getitem__, ids)):
            first = next(i for i in ids if flags[i])
            raise ValueError(f"{what}: {self._noun} {first} is already free (double free?)")
        _set_flags(flags, ids, 1)
        ids.reverse()  # so the next alloc returns them in the order given
        self._stack.extend(ids)

    def check_invariants(self) -> None:
        """O(size) self-check; raises `RuntimeError` on corruption. Pure."""
        stack, flags = self._stack, self._flags
        if len(set(stack)) != len(stack):
            raise RuntimeError(f"free {self._noun} stack holds duplicates")
        if sum(flags) != len(stack):
            raise RuntimeError(
                f"{sum(flags)} {self._noun}s flagged free but {len(stack)} on the stack"
            )
        for i in stack:
            if not 0 <= i < self._size or not flags[i]:
                raise RuntimeError(f"{self._noun} {i} on the free stack but not flagged free")
