"""Byte-sized LRUs for the replay's lower tiers (host L2, store L3).

An entry is a content key (`("kv", h)`: one unit of KV whose prefix hashes to `h`;
`("st", h, g)`: group `g` of the state at the end of prefix `h`) with its bytes. A tier
is one LRU (KV and states share its bytes) or two (SGLang HiCache's KV pool and state
pool). Invariants (`check`): the bytes held equal the sum of the entries' bytes and
never exceed the capacity.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

Entry = tuple[Hashable, int]


class ByteLRU:
    """Entries with sizes, least recently used first, within `capacity` bytes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.peak = 0
        self.entries: OrderedDict[Hashable, int] = OrderedDict()

    def __contains__(self, key: Hashable) -> bool:
        return key in self.entries

    def touch(self, key: Hashable) -> None:
        self.entries.move_to_end(key)

    def put(self, key: Hashable, nbytes: int) -> list[Entry]:
        """Hold `key` as the most recent entry; returns what no longer fits (the least
        recent entries, or the new one itself when it is larger than the capacity)."""
        if key in self.entries:
            self.touch(key)
            return []
        if nbytes > self.capacity:
            return [(key, nbytes)]
        out: list[Entry] = []
        while self.used + nbytes > self.capacity:
            old, size = self.entries.popitem(last=False)
            self.used -= size
            out.append((old, size))
        self.entries[key] = nbytes
        self.used += nbytes
        self.peak = max(self.peak, self.used)
        return out

    def check(self) -> None:
        held = sum(self.entries.values())
        if held != self.used:
            raise AssertionError(f"LRU counts {self.used} bytes, its entries hold {held}")
        if self.used > self.capacity:
            raise AssertionError(f"LRU holds {self.used} bytes over its {self.capacity}")


class LowerTier:
    """One tier: a shared LRU, or a KV LRU and a state LRU (`kv_share` of the bytes)."""

    def __init__(self, name: str, capacity: int, kv_share: float | None = None) -> None:
        self.name, self.capacity = name, capacity
        if kv_share is None:
            shared = ByteLRU(capacity)
            self.lrus = {"kv": shared, "st": shared}
        else:
            kv_bytes = int(capacity * kv_share)
            self.lrus = {"kv": ByteLRU(kv_bytes), "st": ByteLRU(capacity - kv_bytes)}

    def __contains__(self, key: tuple[Hashable, ...]) -> bool:
        return key in self.lrus[str(key[0])]

    def touch(self, key: tuple[Hashable, ...]) -> None:
        self.lrus[str(key[0])].touch(key)

    def put(self, key: tuple[Hashable, ...], nbytes: int) -> list[Entry]:
        return self.lrus[str(key[0])].put(key, nbytes)

    def distinct(self) -> list[ByteLRU]:
        return list({id(x): x for x in self.lrus.values()}.values())

    @property
    def used(self) -> int:
        return sum(x.used for x in self.distinct())

    @property
    def peak(self) -> int:
        return sum(x.peak for x in self.distinct())

    def check(self) -> None:
        for lru in self.distinct():
            lru.check()
        if self.used > self.capacity:
            raise AssertionError(f"{self.name} holds {self.used} bytes over its {self.capacity}")
