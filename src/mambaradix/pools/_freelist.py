"""`FreeStack`: the one free-list every allocator in this package is built on.

It hands out ids 0..size-1 (token indices, pages, state slots, table rows).

    free stack (array('q'))            flags (bytearray, 1 = free)
    [ ... , 9, 8, 7 ]  <- top          id:  0 1 2 3 4 5 6 7 8 9
                                             0 0 0 0 0 0 0 1 1 1

Order is LIFO: `alloc(n)` pops the top n ids, `free(ids)` pushes ids back so
that the next `alloc(len(ids))` returns them in the order they were freed.
A fresh stack hands out 0, 1, 2, ... in ascending order.

A KV token allocator lends its flags to the radix tree as the KV slots' owner map
(`pools/ownership.py`): a flag of 2 marks an id the tree holds, which is neither free nor
freeable until the tree hands it back.

Speed: both operations are O(n) in the ids moved, never in the size. The
stack itself is only sliced, reversed and extended (all in C). Flags are read
and written in one of two ways, chosen per call by batch length:
  * short batches (< VECTOR_MIN ids; decode steps, single slots): C-level
    `map` loops over the bytearray, about 1 us fixed cost;
  * long batches (prefill, eviction): numpy views of the same buffers, a few
    us fixed cost but about 1 ns per id instead of about 150 ns.
"""

from __future__ import annotations

from array import array
from collections import deque
from itertools import repeat
from typing import NoReturn

import numpy as np
import numpy.typing as npt

from mambaradix.pools._checks import VECTOR_MIN

try:  # Cython's pure-Python mode (_freelist.pxd); the pure module needs no Cython at all
    import cython  # type: ignore[import-not-found, unused-ignore]
except ImportError:
    COMPILED = False
else:
    COMPILED = bool(cython.compiled)  # True only in the compiled build


def _reversed(ids: array[int]) -> array[int]:
    """`ids` reversed: in place when short, as a new array through numpy when
    long (array.reverse moves one item at a time, ~5 ns each)."""
    if len(ids) < VECTOR_MIN:
        ids.reverse()
        return ids
    out = array("q")
    out.frombytes(np.frombuffer(ids, dtype=np.int64)[::-1].tobytes())
    return out


