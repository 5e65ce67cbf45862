"""Recurrent-state slots: who owns which slot (`StateSlotAllocator`), and a
pure-Python stand-in for the state contents (`FingerprintStatePool`).

A hybrid model keeps one fixed-size recurrent state per sequence instead of
per-token KV; the radix tree checkpoints such states in slots. The
fingerprint pool lets tests and the replay tool check, without torch, that a
slot holds the state of exactly the tokens it should: each slot stores a hash
of the token sequence it has consumed, and the hash is incremental, so

    fingerprint_of(a + b) == advance_fingerprint(fingerprint_of(a), b)
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from typing import ClassVar

from mambaradix.pools._checks import (
    as_count,
    as_index_array,
    as_int,
    as_positive,
    check_in_range,
    check_unique,
)
from mambaradix.pools._freelist import FreeStack
from mambaradix.pools.defaults import SlotPoolDefaults

__all__ = [
    "EMPTY_FINGERPRINT",
    "FingerprintStatePool",
    "StateSlotAllocator",
    "advance_fingerprint",
    "fingerprint_of",
]

_MOD = (1 << 61) - 1  # Mersenne prime modulus of the polynomial hash
_BASE = 0x1D8E_4E27_C47D_124F % _MOD  # fixed, so fingerprints are reproducible

EMPTY_FINGERPRINT = 0
"""Fingerprint of a slot that has consumed no tokens (a cleared slot)."""


def advance_fingerprint(fp: int, tokens: Iterable[int]) -> int:
    """The fingerprint after consuming `tokens` from a state with
    fingerprint `fp`: a polynomial rolling hash mod 2**61 - 1, O(len(tokens)).

    Token t enters as t + 1 so that token 0 still changes the hash. Pure."""
    toks = tokens if isinstance(tokens, array) and tokens.typecode == "q" else None
    if toks is None:
        toks = as_index_array(tokens, "tokens")
    h = as_int(fp, "fp")
    for t in toks:
        h = (h * _BASE + t + 1) % _MOD
    return h


def fingerprint_of(tokens: Iterable[int]) -> int:
    """Fingerprint of a state that consumed exactly `tokens`. Pure."""
    return advance_fingerprint(EMPTY_FINGERPRINT, tokens)


class StateSlotAllocator(SlotPoolDefaults):
    """State slots 0..size-1. LIFO like the KV allocators: the most recently
    freed slots are reused first; a fresh allocator hands out 0, 1, 2, ...

    Every method either succeeds or raises leaving the allocator unchanged.
    """

    __slots__ = ("_free",)

    def __init__(self, size: int) -> None:
        self._free = FreeStack(as_positive(size, "size"), "slot")

    @property
    def capacity(self) -> int:
        """Total number of slots. Pure."""
        return self._free.size

    def available_size(self) -> int:
        """Number of free slots. Pure."""
        return self._free.available()

    def is_free(self, slot: int) -> bool:
        """Whether `slot` is free. Pure; ValueError if out of range."""
        slot = as_int(slot, "slot")
        if not 0 <= slot < self.capacity:
            raise ValueError(f"slot: {slot} is out of range [0, {self.capacity})")
        return self._free.is_free(slot)

    def alloc(self, n: int) -> list[int] | None:
        """Take `n` free slots as a new list, or return None and change
        nothing when fewer than `n` are free. Mutates on success."""
        got = self._free.alloc(as_count(n, "n"))
        return None if got is None else got.tolist()

    def free(self, slots: Iterable[int]) -> None:
        """Return `slots` (not mutated) to the pool. Raises ValueError and
        frees nothing if a slot is out of range, repeated, or already free."""
        self._free.free(as_index_array(slots, "slots"), "slots")

    def check_invariants(self) -> None:
        """O(capacity) self-check; raises RuntimeError on corruption. Pure."""
        self._free.check_invariants()

    def __repr__(self) -> str:
        return f"StateSlotAllocator(capacity={self.capacity}, available={self.available_size()})"


class FingerprintStatePool:
    """Fingerprints standing in for recurrent states, one per slot 0..size-1.

    It only stores contents; which slots are in use is the allocator's
    business. All slots start EMPTY. Every method either succeeds or raises
    leaving the pool unchanged.
    """

    EMPTY: ClassVar[int] = EMPTY_FINGERPRINT

    __slots__ = ("_fp",)

    def __init__(self, size: int) -> None:
        self._fp = [EMPTY_FINGERPRINT] * as_positive(size, "size")

    @property
    def capacity(self) -> int:
        """Number of slots. Pure."""
        return len(self._fp)

    fingerprint_of = staticmethod(fingerprint_of)

    def fingerprint(self, slot: int) -> int:
        """Fingerprint currently held by `slot`. Pure."""
        return self._fp[self._check_slot(slot, "slot")]

    def advance(self, slot: int, tokens: Iterable[int]) -> int:
        """Fold `tokens` into `slot` (as a forward pass would update the
        state) and return the new fingerprint. Mutates `slot`."""
        slot = self._check_slot(slot, "slot")
        fp = advance_fingerprint(self._fp[slot], tokens)
        self._fp[slot] = fp
        return fp

    def copy(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """dst[k] <- src[k] for all k at once (all sources are read before any
        destination is written, so overlapping src/dst act like a batched
        gather then scatter). Lengths must match and `dst` must not repeat a
        slot (ValueError). Mutates the `dst` slots."""
        s, d = self._check_pairs(src, dst)
        values = [self._fp[i] for i in s]
        for i, v in zip(d, values, strict=True):
            self._fp[i] = v

    def clear(self, slots: Iterable[int]) -> None:
        """Reset `slots` to EMPTY (repeats allowed). Mutates those slots."""
        idx = as_index_array(slots, "slots")
        check_in_range(idx, len(self._fp), "slots")
        for i in idx:
            self._fp[i] = EMPTY_FINGERPRINT

    def _check_slot(self, value: object, name: str) -> int:
        slot = as_int(value, name)
        if not 0 <= slot < len(self._fp):
            raise ValueError(f"{name}: {slot} is out of range [0, {len(self._fp)})")
        return slot

    def _check_pairs(self, src: Iterable[int], dst: Iterable[int]) -> tuple[array[int], array[int]]:
        s = as_index_array(src, "src")
        d = as_index_array(dst, "dst")
        if len(s) != len(d):
            raise ValueError(f"src and dst differ in length ({len(s)} != {len(d)})")
        check_in_range(s, len(self._fp), "src")
        check_in_range(d, len(self._fp), "dst")
        check_unique(d, "dst")
        return s, d

    def __repr__(self) -> str:
        return f"FingerprintStatePool(capacity={self.capacity})"
