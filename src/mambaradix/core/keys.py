"""Token keys: conversion from caller input and common-prefix length.

Keys and KV indices are stored as `array('q')`: slicing is a memcpy and
equality of two arrays of one type is a memcmp, so a whole edge is compared in
one C call instead of a Python loop over tokens.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any

try:  # Cython's pure-Python mode (keys.pxd); the pure modules need no Cython at all
    import cython  # type: ignore[import-not-found, unused-ignore]
except ImportError:
    COMPILED = False
else:
    COMPILED = bool(cython.compiled)  # True only in the compiled build

EMPTY: array[int] = array("q")


def as_int_array(seq: Any, name: str) -> array[int]:
    """Return `seq` as an `array('q')` (the same object when it already is one).

    Raises TypeError with `name` in the message for anything that is not a
    sequence of ints (strings, floats, None, ...).
    """
    if isinstance(seq, array) and seq.typecode == "q":
        return seq
    if seq is None or isinstance(seq, (str, bytes, bytearray)) or not isinstance(seq, Iterable):
        raise TypeError(f"{name} must be a sequence of ints, got {type(seq).__name__}")
    if hasattr(seq, "tolist") and not isinstance(seq, array):
        seq = seq.tolist()  # numpy / torch: one C call instead of per-element boxing
    try:
        return array("q", seq)
    except (TypeError, OverflowError) as e:
        raise TypeError(f"{name} must be a sequence of 64-bit ints: {e}") from None


def check_hashable(value: Any, name: str) -> None:
    """TypeError naming `name` unless `value` hashes (a namespace key). Not
    isinstance(Hashable): a tuple holding a list is one, yet cannot hash."""
    try:
        hash(value)
    except TypeError:
        raise TypeError(f"{name} must be hashable, got {type(value).__name__}") from None


def common_prefix_len(edge: array[int], tokens: array[int], off: int) -> int:
    """Length of the common prefix of `edge` and `tokens[off:]`.

    One slice compare settles the common case (the whole edge matches); on a
    mismatch, doubling windows then bisection find it with O(log n) compares.
    The compiled build scans the two buffers in place instead (no slice copied).
    """
    if COMPILED:
        return _common_prefix_len_in_place(edge, tokens, off)
    n = min(len(edge), len(tokens) - off)
    if tokens[off : off + n] == (edge if n == len(edge) else edge[:n]):
        return n
    lo, hi, step = 0, n, 16  # the first mismatch lies in [lo, hi)
    while lo + step < hi:
        if tokens[off + lo : off + lo + step] != edge[lo : lo + step]:
            hi = lo + step
            break
        lo += step
        step *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tokens[off + lo : off + mid] == edge[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _common_prefix_len_in_place(edge: array[int], tokens: array[int], off: int) -> int:
    """`common_prefix_len` in the compiled build only (keys.pxd types both as
    `cpython.array`; typecode "q", as every key `as_int_array` makes)."""
    e, t = edge, tokens
    n = min(len(e), len(t) - off)
    if n <= 0:  # as the slices do (tokens[off:] empty): never with the tree's offsets
        return n if n + len(e) <= 0 else 0
    ep, tp = e.data.as_longlongs, t.data.as_longlongs  # type: ignore[attr-defined]
    i = 0
    while i < n and ep[i] == tp[off + i]:
        i += 1
    return i
