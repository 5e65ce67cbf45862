"""Lower tiers in the replay: device evictions demoted to host (L2) and store (L3) LRUs,
and a later request's prefix loaded back when the load costs less than recomputing.

The device tree (`core`) is untouched: `TierTracker` is a tree listener. It keeps each
node's prefix hashes (a chain over units, like HiCache's page-hash chain), and when the
tree lets go of a node's KV (`node_removed`) or its state (`state_removed`) it demotes
them into the host LRU; what the host LRU drops goes to the store LRU, what the store
drops is gone (`tier_lru`). Content keys make the tiers inclusive: an entry loaded back
stays below until its LRU drops it.

`TierHooks` wraps the row's policy for the scheduler and answers as it does, plus a
`before_match`: before a waiting request is matched it looks up the request's prefix on
the device (read only) and down the tiers (`plan`). A candidate is a depth past the
device's usable prefix, on the tree's page grid, whose state (every group of it) is
below and whose every unit of KV is on the device or below. The rule picks one (`pick`);
`restore` allocates its KV and a state slot through the cache manager (which may evict,
hence demote), inserts it into the tree with the tree's public `insert`, and the match
that follows finds it. The load's seconds are added to the request's TTFT (the copy
engine works beside the accelerator; only the request waits for its bytes).

Invariants as code (`check`): each tier's bytes never exceed its capacity and equal its
entries' bytes; a restored depth has its state below and KV for every unit to it
(`usable`, checked independently of `plan` before every insert); the device pools'
conservation (`CacheManager.check_conservation`).
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mambaradix.core.node import TreeNode
from mambaradix.lifecycle import CacheManager, Request
from mambaradix.replay.tier_lru import LowerTier
from mambaradix.replay.tier_rules import (
    AUTO,
    COST,
    PROMPT_STATES,
    PROPORTIONAL,
    TierRules,
    auto_kv_share,
    load_tiers,
)
from mambaradix.scheduler import CheckpointPolicy
from mambaradix.tiers.cost import HitCost, Prefill, break_even

if TYPE_CHECKING:
    from mambaradix.replay.models import ModelProfile
    from mambaradix.replay.serving import ServingConfig

ROOT_HASH = 0
HOST, STORE = "host", "store"


def chain(start: int, units: Any) -> int:
    """The prefix hash after `units`, from `start`."""
    h = start
    for u in units:
        h = hash((h, u))
    return h


@dataclass
class Candidate:
    depth: int  # units
    host_bytes: int  # bytes the load takes from the host
    store_bytes: int  # bytes it takes from the store (they cross the host link too)
    saved_s: float = 0.0  # recompute seconds - load seconds
    load_s: float = 0.0


@dataclass
class Load:
    """What a request got from below: the device's usable prefix `start` (units), the
    restored depth, the deepest tier it read from, and seconds spent loading."""

    start: int
    depth: int
    tier: str
    seconds: float


@dataclass
class TierStats:
    loads: dict[str, int] = field(default_factory=lambda: {HOST: 0, STORE: 0})
    loaded_bytes: dict[str, int] = field(default_factory=lambda: {HOST: 0, STORE: 0})
    recomputed: int = 0  # hits below the rule chose to recompute
    failed: int = 0  # restores with no device memory for them
    demoted_bytes: dict[str, int] = field(default_factory=lambda: {HOST: 0, STORE: 0})
    dropped_bytes: int = 0  # fell out of the last tier


class LowerTiers:
    """The host and store LRUs, and demotion between them."""

    def __init__(self, host_bytes: int, store_bytes: int, kv_share: float | None) -> None:
        self.host = LowerTier(HOST, host_bytes, kv_share)
        self.store = LowerTier(STORE, store_bytes, kv_share)
        self.stats = TierStats()

    def where(self, key: tuple[Hashable, ...]) -> str | None:
        if key in self.host:
            return HOST
        if key in self.store:
            return STORE
        return None

    def demote(self, key: tuple[Hashable, ...], nbytes: int) -> None:
        if key in self.host:
            self.host.touch(key)
            return
        self.stats.demoted_bytes[HOST] += nbytes
        for old, size in self.host.put(key, nbytes):
            self._to_store(old, size)

    def _to_store(self, key: Hashable, nbytes: int) -> None:
        assert isinstance(key, tuple)
        if key in self.store:
            self.store.touch(key)
            return
        self.stats.demoted_bytes[STORE] += nbytes
        for _, size in self.store.put(key, nbytes):
            self.stats.dropped_bytes += size

    def touch(self, key: tuple[Hashable, ...]) -> None:
        tier = self.host if key in self.host else self.store
        tier.touch(key)

    def check(self) -> None:
        self.host.check()
        self.store.check()


class TierTracker:
    """A tree listener: each node's prefix hashes; demotes what the tree lets go of."""

    def __init__(
        self, tiers: LowerTiers, kv_unit_bytes: int, state_bytes: int, rules: TierRules
    ) -> None:
        self.tiers, self.rules = tiers, rules
        self.kv_unit_bytes = kv_unit_bytes
        self.group_bytes = -(-state_bytes // rules.state_groups)
        self.spans: dict[TreeNode, tuple[int, int]] = {}  # node -> (start hash, end hash)
        self.prompt_ends: set[int] = set()  # prefix hashes some prompt reached
        self.prompt_states: set[TreeNode] = set()  # states added at a prompt position

    def state_keys(self, end: int) -> list[tuple[Hashable, ...]]:
        return [("st", end, g) for g in range(self.rules.state_groups)]

    # TreeListener
    def node_added(self, node: TreeNode) -> None:
        parent = node.parent
        start = self.spans[parent][1] if parent in self.spans else ROOT_HASH
        self.spans[node] = (start, chain(start, node.key))

    def node_split(self, upper: TreeNode, lower: TreeNode) -> None:
        start, end = self.spans[lower]
        mid = chain(start, upper.key)
        self.spans[upper] = (start, mid)
        self.spans[lower] = (mid, end)

    def node_removed(self, node: TreeNode) -> None:
        start, _ = self.spans.pop(node)
        self.prompt_states.discard(node)
        h = start
        for u in node.key:
            h = hash((h, u))
            self.tiers.demote(("kv", h), self.kv_unit_bytes)

    def state_added(self, node: TreeNode) -> None:
        if self.spans[node][1] in self.prompt_ends:
            self.prompt_states.add(node)

    def state_removed(self, node: TreeNode) -> None:
        at_prompt = node in self.prompt_states
        self.prompt_states.discard(node)
        if self.rules.states == PROMPT_STATES and not at_prompt:
            return  # vLLM offloads no decode-phase state (vllm #56972)
        for key in self.state_keys(self.spans[node][1]):
            self.tiers.demote(key, self.group_bytes)

    def tree_reset(self) -> None:
        self.spans.clear()
        self.prompt_states.clear()


class TieredCache:
    """The tiers of one serving model: tracker, planner, restorer, per-request loads."""

    def __init__(
        self,
        cache: CacheManager,
        profile: ModelProfile,
        cfg: ServingConfig,
        rules: TierRules,
        unit_tokens: int,
        kv_unit_bytes: int,
        state_bytes: int,
    ) -> None:
        self.cache, self.profile, self.cfg, self.rules = cache, profile, cfg, rules
        self.unit, self.kv_unit_bytes, self.state_bytes = unit_tokens, kv_unit_bytes, state_bytes
        kv_share = None
        if rules.split == PROPORTIONAL:  # SGLang: --hicache-size split like the device
            kv_dev = cache.kv.capacity * kv_unit_bytes
            kv_share = kv_dev / max(1, kv_dev + cache.slots.capacity * state_bytes)
        elif rules.split == AUTO:  # SGLang's proposed `auto` host state pool (#39436)
            per_token = kv_unit_bytes / unit_tokens
            kv_share = auto_kv_share(
                int(cfg.host_gb * 1e9), per_token, state_bytes, cfg.chunk_tokens, cfg.max_running
            )
        self.tiers = LowerTiers(int(cfg.host_gb * 1e9), int(cfg.store_gb * 1e9), kv_share)
        self.host_path, self.store_path = load_tiers(
            cfg.host_gbps, cfg.host_latency_us, cfg.store_gbps, cfg.store_latency_us
        )
        self.tracker = TierTracker(self.tiers, kv_unit_bytes, state_bytes, rules)
        cache.tree.add_listener(self.tracker)
        self.loads: dict[Request, Load] = {}
        self.adopt: Any = None  # the policy's `adopt_loaded`, when it keeps block books
        self.pool: Any = None  # the policy's block pool, when it keeps one

    # ------------------------------------------------------------------ lookup

    def plan(self, key: Any, start: int, kv_on_device: int) -> list[Candidate]:
        """Every depth past `start` a load could restore (module docstring)."""
        tiers, page = self.tiers, self.cache.page_size
        out: list[Candidate] = []
        h, kv_host, kv_store = ROOT_HASH, 0, 0
        for i, u in enumerate(key, 1):
            h = hash((h, u))
            if i > kv_on_device:
                where = tiers.where(("kv", h))
                if where is None:
                    break
                if where == HOST:
                    kv_host += self.kv_unit_bytes
                else:
                    kv_store += self.kv_unit_bytes
            if i <= start or i % page:
                continue
            places = [tiers.where(k) for k in self.tracker.state_keys(h)]
            if None in places:
                continue
            st_store = places.count(STORE) * self.tracker.group_bytes
            st_host = places.count(HOST) * self.tracker.group_bytes
            out.append(Candidate(i, kv_host + st_host, kv_store + st_store))
        return out

    def load_seconds(self, c: Candidate) -> float:
        host = self.host_path.links[0]
        seconds = host.seconds(c.host_bytes + c.store_bytes)
        if c.store_bytes:
            seconds += self.store_path.links[0].seconds(c.store_bytes)
        return seconds

    def pick(self, cands: list[Candidate], start: int) -> Candidate | None:
        """The rule's choice: the most seconds saved (COST; None when recomputing is
        cheaper for every candidate) or the deepest (DEEPEST)."""
        if not cands:
            return None
        rate = self.cfg.prefill_flops_per_s
        for c in cands:
            new = (c.depth - start) * self.unit
            c.load_s = self.load_seconds(c)
            c.saved_s = self.profile.prefill_flops(start * self.unit, new) / rate - c.load_s
        if self.rules.choose != COST:
            return cands[-1]
        best = max(cands, key=lambda c: c.saved_s)
        if best.saved_s <= 0:
            self.tiers.stats.recomputed += 1
            return None
        return best

    def usable(self, key: Any, depth: int, kv_on_device: int) -> bool:
        """Every group of the state at `depth` below, and the KV of every unit to it on
        the device or below: the only hit a load may give."""
        h = ROOT_HASH
        for i in range(depth):
            h = hash((h, key[i]))
            if i + 1 > kv_on_device and self.tiers.where(("kv", h)) is None:
                return False
        return all(self.tiers.where(k) is not None for k in self.tracker.state_keys(h))

    # ----------------------------------------------------------------- restore

    def before_match(self, req: Request) -> None:
        key = req.tokens[: req.total_len - 1]
        tree = self.cache.tree
        m = tree.match_prefix(key, req.extra_key, read_only=True)
        self._note_prompt(key)
        cands = self.plan(key, m.prefix_len, m.kv_hit_len)
        choice = self.pick(cands, m.prefix_len)
        if choice is not None:
            self.restore(req, key, choice)

    def _note_prompt(self, key: Any) -> None:
        if self.rules.states == PROMPT_STATES:
            h = ROOT_HASH
            for u in key:
                h = hash((h, u))
                self.tracker.prompt_ends.add(h)

    def restore(self, req: Request, key: Any, choice: Candidate) -> None:
        tree, cache = self.cache.tree, self.cache
        m = tree.match_prefix(key, req.extra_key, read_only=True)
        start = m.prefix_len
        lock = tree.inc_lock_ref(m.node) if start else None
        try:
            got = self._alloc(choice.depth - start)
        finally:
            if lock is not None:
                tree.dec_lock_ref(lock)
        if got is None:
            self.tiers.stats.failed += 1
            return
        kv, slot = got
        m = tree.match_prefix(key, req.extra_key, read_only=True)  # allocation may evict
        if m.prefix_len != start or not self.usable(key, choice.depth, m.kv_hit_len):
            cache.kv.free(kv)
            cache.slots.free([slot])
            self.tiers.stats.failed += 1
            return
        cands = [c for c in self.plan(key, start, m.kv_hit_len) if c.depth == choice.depth]
        load = cands[0]
        tier = STORE if load.store_bytes else HOST
        values = array("q", m.kv_indices) + array("q", kv)
        result = tree.insert(key[: choice.depth], values, slot, start, req.extra_key)
        if result.freed_kv:
            cache.kv.free(result.freed_kv)
        if result.state_existed:
            cache.slots.free([slot])
        if self.adopt is not None:  # a policy with its own block books (vLLM's)
            kept = None if result.state_existed else slot
            self.adopt(key, start, array("q", kv), set(result.freed_kv), kept)
        self._touch(key, choice.depth)
        seconds = self.load_seconds(load)
        stats = self.tiers.stats
        stats.loads[tier] += 1
        stats.loaded_bytes[HOST] += load.host_bytes
        stats.loaded_bytes[STORE] += load.store_bytes
        prev = self.loads.get(req)
        self.loads[req] = Load(start, choice.depth, tier, seconds + (prev.seconds if prev else 0))

    def _alloc(self, units: int) -> tuple[Any, int] | None:
        cache = self.cache
        cache.evict_kv_for(units)
        kv = cache.kv.alloc(units)
        if kv is None:
            return None
        slot = cache.alloc_slot()
        if slot is None:
            cache.kv.free(kv)
            return None
        return kv, slot

    def _touch(self, key: Any, depth: int) -> None:
        h = ROOT_HASH
        for i in range(depth):
            h = hash((h, key[i]))
            if self.tiers.where(("kv", h)) is not None:
                self.tiers.touch(("kv", h))
        for k in self.tracker.state_keys(h):
            self.tiers.touch(k)

    # ----------------------------------------------------------------- results

    def lower_hit_units(self, req: Request, cached_units: int) -> tuple[str, int, float] | None:
        """(tier, units served from below, load seconds) of a finished request."""
        load = self.loads.pop(req, None)
        if load is None:
            return None
        return load.tier, max(0, min(cached_units, load.depth) - load.start), load.seconds

    def check(self) -> None:
        """The tiers' bytes, and the device's own books: the lifecycle's conservation, or
        the block pool's for a policy that keeps one (vLLM's: its cached blocks are not
        the lifecycle's)."""
        self.tiers.check()
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.check()
        else:
            self.cache.check_conservation()

    def break_even_tokens(self) -> dict[str, int | None]:
        """`tiers.cost.break_even` of this model on this run's links and prefill rate."""
        p = self.profile
        cost = HitCost(
            p.name,
            self.state_bytes,
            p.kv_bytes_per_token,
            p.linear_flops_per_token,
            p.attn_flops_per_pair,
        )
        rate = Prefill("replay", self.cfg.prefill_flops_per_s, 1.0, "ServingConfig")
        return {
            HOST: break_even(cost, self.host_path, rate),
            STORE: break_even(cost, self.store_path, rate),
        }


class TierHooks:
    """The row's policy as the scheduler sees it, plus the tiers' `before_match` (the
    policy's own, when it has one, runs after the load, on the restored tree)."""

    def __init__(self, inner: CheckpointPolicy, tiered: TieredCache) -> None:
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "tiered", tiered)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.inner, name, value)

    def before_match(self, req: Request) -> None:
        self.tiered.before_match(req)
        self.inner.before_match(req)
