"""What every policy shares: the context a run gives it, the base class, the
per-node side tables policies keep their bookkeeping in, and eviction in a
policy's own order.

A policy talks to the tree only through its public, typed surface: node
fields (`parent`, `children`, `key`, `state`, `kv_lock`, `state_lock`,
`depth_tokens()`), the recency accessors (`state_clock()`,
`state_last_use(node)`), `evictable_states()`, the targeted evictions
(`evict_state_of`, `evict_leaf`, `evict`) and the listener hooks
(`add_listener`). The tree holds no policy data: a policy's per-node data
lives in a `NodeTable` of its own, which the tree's hooks keep clean.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from mambaradix.core.node import TreeNode
from mambaradix.core.results import EvictResult
from mambaradix.core.tree import MambaRadixCache
from mambaradix.lifecycle import CacheManager, Request
from mambaradix.lifecycle.manager import KVAllocator, RowTable, SlotAllocator
from mambaradix.replay.tier_rules import OURS, TierRules
from mambaradix.scheduler import PROMPT_END, DefaultCheckpoints

if TYPE_CHECKING:
    from mambaradix.replay.models import ModelProfile
    from mambaradix.replay.vllm_pool import BlockPool

T = TypeVar("T")


@dataclass
class PolicyContext:
    """What a policy may know about the run."""

    profile: ModelProfile
    unit_tokens: int  # tokens per tree unit (1, or 512 for Mooncake blocks)
    chunk_units: int  # prefill chunk size in units (whole pages)
    kv_unit_bytes: int
    kv_capacity: int = 0  # KV pool size in units
    state_capacity: int = 0  # state pool size in slots
    free_states: Callable[[], int] = lambda: 0  # state slots free right now
    tree: MambaRadixCache | None = None  # the run's tree (for listener hooks)
    state_bytes: int = 0  # bytes of one state slot in this run (0: the profile's)
    shared_memory: bool = False  # KV and states draw on one byte budget (sequential)
    budget_units: int = 0  # the configured prefill token budget in units (not paged)
    rows: RowTable | None = None  # the request-to-token table (a request's KV indices)
    cache: CacheManager | None = None  # the lifecycle (its eviction counters)
    waiting: Callable[[], list[Request]] = list  # the requests queued, in admission order

    def __post_init__(self) -> None:
        if not self.state_bytes:
            self.state_bytes = self.profile.state_bytes


class NodeTable(Generic[T]):
    """Per-node data a policy keeps beside the tree, keyed by node.

    Registered as a listener of `tree`: an entry is dropped when its node
    loses its state (tombstoned or evicted), leaves the tree, or the tree is
    reset; with `drop_on_split` also when a split shortens the node's edge
    (for data derived from the edge). A listener must not call into the tree,
    and this one does not."""

    def __init__(self, tree: MambaRadixCache, drop_on_split: bool = False) -> None:
        self._data: dict[TreeNode, T] = {}
        self._drop_on_split = drop_on_split
        tree.add_listener(self)

    def get(self, node: TreeNode) -> T | None:
        return self._data.get(node)

    def __setitem__(self, node: TreeNode, value: T) -> None:
        self._data[node] = value

    def __contains__(self, node: object) -> bool:
        return node in self._data

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[TreeNode]:
        return iter(self._data)

    def pop(self, node: TreeNode) -> T | None:
        return self._data.pop(node, None)

    # TreeListener
    def node_added(self, node: TreeNode) -> None:
        pass

    def node_split(self, upper: TreeNode, lower: TreeNode) -> None:
        if self._drop_on_split:
            self._data.pop(lower, None)

    def node_removed(self, node: TreeNode) -> None:
        self._data.pop(node, None)

    def state_added(self, node: TreeNode) -> None:
        pass

    def state_removed(self, node: TreeNode) -> None:
        self._data.pop(node, None)

    def tree_reset(self) -> None:
        self._data.clear()


class Policy:
    """The base: SGLang's checkpoints, the tree's LRU eviction.

    A policy is a `mambaradix.scheduler.CheckpointPolicy` (where states are
    checkpointed) plus an eviction rule (`evict(tree, kv_units, states)`, the
    cache manager's evictor), the tree behaviour (`compat`), the lifecycle
    strategy (`strategy`) and the bytes one state slot costs it."""

    name = "base"
    compat: str | None = None
    sglang_rules = False  # SGLang's head-room and eviction amounts (CacheManager)
    strategy = "no_buffer"
    finish_insert = True
    decode_interval: int | None = None  # no_buffer: checkpoint every N decoded units
    shared_budget = False
    """KV and states draw on one byte budget in the serving discipline (else split pools,
    `ServingConfig.state_fraction`; the sequential discipline always has one); see
    `one_budget`."""
    admission_kinds: frozenset[str] = frozenset()
    """Checkpoint kinds whose `cache_at` answer weighs the state against what is
    cached (an admission decision), not where states go; `replay.explain` counts
    their refusals as admission refused."""
    pool: BlockPool | None = None
    """The block pool of a policy that keeps its own books of what is cached (vLLM's);
    None: the lifecycle's books are the only ones (the tiers check its conservation)."""

    def one_budget(self, tiered: bool) -> bool:
        """Whether KV and states draw on one byte budget in the serving discipline, with
        (`tiered`) or without a host or store tier."""
        return self.shared_budget

    def attach(self, ctx: PolicyContext) -> None:
        self.ctx = ctx

    def state_bytes(self, profile: ModelProfile) -> int:
        """Bytes one state slot takes under this policy's engine."""
        return profile.state_bytes

    def stops(self, req: Request) -> list[int]:
        return []

    def cache_at(self, req: Request, kind: str) -> bool:
        return True

    def insert_at_finish(self, req: Request) -> bool:
        return self.finish_insert

    def on_admitted(self, req: Request) -> None:
        """Called after a request matched (and locked) its prefix."""

    def on_cached(self, req: Request, node: TreeNode | None, kind: str) -> None:
        """Called with the node now holding a state the request cached."""

    def on_request_done(self) -> None:
        """Called once per finished request (for tuning)."""

    def before_match(self, req: Request) -> None:
        """Called before a waiting request is looked up."""

    def on_abort(self, req: Request) -> None:
        """Called before an admitted request gives everything back unfinished
        (retracted or dropped)."""

    def tree_page(self, profile: ModelProfile, unit_tokens: int) -> int | None:
        """The tree's page in units when this policy's upstream fixes it (vLLM's
        block; the policy then checkpoints only at page ends), else None (the
        configured page)."""
        return None

    def build_memory(
        self, budget: int, kv_unit_bytes: int, profile: ModelProfile, unit_tokens: int
    ) -> tuple[KVAllocator, SlotAllocator] | None:
        """The KV and state allocators of a `budget`-byte memory, when this policy's
        upstream lays its memory out its own way (vLLM's block pool); None for the
        replay's pools (`replay.memory`)."""
        return None

    def adopt_loaded(
        self, tokens: array[int], start: int, kv: array[int], freed: set[int], slot: int | None
    ) -> None:
        """A lower-tier load put `kv` in the tree from unit `start` on (less the indices
        the tree had already, `freed`; the state in `slot`, None if the tree had one): a
        policy with its own books (`pool`) enters them there; the base keeps none."""

    def evict(self, tree: MambaRadixCache, kv_units: int, states: int) -> EvictResult:
        return tree.evict(kv_tokens=kv_units, states=states)

    def tier_rules(self, profile: ModelProfile) -> TierRules:
        """How this row runs the lower tiers, when a run has them (`replay.tier_rules`):
        ours unless the row models a peer's tiered setup."""
        return OURS


class DefaultPolicy(Policy):
    """The engine's default: `DefaultCheckpoints` (chunk ends, the branch
    point, input - 1, finish) with the tree's LRU eviction."""

    name = "default"

    def stops(self, req: Request) -> list[int]:
        return DefaultCheckpoints().stops(req)

    def cache_at(self, req: Request, kind: str) -> bool:
        return kind != PROMPT_END


def normalise(xs: list[float]) -> list[float]:
    """Min-max normalisation to [0, 1] (all 0 when every value is equal)."""
    lo, hi = min(xs), max(xs)
    if hi <= lo:
        return [0.0] * len(xs)
    return [(x - lo) / (hi - lo) for x in xs]


def evict_in_order(
    tree: MambaRadixCache, order: list[TreeNode], kv_units: int, states: int
) -> EvictResult:
    """Evict nodes in `order` until kv_units KV units (leaves) and `states`
    states are freed; fall back to LRU for what the order could not free."""
    freed_kv: array[int] = array("q")
    freed_states: list[int] = []
    got_kv = got_states = 0
    for node in order:
        if got_kv >= kv_units and got_states >= states:
            break
        if node.parent is None or node.state is None or node.state_lock:
            continue  # deleted or tombstoned by an earlier cascade, or locked
        if kv_units > got_kv:
            if node.children or node.kv_lock:
                continue
            r = tree.evict_leaf(node)
        else:
            r = tree.evict_state_of(node)
        got_kv += len(r.freed_kv)
        got_states += len(r.freed_states)
        freed_kv += r.freed_kv
        freed_states += r.freed_states
    if got_kv < kv_units or got_states < states:
        r = tree.evict(kv_tokens=max(0, kv_units - got_kv), states=max(0, states - got_states))
        freed_kv += r.freed_kv
        freed_states += r.freed_states
    return EvictResult(len(freed_kv), len(freed_states), freed_kv, freed_states)
