"""`lifecycle.tiers` against a brute-force model, step by step (Hypothesis stateful test).

A real tree and `CacheManager` (small pools, so inserts evict) with the residency layer's
tracker attached and a sink that queues its actions, carried out as the engine does: the
queue is executed right after each eviction, before the device units are freed (a copy of
their "bytes"), but a write is reported done (`written`) only in a later step, so entries
stay in flight for a while. The "bytes" of a device unit are the token prefix it stands
for (a KV unit: the tokens to it; a state: the tokens it consumed), kept by the test.

Checked after every step, against the model (prefix tuples, no hashing):
* every entry the layer says is visible holds the bytes of its key: the prefix whose
  hash chain is the key (so nothing is ever labelled with another prefix);
* an entry in flight is never visible (publish after write);
* everything that ever left the device is visible, in flight, or was dropped by an LRU
  (or forgotten: a rule makes the store lose an object);
* `plan` lists exactly the depths the definition gives, computed here from prefixes;
* every KV index and state slot on the device holds its own path's prefix (restores
  included), `check_invariants()` and the device pools' conservation.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Hashable
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mambaradix.core.tree import MambaRadixCache
from mambaradix.lifecycle import CacheManager, lru_evictor
from mambaradix.lifecycle.tier_lru import ByteLRU, LowerTier
from mambaradix.lifecycle.tier_restore import restore
from mambaradix.lifecycle.tier_write import WritePolicy
from mambaradix.lifecycle.tiers import (
    HOST,
    STORE,
    Demote,
    Drop,
    Fetch,
    LowerTiers,
    Residency,
    TierTracker,
)
from mambaradix.pools import ReqToTokenTable, StateSlotAllocator, TokenKVAllocator

KV_BYTES, ST_BYTES = 1, 10
SEQS = st.lists(st.integers(0, 2), min_size=1, max_size=9)
Prefix = tuple[int, ...]


class NoStates:
    def copy(self, src: Any, dst: Any) -> None: ...
    def clear(self, slots: Any) -> None: ...


def key_hash(prefix: Prefix) -> int:
    """The chain hash of a prefix, from its definition: hash((h, unit)) from 0."""
    h = 0
    for u in prefix:
        h = hash((h, u))
    return h


class ResidencyMachine(RuleBasedStateMachine):
    WRITE = WritePolicy.WRITE_BACK

    def __init__(self) -> None:
        super().__init__()
        self.tree = MambaRadixCache(page_size=1)
        self.cache = CacheManager(
            self.tree, TokenKVAllocator(24), StateSlotAllocator(4), NoStates(),
            ReqToTokenTable(1, 32), evictor=self.evict,
        )  # fmt: skip
        host = LowerTier(HOST, 8 * KV_BYTES + 2 * ST_BYTES, kv_bytes=8 * KV_BYTES)
        store = LowerTier(STORE, 12 * KV_BYTES + 3 * ST_BYTES, kv_bytes=12 * KV_BYTES)
        self.queue: list[Any] = []
        self.tiers = LowerTiers(host, store, sink=self.queue.append)
        self.tracker = TierTracker(self.tiers, KV_BYTES, ST_BYTES, write=self.WRITE)
        self.res = Residency(self.tiers, self.tracker, page=1)
        self.tree.add_listener(self.tracker)
        self.device_kv: dict[int, Prefix] = {}  # KV index -> its bytes
        self.device_st: dict[int, Prefix] = {}  # state slot -> its bytes
        self.below: dict[tuple[str, Hashable], Prefix] = {}  # (tier, key) -> bytes written
        self.in_flight: set[tuple[str, Hashable]] = set()
        self.left: set[tuple[str, Prefix]] = set()  # ("kv"|"st", prefix) that left the device
        self.dropped: set[tuple[str, Hashable]] = set()
        self.copied: set[Hashable] = set()  # keys ever copied down from a device unit
        self.hits: dict[Prefix, int] = {}  # KV unit on the device -> hits (write-through)
        self.fetching: set[Hashable] = set()  # keys read from the store into the host
        self.fetches = 0
        self.read_ahead: set[Hashable] = set()  # keys ever read ahead into the host
        self.unbacked = 0  # bytes that left the device with no copy below (write-through)

    # ---------------------------------------------------------------- execution

    def evict(self, tree: MambaRadixCache, kv: int, states: int) -> Any:
        assert not self.queue  # write-through copies were carried out after each insert
        held = {k for (_, k) in self.below}
        result = lru_evictor(tree, kv, states)
        leaving = [("kv", self.device_kv[i]) for i in result.freed_kv]
        leaving += [("st", self.device_st[s]) for s in result.freed_states]
        self.left |= set(leaving)
        if self.WRITE is not WritePolicy.WRITE_BACK:  # no copy below: gone, counted
            self.unbacked += sum(
                KV_BYTES if kind == "kv" else ST_BYTES
                for kind, prefix in leaving
                if self.key_of(kind, prefix) not in held
            )
        self.execute()  # before the caller frees the units
        return result

    @staticmethod
    def key_of(kind: str, prefix: Prefix) -> tuple[Hashable, ...]:
        return ("kv", key_hash(prefix)) if kind == "kv" else ("st", key_hash(prefix), 0)

    def execute(self) -> None:
        while self.queue:
            a = self.queue.pop(0)
            if isinstance(a, Drop):
                self.below.pop((a.tier, a.key))
                self.in_flight.discard((a.tier, a.key))
                if a.tier == STORE:
                    self.dropped.add(a.key)
                continue
            if isinstance(a, Fetch):  # a prefetch: the store's bytes, read into the host
                self.below[(HOST, a.key)] = self.below[(STORE, a.key)]
                self.in_flight.add((HOST, a.key))
                self.fetching.add(a.key)
                self.read_ahead.add(a.key)
                self.fetches += 1
                continue
            assert isinstance(a, Demote)
            if a.source is None:  # host -> store
                data = self.below[(HOST, a.key)]
            else:
                data = (self.device_kv if a.key[0] == "kv" else self.device_st)[a.source]
                self.copied.add(a.key)
                if a.key[0] == "st":  # a state goes down only with the KV it depends on
                    held = {k for (_, k) in self.below} | {
                        self.key_of("kv", p) for p in self.device_kv.values()
                    }
                    assert all(self.key_of("kv", data[:i]) in held for i in range(1, len(data) + 1))
            self.below[(a.tier, a.key)] = data
            self.in_flight.add((a.tier, a.key))

    def on_device(self) -> set[tuple[str, Prefix]]:
        out = {("kv", p) for p in self.device_kv.values()}
        return out | {("st", p) for p in self.device_st.values()}

    # -------------------------------------------------------------------- rules

    @rule(seq=SEQS)
    def insert(self, seq: list[int]) -> None:
        m = self.tree.match_prefix(seq, read_only=True)
        n = len(seq) - m.prefix_len
        lock = self.tree.inc_lock_ref(m.node) if m.prefix_len else None
        self.cache.evict_kv_for(n)
        kv = self.cache.kv.alloc(n)
        slot = self.cache.alloc_slot() if kv is not None else None
        if lock is not None:
            self.tree.dec_lock_ref(lock)
        if kv is None or slot is None:
            if kv is not None:
                self.cache.kv.free(kv)
            return
        self.sync_freed()
        for i, index in enumerate(kv):
            self.set_unit(index, tuple(seq[: m.prefix_len + i + 1]))
        self.device_st[slot] = tuple(seq)
        r = self.tree.insert(seq, array("q", m.kv_indices) + kv, slot, m.prefix_len)
        self.execute()  # write-through copies, before any unit is freed
        self.free(r.freed_kv, [slot] if r.state_existed else [])

    @rule(seq=SEQS)
    def admit(self, seq: list[int]) -> None:
        """A request admitted on its device match: a hit on every node of the path."""
        m = self.tree.match_prefix(seq, read_only=True)
        self.res.hit(m.node)
        self.execute()
        for i in range(1, m.prefix_len + 1):
            self.hits[tuple(seq[:i])] += 1

    @rule(n=st.integers(1, 3))
    def evict_states(self, n: int) -> None:
        self.cache.evict_states_for(self.cache.slots.available_size() + n)
        self.sync_freed()

    @rule()
    def complete_writes(self) -> None:
        for tier, key in sorted(self.in_flight, key=repr):
            if tier == HOST and key in self.fetching:
                self.tiers.fetched(key, True)
            else:
                self.tiers.written(key, tier)
        self.in_flight.clear()
        self.fetching.clear()

    @rule(seq=SEQS)
    def prefetch(self, seq: list[int]) -> None:
        """What a load of `seq`'s deepest usable prefix would read from the store is
        read into the host ahead (the engine's `prefetch`)."""
        m = self.tree.match_prefix(seq, read_only=True)
        cands = self.res.plan(seq, m.prefix_len, m.kv_hit_len)
        if cands:
            p = self.res.restore_plan(seq, cands[-1].depth, m.kv_hit_len)
            for key, tier in [(k, t) for _, k, t in p.kv] + p.state:
                if tier == STORE:
                    self.tiers.fetch(key, KV_BYTES if key[0] == "kv" else ST_BYTES)
        self.execute()

    @rule(pick=st.integers(0, 50))
    def a_prefetch_misses(self, pick: int) -> None:
        """A prefetch read found the object corrupt: the host entry goes."""
        keys = sorted(self.fetching, key=repr)
        if keys:
            key = keys[pick % len(keys)]
            self.tiers.fetched(key, False)
            del self.below[(HOST, key)]
            self.in_flight.discard((HOST, key))
            self.fetching.discard(key)
            self.dropped.add(key)

    @rule(pick=st.integers(0, 50))
    def store_loses_an_entry(self, pick: int) -> None:
        """The store lost an object (a corrupt file): the caller forgets the key."""
        held = sorted((k for t, k in self.below if t == STORE), key=repr)
        if held:
            key = held[pick % len(held)]
            self.tiers.forget(key, STORE)
            del self.below[(STORE, key)]
            self.in_flight.discard((STORE, key))
            self.dropped.add(key)

    @rule(seq=SEQS)
    def lookup_and_restore(self, seq: list[int]) -> None:
        m = self.tree.match_prefix(seq, read_only=True)
        got = [c.depth for c in self.res.plan(seq, m.prefix_len, m.kv_hit_len)]
        assert got == self.brute_force_plan(seq, m.prefix_len, m.kv_hit_len)
        if not got:
            return

        def load(start: int, kv_on_device: int, kv: Any, slot: int) -> bool:
            p = self.res.restore_plan(seq, got[-1], kv_on_device)
            for i, key, tier in p.kv:
                self.set_unit(kv[i - start], self.below[(tier, key)])
            ((key, tier),) = p.state
            self.device_st[slot] = self.below[(tier, key)]
            return True

        m = self.tree.match_prefix(seq, read_only=True)
        pins = self.res.pin(self.res.restore_plan(seq, got[-1], m.kv_hit_len))  # host locks
        done = restore(self.cache, seq, None, got[-1], self.res.usable, load)
        self.res.unpin(pins)
        self.execute()  # write-through copies of what the insert added
        self.sync_freed()  # restore gave back the duplicates it did not insert
        if done is not None:
            assert done.result.node is not None
            self.res.restored(done.result.node, got[-1], seq)
            self.res.touch(seq, got[-1])
            m = self.tree.match_prefix(seq, read_only=True)  # the device has it now
            assert m.prefix_len >= got[-1]
            again = [c.depth for c in self.res.plan(seq, m.prefix_len, m.kv_hit_len)]
            assert again == self.brute_force_plan(seq, m.prefix_len, m.kv_hit_len)

    def free(self, kv: Any, slots: list[int]) -> None:
        for i in kv:
            self.drop_unit(i)
        self.cache.kv.free(kv)
        for s in slots:
            del self.device_st[s]
        self.cache.slots.free(slots)

    def sync_freed(self) -> None:
        """Forget the bytes of units the pools got back."""
        for i in [i for i in self.device_kv if self.cache.kv.is_free(i)]:
            self.drop_unit(i)
        for s in [s for s in self.device_st if self.cache.slots.is_free(s)]:
            del self.device_st[s]

    def set_unit(self, index: int, prefix: Prefix) -> None:
        """Device KV unit `index` now holds `prefix` (an index the pools freed and gave
        out again in one rule was never seen free: its old bytes go first)."""
        if index in self.device_kv:
            self.drop_unit(index)
        self.device_kv[index] = prefix
        self.hits.setdefault(prefix, 1)  # added: its first hit

    def drop_unit(self, index: int) -> None:
        prefix = self.device_kv.pop(index)
        if prefix not in self.device_kv.values():  # not a duplicate the insert freed
            self.hits.pop(prefix, None)

    # ----------------------------------------------------------------- the model

    def visible(self, kind: str, prefix: Prefix) -> bool:
        key = ("kv", key_hash(prefix)) if kind == "kv" else ("st", key_hash(prefix), 0)
        return any(
            (t, key) in self.below and (t, key) not in self.in_flight
            and self.below[(t, key)] == prefix for t in (HOST, STORE)
        )  # fmt: skip

    def brute_force_plan(self, seq: list[int], start: int, kv_on_device: int) -> list[int]:
        out = []
        for d in range(start + 1, len(seq) + 1):
            kv_ok = all(self.visible("kv", tuple(seq[:i])) for i in range(kv_on_device + 1, d + 1))
            if kv_ok and self.visible("st", tuple(seq[:d])):
                out.append(d)
        return out

    @invariant()
    def layer_matches_the_model(self) -> None:
        assert not self.queue
        for t in (self.tiers.host, self.tiers.store):  # pinned: exactly the reads ahead
            assert {k for lru in t.distinct() for k in lru.pins} == self.fetching
        self.res.check_invariants()
        for (tier, key), data in self.below.items():
            shown = self.tiers.where(key) is not None
            want = ("kv", key_hash(data)) if key[0] == "kv" else ("st", key_hash(data), 0)
            assert key == want  # the bytes under a key are that key's prefix
            if (tier, key) in self.in_flight:
                other = HOST if tier == STORE else STORE
                assert not shown or ((other, key) in self.below and (other, key) not in
                                     self.in_flight)  # fmt: skip
            else:
                assert shown
        held = {k for (_, k) in self.below}
        for kind, prefix in self.left:  # conservation: below, dropped, back, or counted gone
            key = self.key_of(kind, prefix)
            assert (
                key in held or key in self.dropped or (kind, prefix) in self.on_device()
                or (self.WRITE is not WritePolicy.WRITE_BACK and key not in self.copied)
            )  # fmt: skip
        assert self.tiers.stats.unbacked_bytes == self.unbacked
        if self.WRITE is not WritePolicy.WRITE_BACK:  # hit often enough: went down
            need = 1 if self.WRITE is WritePolicy.WRITE_THROUGH else 2
            for kind, prefix in self.on_device():
                key = self.key_of(kind, prefix)
                if self.hits[prefix] >= need:  # copied, or read ahead into the host
                    went = key in self.copied or key in self.read_ahead
                    assert went and (key in held or key in self.dropped)

    @invariant()
    def device_holds_its_paths(self) -> None:
        self.cache.check_conservation()
        self.tree.check_invariants()
        stack = [(self.tree.root, ())]
        while stack:
            node, prefix = stack.pop()
            for child in node.children.values():
                path = prefix + tuple(child.key)
                for i, index in enumerate(child.value):
                    assert self.device_kv[index] == path[: len(prefix) + i + 1]
                if child.state is not None:
                    assert self.device_st[child.state] == path
                stack.append((child, path))


class WriteThrough(ResidencyMachine):
    WRITE = WritePolicy.WRITE_THROUGH


class WriteThroughSelective(ResidencyMachine):
    WRITE = WritePolicy.WRITE_THROUGH_SELECTIVE


class LongerRuns(ResidencyMachine):
    pass


class LongerRunsThrough(WriteThrough):
    pass


class LongerRunsSelective(WriteThroughSelective):
    pass


for machine in (ResidencyMachine, WriteThrough, WriteThroughSelective):
    machine.TestCase.settings = settings(max_examples=50, stateful_step_count=40, deadline=None)
for machine in (LongerRuns, LongerRunsThrough, LongerRunsSelective):
    machine.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
test_residency_against_a_brute_force_model = ResidencyMachine.TestCase
test_residency_write_through = WriteThrough.TestCase
test_residency_write_through_selective = WriteThroughSelective.TestCase
test_residency_against_a_brute_force_model_longer = pytest.mark.slow(LongerRuns.TestCase)
test_residency_write_through_longer = pytest.mark.slow(LongerRunsThrough.TestCase)
test_residency_write_through_selective_longer = pytest.mark.slow(LongerRunsSelective.TestCase)


STEPS = ["insert", "prefetch", "complete"] * 3 + ["admit", "restore", "miss", "evict", "lose"]


@pytest.mark.parametrize("machine", [ResidencyMachine, WriteThrough, WriteThroughSelective])
def test_long_random_walks_with_reads_ahead(machine: type[ResidencyMachine]) -> None:
    """The machine's rules in long seeded walks (Hypothesis' short runs seldom fill the
    store enough for a read ahead), every invariant after every step."""
    fetches = 0
    for seed in range(6):
        rng, m = random.Random(seed), machine()
        for _ in range(300):
            seq = [rng.randrange(3) for _ in range(rng.randrange(1, 10))]
            step = rng.choice(STEPS)
            if step == "insert":
                m.insert(seq)
            elif step == "prefetch":
                m.prefetch(seq)
            elif step == "complete":
                m.complete_writes()
            elif step == "admit":
                m.admit(seq)
            elif step == "restore":
                m.lookup_and_restore(seq)
            elif step == "miss":
                m.a_prefetch_misses(rng.randrange(50))
            elif step == "evict":
                m.evict_states(rng.randrange(1, 4))
            else:
                m.store_loses_an_entry(rng.randrange(50))
            m.layer_matches_the_model()
            m.device_holds_its_paths()
        fetches += m.fetches
    # the walks read ahead (selective copies little down, so its store seldom serves)
    assert fetches >= (1 if machine is WriteThroughSelective else 10)


def test_a_pinned_entry_is_passed_over_by_eviction() -> None:
    """By hand: a, b, c of 4 bytes in 12; a pinned; d evicts b (the least recent unpinned),
    not a; with every entry pinned a new one passes through and nothing is evicted."""
    lru = ByteLRU(12)
    for k in "abc":
        assert lru.put(k, 4) == []
    lru.pin("a")
    assert lru.put("d", 4) == [("b", 4)]
    assert list(lru.entries) == ["a", "c", "d"]
    for k in "cd":
        lru.pin(k)
    assert lru.put("e", 4) == [("e", 4)] and list(lru.entries) == ["a", "c", "d"]
    lru.unpin("a")
    assert lru.put("e", 4) == [("a", 4)]
    with pytest.raises(ValueError, match="pinned"):
        lru.remove("c")
    lru.check()
