"""Lower tiers in the replay: device evictions demoted to host (L2) and store (L3) LRUs,
and a later request's prefix loaded back when the load costs less than recomputing.

The decisions live below the replay, in `lifecycle.tiers` (the engine uses the same
ones): `TierTracker` is a tree listener that demotes what the device tree lets go of
into the host LRU (what the host drops goes to the store, what the store drops is gone),
keyed by a prefix-hash chain over units, and `Residency` looks a request's prefix up down
the tiers. The replay carries the decisions out by accounting: a write is instant (no
sink), a load's seconds go into the request's TTFT (the copy engine works beside the
accelerator; only the request waits for its bytes).

`TierHooks` wraps the row's policy for the scheduler and answers as it does, plus a
`before_match`: before a waiting request is matched it looks up the request's prefix on
the device (read only) and down the tiers (`plan`). A candidate is a depth past the
device's usable prefix, on the tree's page grid, whose state (every group of it) is
below and whose every unit of KV is on the device or below. The rule picks one (`pick`);
`restore` (`lifecycle.tier_restore`) allocates its KV and a state slot through the cache
manager (which may evict, hence demote), checks the depth is still `usable`, and inserts
it into the tree with the tree's public `insert`; the match that follows finds it.

Invariants as code (`check`): `Residency.check_invariants` (each tier's bytes never
exceed its capacity and equal its entries' bytes; a restored state sits at its depth); a
restored depth has its state below and KV for every unit to it (`usable`, checked
independently of `plan` before every insert); the device pools' conservation
(`CacheManager.check_conservation`).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mambaradix.lifecycle import CacheManager, Request
from mambaradix.lifecycle.tier_lru import LowerTier
from mambaradix.lifecycle.tier_restore import restore as restore_through
from mambaradix.lifecycle.tier_write import as_write_policy
from mambaradix.lifecycle.tiers import (
    HOST,
    ROOT_HASH,
    STORE,
    Candidate,
    LowerTiers,
    Residency,
    TierStats,
    TierTracker,
    chain,
    cheapest,
)
from mambaradix.policies import Policy
from mambaradix.policies.tier_rules import (
    AUTO,
    COST,
    PROMPT_STATES,
    PROPORTIONAL,
    TierRules,
    auto_kv_share,
    load_tiers,
)
from mambaradix.tiers.cost import HitCost, Prefill, break_even, load_seconds

if TYPE_CHECKING:
    from mambaradix.geometry.profile import ModelProfile
    from mambaradix.policies.vllm_pool import BlockPool
    from mambaradix.replay.serving import ServingConfig

    # `Policy.adopt_loaded(tokens, start, kv, freed, slot)`
    Adopt = Callable[[array[int], int, array[int], set[int], int | None], None]

__all__ = [
    "HOST",
    "ROOT_HASH",
    "STORE",
    "Candidate",
    "Load",
    "TierHooks",
    "TierStats",
    "TieredCache",
    "byte_tiers",
    "chain",
]


@dataclass
class Load:
    """What a request got from below: the device's usable prefix `start` (units), the
    restored depth, the deepest tier it read from, and seconds spent loading."""

    start: int
    depth: int
    tier: str
    seconds: float


def byte_tiers(
    host_bytes: int, store_bytes: int, kv_share: float | None, store: LowerTier | None = None
) -> LowerTiers:
    """The replay's tiers: byte budgets, writes instant (no sink); `store`: a store tier
    shared with other serving models (else one of `store_bytes`)."""
    if store is None:
        store = LowerTier(STORE, store_bytes, kv_share)
    return LowerTiers(LowerTier(HOST, host_bytes, kv_share), store)


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
        store: LowerTier | None = None,
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
        self.tiers = byte_tiers(int(cfg.host_gb * 1e9), int(cfg.store_gb * 1e9), kv_share, store)
        self.host_path, self.store_path = load_tiers(
            cfg.host_gbps, cfg.host_latency_us, cfg.store_gbps, cfg.store_latency_us
        )
        self.tracker = TierTracker(
            self.tiers,
            kv_unit_bytes,
            state_bytes,
            rules.state_groups,
            prompt_only=rules.states == PROMPT_STATES,
            write=rules.write if cfg.tier_write is None else as_write_policy(cfg.tier_write),
        )
        self.residency = Residency(self.tiers, self.tracker, cache.page_size)
        cache.tree.add_listener(self.tracker)
        self.loads: dict[Request, Load] = {}
        self.adopt: Adopt | None = None  # the policy's `adopt_loaded` (`Policy`)
        self.pool: BlockPool | None = None  # the policy's block pool, when it keeps one

    # ------------------------------------------------------------------ lookup

    def plan(self, key: Any, start: int, kv_on_device: int) -> list[Candidate]:
        """Every depth past `start` a load could restore (`Residency.plan`)."""
        return self.residency.plan(key, start, kv_on_device)

    def load_seconds(self, c: Candidate) -> float:
        host, store = self.host_path.links[0], self.store_path.links[0]
        return load_seconds(host, store, c.host_bytes, c.store_bytes)

    def recompute_seconds(self, start: int, units: int) -> float:
        flops = self.profile.prefill_flops(start * self.unit, units * self.unit)
        return flops / self.cfg.prefill_flops_per_s

    def pick(self, cands: list[Candidate], start: int) -> Candidate | None:
        """The rule's choice: the most seconds saved (COST, `lifecycle.tiers.cheapest`;
        None when recomputing is cheaper for every candidate) or the deepest (DEEPEST)."""
        if not cands:
            return None
        best = cheapest(cands, start, self.load_seconds, self.recompute_seconds)
        if self.rules.choose != COST:
            return cands[-1]
        if best is None:
            self.tiers.stats.recomputed += 1
        return best

    def usable(self, key: Any, depth: int, kv_on_device: int) -> bool:
        """`Residency.usable`: the only hit a load may give."""
        return self.residency.usable(key, depth, kv_on_device)

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
        self.residency.note_prompt(key)

    def restore(self, req: Request, key: Any, choice: Candidate) -> None:
        loaded: list[Candidate] = []

        def account(start: int, kv_on_device: int, kv: Any, slot: int) -> bool:
            cands = [c for c in self.plan(key, start, kv_on_device) if c.depth == choice.depth]
            loaded.append(cands[0])
            return True

        done = restore_through(self.cache, key, req.extra_key, choice.depth, self.usable, account)
        if done is None:
            self.tiers.stats.failed += 1
            return
        start, result, load = done.start, done.result, loaded[0]
        if result.node is not None and not result.state_existed:
            self.residency.restored(result.node, choice.depth, key)
        tier = STORE if load.store_bytes else HOST
        if self.adopt is not None:  # a no-op but for a policy with its own books (vLLM's)
            kept = None if result.state_existed else done.slot
            self.adopt(key, start, done.kv, set(result.freed_kv), kept)
        self.residency.touch(key, choice.depth)
        seconds = self.load_seconds(load)
        stats = self.tiers.stats
        stats.loads[tier] += 1
        stats.loaded_bytes[HOST] += load.host_bytes
        stats.loaded_bytes[STORE] += load.store_bytes
        prev = self.loads.get(req)
        self.loads[req] = Load(start, choice.depth, tier, seconds + (prev.seconds if prev else 0))

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
        self.residency.check_invariants()
        if self.pool is not None:
            self.pool.check()
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

    def __init__(self, inner: Policy, tiered: TieredCache) -> None:
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "tiered", tiered)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.inner, name, value)

    def before_match(self, req: Request) -> None:
        self.tiered.before_match(req)
        self.inner.before_match(req)

    def on_admitted(self, req: Request) -> None:
        self.tiered.residency.hit(req.node)  # write-through counts hits
        self.inner.on_admitted(req)
