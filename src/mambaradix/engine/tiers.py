"""The engine's host tier (L2), and a store (L3) below it: state slots and KV tokens the
device tree lets go of are copied into host pools, what the host drops is written to the
store (`engine.tier_store`, optional), and a later request's prefix is loaded back.

The decisions are `lifecycle.tiers`' (the replay makes the same ones); this module carries
them out with bytes:

* demotion: the tree's eviction runs inside the cache manager's evictor; `HostTier`
  wraps it, so right after the tree let go of units, and before the manager frees them,
  the layer's actions are executed: a `Drop` frees the host unit of a key, a `Demote`
  takes a host unit and copies the device unit into it (`pools.transfer.Mover`, one copy
  per pool per eviction); the key becomes visible (`LowerTiers.written`) only after the
  copy has completed (publish after write); a `Demote` to the store writes the host copy
  (the pending host copies are finished first), visible once the store acknowledged it;
* loading: before a waiting request is matched (`TierLookup.before_match`), its prefix is
  looked up down the tier (`Residency.plan`), the deepest usable depth is restored through
  `lifecycle.tier_restore.restore`: device KV and a slot allocated, the host units and the
  store objects copied in and waited for, then the tree's `insert`; the match that follows
  finds it. A store miss (refused, lost or corrupt object) forgets the key and fails the
  load: the units it wrote to are freed, never inserted.

* prefetch (`prefetch_wait_s`): when a batch is submitted, what each prompt's load
  would read from the store is given host units (`LowerTiers.fetch`, pinned) and read into
  them on the store's worker thread; a match publishes the reads that finished, waiting at
  most `prefetch_wait_s` for the rest (a late one leaves the load to read the store);
  `generate` returns with every read done, `close` joins the worker.

Host units are owned by the layer's entries: one per visible or in-flight key, freed when
the host LRU drops the key (`check`: every host unit is free or held by exactly one key,
and the keys holding units are the host LRU's entries).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from mambaradix.engine.tier_store import StoreTier
from mambaradix.lifecycle import CacheManager, Evictor, Request
from mambaradix.lifecycle.tier_lru import LowerTier
from mambaradix.lifecycle.tier_restore import restore
from mambaradix.lifecycle.tier_write import WritePolicy
from mambaradix.lifecycle.tiers import (
    HOST,
    STORE,
    Action,
    Candidate,
    Demote,
    Drop,
    Fetch,
    Key,
    LowerTiers,
    Residency,
    TierTracker,
    cheapest,
)
from mambaradix.pools.host import HostKVPool, HostPool, HostStatePool, kv_group, state_group
from mambaradix.pools.transfer import Group, Mover, Transfer
from mambaradix.tiers.cost import LoadRule

__all__ = ["HostTier", "TierLookup"]


class HostTier:
    """Host state slots and host KV tokens below `mgr`'s tree (module docstring)."""

    def __init__(
        self,
        mgr: CacheManager,
        adapter: Any,
        state_slots: int,
        kv_tokens: int,
        device: Any,
        store: tuple[str | os.PathLike[str], int, str] | None = None,
        write: WritePolicy = WritePolicy.WRITE_BACK,
        rule: LoadRule | None = None,
        prefetch_wait_s: float | None = None,
    ) -> None:
        """`store`: (directory, capacity in bytes, model name) of a file store below.
        `write`: when units go down (`lifecycle.tier_write`). `rule`: load or recompute
        each hit by cost (`lifecycle.tiers.cheapest`; None: load the deepest).
        `prefetch_wait_s`: prefetch store -> host (`prefetch`), a match waiting at most
        that long for its reads (None: no prefetch)."""
        self.mgr, self.rule, self.wait_s = mgr, rule, prefetch_wait_s
        self.fetching: dict[Key, Transfer[list[bool]]] = {}  # prefetch reads in flight
        self.groups: dict[str, Group] = {
            "st": state_group(adapter.states),
            "kv": kv_group(adapter.k, adapter.v),
        }
        self.pools: dict[str, HostPool] = {
            "st": HostStatePool(self.groups["st"], state_slots),
            "kv": HostKVPool(self.groups["kv"], kv_tokens),
        }
        self.mover = Mover(device)
        kv_bytes = self.pools["kv"].unit_bytes
        st_bytes = self.pools["st"].unit_bytes
        kv_total = kv_tokens * kv_bytes
        host = LowerTier(HOST, kv_total + state_slots * st_bytes, kv_bytes=kv_total)
        self.queue: list[Action] = []
        self.store: StoreTier | None = None
        store_bytes = 0
        if store is not None:
            root, store_bytes, model = store
            self.store = StoreTier(root, model, self.groups["st"], self.groups["kv"], self.mover)
        self.tiers = LowerTiers(host, LowerTier(STORE, store_bytes), sink=self.queue.append)
        self.tracker = TierTracker(self.tiers, kv_bytes, st_bytes, write=write)
        self.residency = Residency(self.tiers, self.tracker, mgr.page_size)
        self.units: dict[Key, int] = {}  # key -> its host unit (written or being written)
        self.missed: list[Key] = []  # store misses of the load in progress
        self.stats = {"loads": 0, "loaded_kv_tokens": 0, "failed_loads": 0, "recomputed": 0}
        self.stats |= {"store_found": self._adopt_store(kv_bytes, st_bytes)}
        self.stats |= {"prefetched": 0, "prefetch_misses": 0, "prefetch_late": 0}
        self.stats |= {"demoted_kv_tokens": 0, "demoted_states": 0, "store_writes": 0}
        self.stats |= {"store_deletes": 0}
        self.stats |= {"store_loaded_kv_tokens": 0, "store_loaded_states": 0, "store_misses": 0}
        mgr.tree.add_listener(self.tracker)
        mgr.evictor = self.evictor(mgr.evictor)

    def _adopt_store(self, kv_bytes: int, st_bytes: int) -> int:
        """List what the store already holds of this model and layout (an earlier
        engine's writes), oldest first, in the store's LRU; delete what does not fit.
        Returns how many objects were taken."""
        if self.store is None:
            return 0
        found = self.store.found()
        for key in found:
            for old in self.tiers.adopt(key, kv_bytes if key[0] == "kv" else st_bytes):
                self.store.delete(old)
        return len(found)

    # ---------------------------------------------------------------- demotion

    def evictor(self, inner: Evictor) -> Evictor:
        def evict_and_demote(tree: Any, kv_tokens: int, states: int) -> Any:
            result = inner(tree, kv_tokens, states)
            self.execute()  # the units are still the tree's bytes: the manager frees them next
            return result

        return evict_and_demote

    def execute(self) -> None:
        """Carry out the queued actions, in order; the host copies of one call go together."""
        pending: dict[str, list[tuple[Key, int, int]]] = {"st": [], "kv": []}
        for action in self.queue:
            kind = str(action.key[0])
            if isinstance(action, Drop):
                if action.tier == STORE:
                    assert self.store is not None
                    self.store.delete(action.key)
                    self.stats["store_deletes"] += 1
                    continue
                unit = self.units.pop(action.key)
                pending[kind] = [p for p in pending[kind] if p[0] != action.key]
                self.pools[kind].free([unit])
                continue
            if isinstance(action, Fetch):
                self._read_ahead(action.key)
                continue
            assert isinstance(action, Demote)
            if action.tier == STORE:
                self._to_store(action.key, action.source, pending)
                continue
            assert action.source is not None
            got = self.pools[kind].alloc(1)
            if got is None:
                raise AssertionError(f"the host {kind} pool disagrees with its LRU: it is full")
            self.units[action.key] = got[0]
            pending[kind].append((action.key, action.source, got[0]))
        self.queue.clear()
        self._copy_to_host(pending)

    def _read_ahead(self, key: Key) -> None:
        """A `Fetch`: a host unit for `key`, read into from the store on the worker."""
        assert self.store is not None
        kind = str(key[0])
        got = self.pools[kind].alloc(1)
        if got is None:
            raise AssertionError(f"the host {kind} pool disagrees with its LRU: it is full")
        self.units[key] = got[0]
        self.fetching[key] = self.store.read_ahead(key, self.pools[kind].tensors, got[0])

    def _copy_to_host(self, pending: dict[str, list[tuple[Key, int, int]]]) -> None:
        for kind, copies in pending.items():
            if not copies:
                continue
            src, dst = [c[1] for c in copies], [c[2] for c in copies]
            self.mover.copy(self.groups[kind], src, self.pools[kind].tensors, dst).wait()
            for key, _, _ in copies:
                self.tiers.written(key, HOST)
            self.stats["demoted_states" if kind == "st" else "demoted_kv_tokens"] += len(copies)
            copies.clear()

    def _to_store(
        self, key: Key, source: int | None, pending: dict[str, list[tuple[Key, int, int]]]
    ) -> None:
        """Write `key` to the store: its host copy (a host drop), or device unit `source`
        (no room in the host: every entry there is pinned by a load)."""
        assert self.store is not None
        kind = str(key[0])
        src: Group
        if source is None:
            self._copy_to_host(pending)  # the host copy exists from here on
            src, unit = self.pools[kind].tensors, self.units[key]
        else:
            src, unit = self.groups[kind], source
        if self.store.save(key, src, unit):
            self.tiers.written(key, STORE)
            self.stats["store_writes"] += 1
        else:  # refused (full, or failing): not below any more
            self.tiers.forget(key, STORE)
            self.stats["store_misses"] += 1

    # --------------------------------------------------------------- prefetch

    def prefetch(self, prompts: Sequence[Sequence[int]]) -> None:
        """Start reading into the host, on the store's worker thread, what the load of
        each prompt's deepest usable prefix would read from the store (the device and the
        tiers as they are now: a hint; the load decides again at its match)."""
        if self.wait_s is None or self.store is None:
            return
        sizes = {"kv": self.tracker.kv_unit_bytes, "st": self.tracker.group_bytes}
        for prompt in prompts:
            key = prompt[: len(prompt) - 1]
            m = self.mgr.tree.match_prefix(key, read_only=True)
            cands = self.residency.plan(key, m.prefix_len, m.kv_hit_len)
            if not cands:
                continue
            plan = self.residency.restore_plan(key, cands[-1].depth, m.kv_hit_len)
            for k, tier in [(k, t) for _, k, t in plan.kv] + plan.state:
                if tier == STORE:
                    self.tiers.fetch(k, sizes[str(k[0])])
        self.execute()

    def settle(self, wait_s: float | None) -> None:
        """Publish the prefetch reads that finished, waiting at most `wait_s` seconds in
        all for the others (None: for every one); a read the store missed is forgotten."""
        deadline = None if wait_s is None else time.monotonic() + wait_s
        for key, read in list(self.fetching.items()):
            while deadline is not None and not read.done() and time.monotonic() < deadline:
                time.sleep(1e-4)
            if deadline is not None and not read.done():
                self.stats["prefetch_late"] += 1
                continue
            (ok,) = read.wait()
            del self.fetching[key]
            self.tiers.fetched(key, ok)
            if not ok:
                self.pools[str(key[0])].free([self.units.pop(key)])
            self.stats["prefetched" if ok else "prefetch_misses"] += 1

    def flush(self) -> None:
        """Carry out every queued action and finish every prefetch read."""
        self.execute()
        self.settle(None)

    def close(self) -> None:
        """Finish what is in flight and join the store's worker thread."""
        self.flush()
        if self.store is not None:
            self.store.close()

    # ------------------------------------------------------------------- loads

    def before_match(self, req: Request) -> None:
        """Load the prefix of `req` the tiers can give past the device's: the deepest, or
        by cost (`rule`): the one that saves the most seconds, if any."""
        self.execute()  # write-through copies queued by inserts since: visible first
        if self.fetching:
            assert self.wait_s is not None
            self.settle(self.wait_s)  # bounded: a late read leaves the load to the store
        key = req.tokens[: req.total_len - 1]
        m = self.mgr.tree.match_prefix(key, req.extra_key, read_only=True)
        cands = self.residency.plan(key, m.prefix_len, m.kv_hit_len)
        if self.rule is None:
            choice = cands[-1] if cands else None
        else:
            choice = self._cheapest(cands, m.prefix_len)
        if choice is None:
            return
        depth = choice.depth
        # the allocation below may demote into the host: what this load reads is pinned
        # (a host lock), so those demotions pass over it
        pins = self.residency.pin(self.residency.restore_plan(key, depth, m.kv_hit_len))
        self.missed = []

        def load(start: int, kv_on_device: int, kv: Any, slot: int) -> bool:
            plan = self.residency.restore_plan(key, depth, kv_on_device)
            pieces = [(k, kv[i - start], t) for i, k, t in plan.kv]
            pieces += [(k, slot, t) for k, t in plan.state]
            return self._load(pieces)

        try:
            done = restore(self.mgr, key, req.extra_key, depth, self.residency.usable, load)
        finally:
            self.residency.unpin(pins)
        for k in self.missed:  # lost in the store: not below any more
            self.tiers.forget(k, STORE)
        if done is None:
            self.stats["failed_loads"] += 1
            return
        if done.result.node is not None and not done.result.state_existed:
            self.residency.restored(done.result.node, depth, key)
        self.residency.touch(key, depth)
        self.stats["loads"] += 1

    def _cheapest(self, cands: list[Candidate], start: int) -> Candidate | None:
        if not cands:
            return None
        rule = self.rule
        assert rule is not None
        choice = cheapest(
            cands, start, lambda c: rule.load_s(c.host_bytes, c.store_bytes), rule.recompute_s
        )
        if choice is None:
            self.stats["recomputed"] += 1
        return choice

    def _load(self, pieces: list[tuple[Key, int, str]]) -> bool:
        """Copy each (key, device unit, tier) in; False if the store missed any (those
        keys are forgotten after the load)."""
        copies = []
        for kind in ("kv", "st"):
            mine = [(k, u) for k, u, t in pieces if t == HOST and k[0] == kind]
            units = [self.units[k] for k, _ in mine]
            dst = [u for _, u in mine]
            copies.append(self.pools[kind].load(self.mover, units, self.groups[kind], dst))
        missed = []
        if self.store is not None:
            for kind in ("kv", "st"):
                mine = [(k, u) for k, u, t in pieces if t == STORE and k[0] == kind]
                missed += self.store.load(kind, mine, self.groups[kind])
                if kind == "kv":
                    self.stats["store_loaded_kv_tokens"] += len(mine)
                else:
                    self.stats["store_loaded_states"] += len(mine)
        for c in copies:
            c.wait()  # publish after write: the tree's insert follows
        self.missed += missed  # forgotten once unpinned
        self.stats["store_misses"] += len(missed)
        if not missed:
            self.stats["loaded_kv_tokens"] += sum(1 for k, _, _ in pieces if k[0] == "kv")
        return not missed

    # ------------------------------------------------------------------ checks

    def check(self) -> None:
        """The layer's invariants; nothing queued or in flight; every host unit free or
        held by exactly one key, and the keys holding units are the host LRU's entries;
        the store holds exactly the objects its LRU lists."""
        if self.queue or self.tiers.unwritten or self.fetching:
            raise AssertionError("tier actions left unexecuted or writes unpublished")
        self.residency.check_invariants()
        held: dict[str, list[list[int]]] = {"st": [], "kv": []}
        for key, unit in self.units.items():
            held[str(key[0])].append([unit])
            if key not in self.tiers.host:
                raise AssertionError(f"{key!r} holds a host unit but left the host LRU")
        for kind, pool in self.pools.items():
            pool.check_invariants()
            pool.check_conservation(held[kind])
        entries = sum(len(lru.entries) for lru in self.tiers.host.distinct())
        if entries != len(self.units):
            raise AssertionError(f"host LRU holds {entries} keys, {len(self.units)} hold units")
        if self.store is not None:  # visible in the store: durably there
            keys = [k for lru in self.tiers.store.distinct() for k in lru.entries]
            if not all(self.store.holds(keys)):  # type: ignore[arg-type]
                raise AssertionError("a key the store tier lists is not in the store")
            if self.store.objects() != len(keys):  # nothing written and forgotten on disk
                raise AssertionError(f"{self.store.objects()} store objects, {len(keys)} listed")


class TierLookup:
    """A checkpoint policy as the scheduler sees it, plus the host tier's load before
    a match (the policy's own `before_match` runs after, on the restored tree)."""

    def __init__(self, inner: Any, tier: HostTier) -> None:
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "tier", tier)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.inner, name, value)

    def before_match(self, req: Request) -> None:
        self.tier.before_match(req)
        self.inner.before_match(req)

    def on_admitted(self, req: Request) -> None:
        self.tier.residency.hit(req.node)  # write-through counts hits
        self.inner.on_admitted(req)
