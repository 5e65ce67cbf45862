"""`Policy`: the one protocol for admission, checkpoints and eviction.

The scheduler (`mambaradix.scheduler.Scheduler`), the engine (`Engine(policy=...)`)
and the replay (`replay.serving.ServingModel`) all run a `Policy`; every policy
of `mambaradix.policies` (the registry, `make_policy`) is one, built on the base
class `BasePolicy` (`policies.base`). The Protocol is what a caller may rely on;
the base class is one way to satisfy it (wrappers such as the engine's
`GridCheckpoints` satisfy it by passing what they do not change to the policy
they wrap, `policies.wrap.PolicyWrapper`).

Three groups of members, by who calls them and when:

Layout (before the run's memory exists; pure queries, nothing mutated except a
policy's own `pool` by `build_memory`): `name`, `compat`, `sglang_rules`,
`strategy`, `admission_kinds`, `pool`, `state_bytes`, `tree_page`, `build_memory`,
`one_budget`, `tier_rules`. A driver reads them once, to build the tree, the
pools and the cache manager.

Wiring: `attach(ctx)`, once, after the tree, the pools, the cache manager and the
scheduler exist and before the first request; the policy keeps `ctx` and may
register tree listeners (`PolicyTree.add_listener`). No other hook below is
called before `attach`.

Decisions (the scheduler's and the cache manager's questions, always between
forwards, never from inside a tree listener): `stops`, `cache_at`,
`insert_at_finish`, `decode_interval` (answers used at once, for the request in
hand, and never kept by the caller), the notifications `before_match`,
`on_admitted`, `on_cached`, `on_abort`, `on_request_done`, `adopt_loaded`
(nothing returned), and `evict` (the cache manager's evictor). A policy may
mutate its own books in any of them; only `before_match` (a match may allocate:
vLLM pins blocks), `cache_at` (an admission may make room: ours evicts through
the seam and releases through `ctx.cache`) and `evict` may mutate the tree, and
only through `PolicyTree` (`policies.seam`).

With the `extra_buffer` strategy the positions come from the tracking rule
(chunk-aligned, in the strategy), so `stops` is not consulted; `cache_at`
still decides whether a tracked state is kept at a chunk end.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from mambaradix.core.node import TreeNode
from mambaradix.core.results import EvictResult
from mambaradix.lifecycle import Request
from mambaradix.lifecycle.manager import KVAllocator, SlotAllocator

if TYPE_CHECKING:
    from mambaradix.geometry.profile import ModelProfile
    from mambaradix.policies.base import PolicyContext
    from mambaradix.policies.seam import PolicyTree
    from mambaradix.policies.tier_rules import TierRules
    from mambaradix.policies.vllm_pool import BlockPool

__all__ = ["Policy"]


@runtime_checkable  # the engine refuses a `policy` that is not one (isinstance)
class Policy(Protocol):
    """Where states are checkpointed, which are admitted, what is evicted, and the
    memory layout these need (see the module docstring for when each is called)."""

    name: str
    """The registry name (`mambaradix.policies.POLICIES`)."""
    compat: str | None
    """The SGLang release whose tree this policy runs (`core.compat`), None for ours."""
    sglang_rules: bool
    """SGLang's head-room and eviction amounts in the cache manager (`CacheManager`)."""
    strategy: str
    """The lifecycle strategy: "no_buffer" or "extra_buffer"."""
    admission_kinds: frozenset[str]
    """Checkpoint kinds whose `cache_at` answer is an admission decision (weighs the
    state against what is cached), not a placement; `replay.explain` counts their
    refusals as admission refused."""
    pool: BlockPool | None
    """The block pool of a policy that keeps its own books of what is cached (vLLM's,
    set by `build_memory`); None: the lifecycle's books are the only ones."""
    decode_interval: int | None
    """no_buffer: also checkpoint after a decode step when the length is a multiple
    of this (kind DECODED); None for never. Read at every decode step."""

    # ---------------------------------------------------------------- layout

    def state_bytes(self, profile: ModelProfile) -> int:
        """Bytes one state slot takes under this policy's engine (pure)."""
        ...

    def tree_page(self, profile: ModelProfile, unit_tokens: int) -> int | None:
        """The tree's page in units when this policy's upstream fixes it (vLLM's block;
        it then checkpoints only at page ends), else None: the configured page (pure)."""
        ...

    def build_memory(
        self, budget: int, kv_unit_bytes: int, profile: ModelProfile, unit_tokens: int
    ) -> tuple[KVAllocator, SlotAllocator] | None:
        """The KV and state allocators of a `budget`-byte memory when this policy lays
        its memory out its own way (vLLM's block pool; sets `pool`), else None: the
        driver's pools. The engine refuses a policy that returns allocators."""
        ...

    def one_budget(self, tiered: bool) -> bool:
        """Whether KV and states draw on one byte budget in the serving discipline,
        with (`tiered`) or without a host or store tier (pure)."""
        ...

    def tier_rules(self, profile: ModelProfile) -> TierRules:
        """How this policy runs the lower tiers, when a run has them (pure)."""
        ...

    # ---------------------------------------------------------------- wiring

    def attach(self, ctx: PolicyContext) -> None:
        """Once, before the first request: keep `ctx`, register tree listeners."""
        ...

    # ------------------------------------------------------------- decisions

    def stops(self, req: Request) -> list[int]:
        """After admission: positions (> req.computed, < req.total_len) at which the
        prefill must stop to checkpoint (no_buffer). Reads `req` and the tree only."""
        ...

    def cache_at(self, req: Request, kind: str) -> bool:
        """Checkpoint now, at req.computed? kind: CHUNK, STOP, PROMPT_END, DECODED
        (`policies.kinds`). May make room (evict through the seam, release through
        `ctx.cache`) when the answer is an admission (`admission_kinds`)."""
        ...

    def insert_at_finish(self, req: Request) -> bool:
        """Cache the finished sequence (its state at the end)?"""
        ...

    def before_match(self, req: Request) -> None:
        """`req` is about to be looked up (its match may allocate: vLLM pins blocks)."""
        ...

    def on_admitted(self, req: Request) -> None:
        """`req` matched `req.node` (`req.cached_len` tokens), locked it, and was admitted."""
        ...

    def on_cached(self, req: Request, node: TreeNode | None, kind: str) -> None:
        """A checkpoint of kind CHUNK / STOP / PROMPT_END / DECODED / FINISH was taken;
        `node` holds the state (None if the tree already had one there). The node is
        the tree's until the next eviction: keep data about it in a `NodeTable`."""
        ...

    def on_abort(self, req: Request) -> None:
        """`req`, looked up, gives everything back unfinished (refused after its
        match, retracted or dropped); called before it does."""
        ...

    def on_request_done(self) -> None:
        """A request finished (after its finish checkpoint): for tuning."""
        ...

    def adopt_loaded(
        self, tokens: array[int], start: int, kv: array[int], freed: set[int], slot: int | None
    ) -> None:
        """A lower-tier load put `kv` in the tree from unit `start` on (less the
        indices it had already, `freed`; the state in `slot`, None if the tree had
        one): a policy with its own books (`pool`) enters them there."""
        ...

    def evict(self, tree: PolicyTree, kv_units: int, states: int) -> EvictResult:
        """The cache manager's evictor: free at least `kv_units` KV units and `states`
        states (what it can), through the seam. The result's indices and slots are
        the caller's to free into the pools, at once."""
        ...