class FreeStack:
    """LIFO free list of ids 0..size-1 with double-free detection.

    `noun` names the ids in error messages ("index", "page", "slot", "row").
    """

    __slots__ = ("_size", "_noun", "_stack", "_flags", "_scratch")

    def __init__(self, size: int, noun: str) -> None:
        self._size = size
        self._noun = noun
        # Top of the stack is the end of the array; 0 sits on top.
        self._stack = array("q", range(size - 1, -1, -1))
        self._flags = bytearray(b"\x01") * size
        # Id-indexed scratch for _first_repeat, made on first use.
        self._scratch: npt.NDArray[np.int64] | None = None

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
        if n == 1:  # a state slot, a row, a decode step's index: 3 in 4 calls
            i = stack.pop()
            self._flags[i] = 0
            return array("q", (i,))
        if n == 0:
            return array("q")
        cut = len(stack) - n
        out = _reversed(stack[cut:])
        del stack[cut:]
        self._set_flags(out, 0)
        return out

    def free(self, ids: array[int], what: str) -> None:
        """Push `ids` back (may reverse `ids` in place; pass a copy).

        Raises ValueError, changing nothing, if an id is out of range, is
        already free, or appears twice in `ids`. `what` names the argument in
        messages."""
        if len(ids) == 1:  # as below, for one id (3 in 4 calls)
            i = ids[0]
            if not 0 <= i < self._size or self._flags[i]:
                self._check_free_short(ids, what)  # raises, naming what is wrong
            self._flags[i] = 1
            self._stack.append(i)
            return
        if not ids:
            return
        if len(ids) >= VECTOR_MIN:
            self._check_free_long(ids, what)
            self._set_flags(ids, 1)
        elif not (COMPILED and _flag_freed_in_place(self._flags, ids, self._size)):
            self._check_free_short(ids, what)
            self._set_flags(ids, 1)
        # Reversed, so that the next alloc returns them in the order given.
        self._stack.extend(_reversed(ids))

    def unique(self, ids: array[int]) -> array[int]:
        """`ids` (all in range) without repeats, in first-seen order; `ids`
        itself when it has none. Pure (apart from scratch space)."""
        if len(ids) >= VECTOR_MIN and self._first_repeat(np.frombuffer(ids, np.int64)) is None:
            return ids
        return array("q", dict.fromkeys(ids))

    def check_invariants(self) -> None:
        """O(size) self-check; raises `RuntimeError` on corruption. Pure."""
        stack, flags = self._stack, self._flags
        if len(set(stack)) != len(stack):
            raise RuntimeError(f"free {self._noun} stack holds duplicates")
        if flags.count(1) != len(stack):
            raise RuntimeError(
                f"{flags.count(1)} {self._noun}s flagged free but {len(stack)} on the stack"
            )
        for i in stack:
            if not 0 <= i < self._size or flags[i] != 1:
                raise RuntimeError(f"{self._noun} {i} on the free stack but not flagged free")

    def _set_flags(self, ids: array[int], value: int) -> None:
        """flags[i] = value for every i in ids (valid, checked). Mutates flags."""
        if len(ids) == 1:  # a state slot, a row, a decode step's index
            self._flags[ids[0]] = value
        elif COMPILED and len(ids) < VECTOR_MIN and set_in_place(self._flags, ids, value):
            pass
        elif len(ids) < VECTOR_MIN:
            # A zero-length deque drains the map in C: no bytecode per id.
            deque(map(self._flags.__setitem__, ids, repeat(value, len(ids))), maxlen=0)
        else:
            np.frombuffer(self._flags, dtype=np.uint8)[np.frombuffer(ids, dtype=np.int64)] = value

    def _check_free_short(self, ids: array[int], what: str) -> None:
        if len(ids) == 1:  # the checks below, for one id
            i = ids[0]
            self._check_bounds(i, i, what)
            if self._flags[i]:
                self._raise_not_held(i, what)
            return
        lo, hi = min(ids), max(ids)
        self._check_bounds(lo, hi, what)
        flags = self._flags
        if any(map(flags.__getitem__, ids)):
            self._raise_not_held(next(i for i in ids if flags[i]), what)
        if len(set(ids)) != len(ids):
            seen: set[int] = set()
            for i in ids:
                if i in seen:
                    self._raise_repeated(i, what)
                seen.add(i)

    def _check_free_long(self, ids: array[int], what: str) -> None:
        v = np.frombuffer(ids, dtype=np.int64)
        self._check_bounds(int(v.min()), int(v.max()), what)
        hit = np.flatnonzero(np.frombuffer(self._flags, dtype=np.uint8)[v])
        if hit.size:
            self._raise_not_held(int(v[hit[0]]), what)
        repeat_at = self._first_repeat(v)
        if repeat_at is not None:
            self._raise_repeated(repeat_at, what)

    def _first_repeat(self, v: npt.NDArray[np.int64]) -> int | None:
        """Some id that occurs more than once in `v` (ids in range), or None.

        O(n), no sort: scatter each position into a scratch array indexed by
        id, then gather back. Every repeated id keeps only one of its
        positions (which one numpy does not promise, and this does not need),
        so at least one of its occurrences reads back a different position."""
        if self._scratch is None:
            self._scratch = np.empty(self._size, dtype=np.int64)
        pos = np.arange(v.size, dtype=np.int64)
        self._scratch[v] = pos
        bad = np.flatnonzero(self._scratch[v] != pos)
        return int(v[bad[0]]) if bad.size else None

    def _check_bounds(self, lo: int, hi: int, what: str) -> None:
        if lo < 0 or hi >= self._size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{what}: {bad} is out of range [0, {self._size})")

    def _raise_not_held(self, i: int, what: str) -> NoReturn:
        if self._flags[i] == 2:  # see the module docstring
            raise ValueError(
                f"{what}: {self._noun} {i} is held by the radix tree: free only what it hands back"
            )
        raise ValueError(f"{what}: {self._noun} {i} is already free (double free?)")

    def _raise_repeated(self, i: int, what: str) -> NoReturn:
        raise ValueError(f"{what}: {self._noun} {i} appears more than once")


# The compiled build's loops (_freelist.pxd types the buffers as C pointers): one pass over
# a short batch in C, where the pure build makes several C-level passes through `map`
# (docs/build.md, "The pools: free list and owner map"). Called only when COMPILED.


def _flag_freed_in_place(flags: bytearray, ids: array[int], size: int) -> bool:
    """Flag every id of `ids` free (1) when each is in [0, size), flagged 0 (held) and given
    once; otherwise change nothing and return False (the caller's checks then say why).
    A repeated id finds the 1 its first occurrence wrote."""
    if ids.typecode != "q":
        return False
    fp, ip, n = flags, ids.data.as_longlongs, len(ids)  # type: ignore[attr-defined]
    k = 0
    while k < n:
        i = ip[k]
        if i < 0 or i >= size or fp[i] != 0:
            break
        fp[i] = 1
        k += 1
    if k == n:
        return True
    while k > 0:  # undo: every id flagged here was 0
        k -= 1
        fp[ip[k]] = 0
    return False


def set_in_place(flags: bytearray, ids: array[int], value: int) -> bool:
    """flags[i] = value for every i of `ids`; False, changing nothing, if one is out of
    range or `ids` is not int64 (then the caller's pure path does what it does; from the
    stack's own callers, never: a guard, not a check). Also the owner map's release
    (ownership.py)."""
    if ids.typecode != "q":
        return False
    fp, ip, n, size = flags, ids.data.as_longlongs, len(ids), len(flags)  # type: ignore[attr-defined]
    for k in range(n):
        if ip[k] < 0 or ip[k] >= size:
            return False
    for k in range(n):
        fp[ip[k]] = value
    return True
