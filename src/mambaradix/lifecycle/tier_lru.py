"""Byte-sized LRUs for the lower tiers (host L2, store L3) of `lifecycle.tiers`.

An entry is a content key (`("kv", h)`: one unit of KV whose prefix hashes to `h`;
`("st", h, g)`: group `g` of the state at the end of prefix `h`) with its bytes. A tier
is one LRU (KV and states share its bytes) or two (SGLang HiCache's KV pool and state
pool). An entry may be pinned while a load reads it (a host lock, as the device tree
locks what a request uses): eviction passes over it. Invariants (`check`): the bytes held
equal the sum of the entries' bytes and never exceed the capacity; pinned keys are held.
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
        self.pins: dict[Hashable, int] = {}  # key -> pin count: never evicted while pinned

    def __contains__(self, key: Hashable) -> bool:
        return key in self.entries

    def touch(self, key: Hashable) -> None:
        self.entries.move_to_end(key)

    def remove(self, key: Hashable) -> None:
        """Forget `key` (KeyError if absent; ValueError if pinned)."""
        if key in self.pins:
            raise ValueError(f"{key!r} is pinned")
        self.used -= self.entries.pop(key)

    def pin(self, key: Hashable) -> None:
        """Keep `key` (held) until as many `unpin`s: a load is reading it."""
        if key not in self.entries:
            raise KeyError(key)
        self.pins[key] = self.pins.get(key, 0) + 1

    def pinned(self, key: Hashable) -> bool:
        return key in self.pins

    def unpin(self, key: Hashable) -> None:
        n = self.pins[key] - 1
        if n:
            self.pins[key] = n
        else:
            del self.pins[key]

    def put(self, key: Hashable, nbytes: int) -> list[Entry]:
        """Hold `key` as the most recent entry; returns what no longer fits (the least
        recent entries, or the new one itself when it is larger than the capacity)."""
        if key in self.entries:
            self.touch(key)
            return []
        if nbytes > self.capacity:
            return [(key, nbytes)]
        if self.pins:
            return self._put_around_pins(key, nbytes)
        out: list[Entry] = []
        while self.used + nbytes > self.capacity:
            old, size = self.entries.popitem(last=False)
            self.used -= size
            out.append((old, size))
        self.entries[key] = nbytes
        self.used += nbytes
        self.peak = max(self.peak, self.used)
        return out

    def _put_around_pins(self, key: Hashable, nbytes: int) -> list[Entry]:
        """`put` when some entries are pinned: the least recent unpinned ones make room;
        if they cannot, the new entry passes through and nothing is evicted."""
        victims, room = [], self.capacity - self.used
        for old, size in self.entries.items():
            if room >= nbytes:
                break
            if old not in self.pins:
                victims.append((old, size))
                room += size
        if room < nbytes:
            return [(key, nbytes)]
        for old, size in victims:
            del self.entries[old]
            self.used -= size
        self.entries[key] = nbytes
        self.used += nbytes
        self.peak = max(self.peak, self.used)
        return victims

    def check(self) -> None:
        if any(k not in self.entries for k in self.pins):
            raise AssertionError("a pinned key is not held")
        held = sum(self.entries.values())
        if held != self.used:
            raise AssertionError(f"LRU counts {self.used} bytes, its entries hold {held}")
        if self.used > self.capacity:
            raise AssertionError(f"LRU holds {self.used} bytes over its {self.capacity}")


class LowerTier:
    """One tier: a shared LRU, or a KV LRU and a state LRU (`kv_share` of the bytes)."""

    def __init__(
        self, name: str, capacity: int, kv_share: float | None = None, kv_bytes: int | None = None
    ) -> None:
        """`kv_share` of `capacity` for KV (None: one shared LRU), or exactly `kv_bytes`
        (the engine's host pools: KV tokens x bytes, the rest state slots x bytes)."""
        self.name, self.capacity = name, capacity
        if kv_share is None and kv_bytes is None:
            shared = ByteLRU(capacity)
            self.lrus = {"kv": shared, "st": shared}
        else:
            kv = int(capacity * kv_share) if kv_bytes is None else kv_bytes  # type: ignore[operator]
            self.lrus = {"kv": ByteLRU(kv), "st": ByteLRU(capacity - kv)}

    def __contains__(self, key: tuple[Hashable, ...]) -> bool:
        return key in self.lrus[str(key[0])]

    def touch(self, key: tuple[Hashable, ...]) -> None:
        self.lrus[str(key[0])].touch(key)

    def put(self, key: tuple[Hashable, ...], nbytes: int) -> list[Entry]:
        return self.lrus[str(key[0])].put(key, nbytes)

    def remove(self, key: tuple[Hashable, ...]) -> None:
        self.lrus[str(key[0])].remove(key)

    def pin(self, key: tuple[Hashable, ...]) -> None:
        self.lrus[str(key[0])].pin(key)

    def unpin(self, key: tuple[Hashable, ...]) -> None:
        self.lrus[str(key[0])].unpin(key)

    def pinned(self, key: tuple[Hashable, ...]) -> bool:
        return self.lrus[str(key[0])].pinned(key)

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
