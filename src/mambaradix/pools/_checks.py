"""Argument checks shared by the pools. Each helper either returns a clean
value or raises `TypeError` / `ValueError` with a message; none mutates
anything, so a pool that calls them before changing state stays unchanged
when they raise."""

from __future__ import annotations

import operator
from array import array
from collections.abc import Iterable

import numpy as np

VECTOR_MIN = 64
"""Batches of at least this many ids are checked and moved with numpy (a few
us fixed cost, ~1 ns per id) instead of C-level builtins over the array
(~1 us fixed, ~50-150 ns per id); measured crossover is about 50."""


def as_int(value: object, name: str) -> int:
    """`value` as a plain `int` (numpy integers accepted, `bool` refused)."""
    if type(value) is int:  # the common case, first: called on every pool operation
        return value
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None


def as_count(value: object, name: str) -> int:
    """`value` as an int >= 0."""
    n = as_int(value, name)
    if n < 0:
        raise ValueError(f"{name} must be >= 0, got {n}")
    return n


def as_positive(value: object, name: str) -> int:
    """`value` as an int >= 1."""
    n = as_int(value, name)
    if n < 1:
        raise ValueError(f"{name} must be >= 1, got {n}")
    return n


def as_index_array(values: Iterable[int], name: str) -> array[int]:
    """A fresh `array('q')` copy of `values` (any iterable of ints, including
    `array('q')`, lists, numpy and torch integer arrays). The copy is the
    caller's to mutate."""
    if type(values) is array and values.typecode == "q":
        return array("q", values)  # a copy, without the checks an array('q') needs not
    if isinstance(values, (str, bytes, bytearray, memoryview)):
        # array('q', b"...") would silently reinterpret raw bytes.
        raise TypeError(f"{name} must be a sequence of ints, got {type(values).__name__}")
    try:
        return array("q", values)
    except TypeError:
        raise TypeError(
            f"{name} must be a sequence of ints, got {type(values).__name__} "
            "(or it holds a non-integer)"
        ) from None
    except OverflowError:
        raise ValueError(f"{name} holds a value outside the signed 64-bit range") from None


def check_in_range(idx: array[int], limit: int, name: str) -> None:
    """Raise `ValueError` unless every value of `idx` lies in [0, limit)."""
    if not idx:
        return
    if len(idx) < VECTOR_MIN:
        lo, hi = min(idx), max(idx)
    else:  # builtin min/max box every item (~50 ns each); numpy does not
        v = np.frombuffer(idx, dtype=np.int64)
        lo, hi = int(v.min()), int(v.max())
    if lo < 0 or hi >= limit:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{name}: {bad} is out of range [0, {limit})")


def check_unique(idx: array[int], name: str) -> None:
    """Raise `ValueError` when `idx` repeats a value."""
    if len(set(idx)) != len(idx):
        seen: set[int] = set()
        for i in idx:
            if i in seen:
                raise ValueError(f"{name}: {i} appears more than once")
            seen.add(i)
