"""The write policies of the residency layer (`lifecycle.tier_write`), by hand: a tree of
page 1 with a tracker whose sink collects the actions, a host large enough for everything,
KV units of 1 byte and states of 10. After a given sequence of inserts, hits and evictions,
what has gone down to the host (and from which device unit) is written out here from the
policies' definitions, the keys computed from prefixes (`key_hash`, not the layer's
`chain`)."""

from __future__ import annotations

from array import array
from typing import Any

import pytest

from mambaradix.core.tree import MambaRadixCache
from mambaradix.lifecycle.tier_lru import LowerTier
from mambaradix.lifecycle.tier_write import WritePolicy, as_write_policy, write_threshold
from mambaradix.lifecycle.tiers import HOST, STORE, Demote, LowerTiers, Residency, TierTracker

BACK, THROUGH, SELECTIVE = (
    WritePolicy.WRITE_BACK,
    WritePolicy.WRITE_THROUGH,
    WritePolicy.WRITE_THROUGH_SELECTIVE,
)


def key_hash(prefix: list[int]) -> int:
    h = 0
    for u in prefix:
        h = hash((h, u))
    return h


def kv(prefix: list[int]) -> tuple[Any, ...]:
    return ("kv", key_hash(prefix))


def st(prefix: list[int]) -> tuple[Any, ...]:
    return ("st", key_hash(prefix), 0)


class Setup:
    def __init__(self, write: WritePolicy) -> None:
        self.actions: list[Any] = []
        host = LowerTier(HOST, 100 + 100, kv_bytes=100)
        self.tiers = LowerTiers(host, LowerTier(STORE, 0), sink=self.actions.append)
        self.res = Residency(self.tiers, TierTracker(self.tiers, 1, 10, write=write), page=1)
        self.tree = MambaRadixCache(page_size=1)
        self.tree.add_listener(self.res.tracker)

    def copies(self) -> list[tuple[Any, int | None]]:
        """(key, device unit) of every copy down since the last call; each published."""
        out = []
        for a in self.actions:
            assert isinstance(a, Demote) and a.tier == HOST
            self.tiers.written(a.key, a.tier)
            out.append((a.key, a.source))
        self.actions.clear()
        return out

    def host(self) -> set[Any]:
        return {k for lru in self.tiers.host.distinct() for k in lru.entries}

    def hit(self, key: list[int]) -> None:
        self.res.hit(self.tree.match_prefix(key, read_only=True).node)


def test_write_back_copies_only_what_the_device_lets_go_of() -> None:
    s = Setup(BACK)
    s.tree.insert([7, 8, 9], array("q", [20, 21, 22]), 5)
    s.hit([7, 8, 9])
    s.hit([7, 8, 9])
    assert s.copies() == []  # hits count for nothing
    s.tree.evict(kv_tokens=3)
    assert s.copies() == [
        (st([7, 8, 9]), 5), (kv([7]), 20), (kv([7, 8]), 21), (kv([7, 8, 9]), 22),
    ]  # fmt: skip
    assert s.tiers.stats.unbacked_bytes == 0


def test_write_through_copies_on_insert_and_eviction_only_drops() -> None:
    s = Setup(THROUGH)
    s.tree.insert([7, 8, 9], array("q", [20, 21, 22]), 5)
    assert s.copies() == [
        (kv([7]), 20),
        (kv([7, 8]), 21),
        (kv([7, 8, 9]), 22),
        (st([7, 8, 9]), 5),
    ]  # fmt: skip: the KV the state depends on goes first
    s.tree.insert([7, 8, 6], array("q", [20, 21, 23]), 6)  # a split at [7, 8]
    assert s.copies() == [(kv([7, 8, 6]), 23), (st([7, 8, 6]), 6)]
    s.tree.evict(kv_tokens=4)
    assert s.copies() == [] and s.tiers.stats.unbacked_bytes == 0
    assert s.host() == {kv([7]), kv([7, 8]), kv([7, 8, 9]), kv([7, 8, 6])} | {
        st([7, 8, 9]), st([7, 8, 6]),
    }  # fmt: skip
    plan = s.res.plan([7, 8, 9, 1], start=0, kv_on_device=0)
    assert [c.depth for c in plan] == [3]  # the host gives the whole prefix back


def test_write_through_selective_copies_a_node_on_its_second_hit() -> None:
    """SGLang's threshold 2: the insert that adds a node is its first hit; the second
    (a request admitted on it) copies it, state included; a node split off a copied one
    stays copied; a node never hit again goes unbacked when the device evicts it."""
    s = Setup(SELECTIVE)
    s.tree.insert([7, 8, 9], array("q", [20, 21, 22]), 5)
    assert s.copies() == []
    s.hit([7, 8, 9, 4])
    assert s.copies() == [
        (kv([7]), 20), (kv([7, 8]), 21), (kv([7, 8, 9]), 22), (st([7, 8, 9]), 5),
    ]  # fmt: skip
    s.hit([7, 8, 9])
    assert s.copies() == []  # copied once
    s.tree.insert([7, 8, 6], array("q", [20, 21, 23]), 6)  # [7, 8] split off: copied
    assert s.copies() == []  # the new leaf [6] has one hit
    s.tree.insert([7, 8], array("q", [20, 21]), 7)  # a state on the copied [7, 8]
    assert s.copies() == [(st([7, 8]), 7)]
    s.tree.insert([1, 2], array("q", [30, 31]), 8)
    s.tree.evict(kv_tokens=5)  # everything: [6] and [1, 2] were never copied
    assert s.copies() == []
    assert s.tiers.stats.unbacked_bytes == (1 + 10) + (2 + 10)
    assert s.host() == {kv([7]), kv([7, 8]), kv([7, 8, 9]), st([7, 8, 9]), st([7, 8])}


def test_a_hit_on_a_node_evicted_below_copies_nothing_new() -> None:
    """Write-through of a restored prefix whose copy is in the host: no second copy."""
    s = Setup(THROUGH)
    s.tree.insert([7, 8], array("q", [20, 21]), 5)
    assert len(s.copies()) == 3
    s.tree.evict(kv_tokens=2)
    s.tree.insert([7, 8], array("q", [40, 41]), 6)  # loaded back into other units
    assert s.copies() == []  # the host has every key already: they are touched
    assert s.tiers.host.used == 2 + 10


def test_policy_names_and_thresholds() -> None:
    assert [as_write_policy(x) for x in ("back", "through", "through-selective")] == [
        BACK, THROUGH, SELECTIVE,
    ]  # fmt: skip
    assert as_write_policy(THROUGH) is THROUGH
    assert [write_threshold(p) for p in (BACK, THROUGH, SELECTIVE)] == [None, 1, 2]
    assert write_threshold(SELECTIVE, 3) == 3
    with pytest.raises(ValueError, match="tier_write"):
        as_write_policy("write-through")
    with pytest.raises(ValueError, match="hits"):
        write_threshold(SELECTIVE, 0)
