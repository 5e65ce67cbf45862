"""Token keys: conversion from caller input and common-prefix length.

Keys and KV indices are stored as `array('q')`: slicing is a memcpy and
equality of two arrays of one type is a memcmp, so a whole edge is compared in
one C call instead of a Python loop over tokens.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any

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
    """
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
