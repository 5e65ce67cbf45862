"""The engine's host tier (L2): state slots and KV tokens the device tree lets go of are
copied into host pools, and a later request's prefix is loaded back from them.

The decisions are `lifecycle.tiers`' (the replay makes the same ones); this module carries
them out with bytes:

* demotion: the tree's eviction runs inside the cache manager's evictor; `HostTier`
  wraps it, so right after the tree let go of units, and before the manager frees them,
  the layer's actions are executed: a `Drop` frees the host unit of a key, a `Demote`
  takes a host unit and copies the device unit into it (`pools.transfer.Mover`, one copy
  per pool per eviction); the key becomes visible (`LowerTiers.written`) only after the
  copy has completed (publish after write);
* loading: before a waiting request is matched (`TierLookup.before_match`), its prefix is
  looked up down the tier (`Residency.plan`), the deepest usable depth is restored through
  `lifecycle.tier_restore.restore`: device KV and a slot allocated, the host units copied
  in and waited for, then the tree's `insert`; the match that follows finds it.

Host units are owned by the layer's entries: one per visible or in-flight key, freed when
the host LRU drops the key (`check`: every host unit is free or held by exactly one key,
and the keys holding units are the host LRU's entries).
"""

from __future__ import annotations

from typing import Any

from mambaradix.lifecycle import CacheManager, Evictor, Request
from mambaradix.lifecycle.tier_lru import LowerTier
from mambaradix.lifecycle.tier_restore import restore
from mambaradix.lifecycle.tiers import (
    HOST,
    STORE,
    Action,
    Demote,
    Drop,
    Key,
    LowerTiers,
    Residency,
    TierTracker,
)
from mambaradix.pools.host import HostKVPool, HostPool, HostStatePool, kv_group, state_group
from mambaradix.pools.transfer import Group, Mover

__all__ = ["HostTier", "TierLookup"]


class HostTier:
    """Host state slots and host KV tokens below `mgr`'s tree (module docstring)."""

    def __init__(
        self, mgr: CacheManager, adapter: Any, state_slots: int, kv_tokens: int, device: Any
    ) -> None:
        self.mgr = mgr
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
        self.tiers = LowerTiers(host, LowerTier(STORE, 0), sink=self.queue.append)
        self.tracker = TierTracker(self.tiers, kv_bytes, st_bytes)
        self.residency = Residency(self.tiers, self.tracker, mgr.page_size)
        self.units: dict[Key, int] = {}  # key -> its host unit (written or being written)
        self.stats = {"loads": 0, "loaded_kv_tokens": 0, "failed_loads": 0}
        self.stats |= {"demoted_kv_tokens": 0, "demoted_states": 0}
        mgr.tree.add_listener(self.tracker)
        mgr.evictor = self.evictor(mgr.evictor)

    # ---------------------------------------------------------------- demotion

    def evictor(self, inner: Evictor) -> Evictor:
        def evict_and_demote(tree: Any, kv_tokens: int, states: int) -> Any:
            result = inner(tree, kv_tokens, states)
            self.execute()  # the units are still the tree's bytes: the manager frees them next
            return result

        return evict_and_demote

    def execute(self) -> None:
        """Carry out the queued actions, in order; the copies of one call go together."""
        pending: dict[str, list[tuple[Key, int, int]]] = {"st": [], "kv": []}
        for action in self.queue:
            kind = str(action.key[0])
            if isinstance(action, Drop):
                unit = self.units.pop(action.key)
                pending[kind] = [p for p in pending[kind] if p[0] != action.key]
                self.pools[kind].free([unit])
                continue
            assert isinstance(action, Demote) and action.tier == HOST and action.source is not None
            got = self.pools[kind].alloc(1)
            if got is None:
                raise AssertionError(f"the host {kind} pool disagrees with its LRU: it is full")
            self.units[action.key] = got[0]
            pending[kind].append((action.key, action.source, got[0]))
        self.queue.clear()
        for kind, copies in pending.items():
            if not copies:
                continue
            src, dst = [c[1] for c in copies], [c[2] for c in copies]
            self.mover.copy(self.groups[kind], src, self.pools[kind].tensors, dst).wait()
            for key, _, _ in copies:
                self.tiers.written(key, HOST)
            self.stats["demoted_states" if kind == "st" else "demoted_kv_tokens"] += len(copies)

    # ------------------------------------------------------------------- loads

    def before_match(self, req: Request) -> None:
        """Load the deepest prefix of `req` the host tier can give past the device's."""
        key = req.tokens[: req.total_len - 1]
        m = self.mgr.tree.match_prefix(key, req.extra_key, read_only=True)
        cands = self.residency.plan(key, m.prefix_len, m.kv_hit_len)
        if not cands:
            return
        depth = cands[-1].depth
        # the allocation below may demote into the host: what this load reads goes to the
        # recent end of the LRU first, so the demotions push out other entries
        self.residency.touch(key, depth)

        def load(start: int, kv_on_device: int, kv: Any, slot: int) -> None:
            plan = self.residency.restore_plan(key, depth, kv_on_device)
            units = [self.units[k] for _, k, _ in plan.kv]
            dst = [kv[i - start] for i, _, _ in plan.kv]
            host = self.pools
            copies = [host["kv"].load(self.mover, units, self.groups["kv"], dst)]
            ((state, _),) = plan.state
            st_unit = [self.units[state]]
            copies.append(host["st"].load(self.mover, st_unit, self.groups["st"], [slot]))
            for c in copies:
                c.wait()  # publish after write: the tree's insert follows
            self.stats["loaded_kv_tokens"] += len(units)

        done = restore(self.mgr, key, req.extra_key, depth, self.residency.usable, load)
        if done is None:
            self.stats["failed_loads"] += 1
            return
        if done.result.node is not None and not done.result.state_existed:
            self.residency.restored(done.result.node, depth, key)
        self.residency.touch(key, depth)
        self.stats["loads"] += 1

    # ------------------------------------------------------------------ checks

    def check(self) -> None:
        """The layer's invariants; nothing queued or in flight; every host unit free or
        held by exactly one key, and the keys holding units are the host LRU's entries."""
        if self.queue or self.tiers.unwritten:
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
