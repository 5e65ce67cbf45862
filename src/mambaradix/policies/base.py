"""What every policy shares: the context a run gives it, the base class, the
per-node side tables policies keep their bookkeeping in, and eviction in a
policy's own order.

A policy talks to the tree only through `PolicyTree` (`policies.seam`: the
recency accessors, `evictable_states()`, the targeted evictions, read-only
lookups and the listener hooks) and the public node fields it hands out. The
tree holds no policy data: a policy's per-node data lives in a `NodeTable` of
its own, which the tree's hooks keep clean.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from mambaradix.core.node import TreeNode
from mambaradix.core.results import EvictResult
from mambaradix.lifecycle import CacheManager, Request
from mambaradix.lifecycle.manager import KVAllocator, RowTable, SlotAllocator
from mambaradix.policies.kinds import PROMPT_END
from mambaradix.policies.seam import PolicyTree
from mambaradix.policies.tier_rules import OURS, TierRules

if TYPE_CHECKING:
    from mambaradix.geometry.profile import ModelProfile
    from mambaradix.policies.protocol import Policy
    from mambaradix.policies.vllm_pool import BlockPool

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
    tree: PolicyTree | None = None  # the run's tree, through the seam
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

    def __init__(self, tree: PolicyTree, drop_on_split: bool = False) -> None:
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


class BasePolicy:
    """The base of every policy here, and a `Policy` (`policies.protocol`) itself:
    SGLang's checkpoints (every chunk end, the prompt end, finish), the tree's
    LRU eviction, ours' tree and the replay's pools. Subclasses override what
    their upstream does differently."""

    name = "base"
    compat: str | None = None
    sglang_rules: bool = False  # SGLang's head-room and eviction amounts (CacheManager)
    strategy: str = "no_buffer"
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
    lays_out_memory: ClassVar[bool] = False
    """Whether the class replaces `build_memory` (its upstream lays memory out its own
    way: vLLM's block pool). Set for each subclass when it is defined, never by hand."""
    fixes_page: ClassVar[bool] = False
    """Whether the class replaces `tree_page` (its upstream fixes the tree's page: vLLM's
    block). Set for each subclass when it is defined, never by hand."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.lays_out_memory = cls.build_memory is not BasePolicy.build_memory
        cls.fixes_page = cls.tree_page is not BasePolicy.tree_page

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

    def evict(self, tree: PolicyTree, kv_units: int, states: int) -> EvictResult:
        return tree.evict(kv_tokens=kv_units, states=states)

    def tier_rules(self, profile: ModelProfile) -> TierRules:
        """How this row runs the lower tiers, when a run has them (`policies.tier_rules`):
        ours unless the row models a peer's tiered setup."""
        return OURS


class DefaultPolicy(BasePolicy):
    """The engine's default (ours without a value model): chunk ends and finish as
    SGLang, plus the branch point (where the prompt leaves the cached KV, so the
    next request sharing this prefix hits) and input - 1 instead of the prompt end
    (an identical re-sent prompt then hits, SGLang #22935); the tree's LRU."""

    name = "default"

    def stops(self, req: Request) -> list[int]:
        end = req.total_len - 1
        out = {end} if end > req.computed else set()
        if req.computed < req.kv_hit_len < end:
            out.add(req.kv_hit_len)
        return sorted(out)

    def cache_at(self, req: Request, kind: str) -> bool:
        return kind != PROMPT_END  # input - 1 is already cached


def own_memory(policy: Policy) -> bool:
    """Whether `policy` lays its memory out its own way: a block pool of its own
    (`pool`, or a `build_memory` other than the base's: vLLM's). Wrappers are
    looked through; a policy not built on `BasePolicy` is judged by `pool` alone."""
    inner = _unwrapped(policy)
    return inner.pool is not None or (isinstance(inner, BasePolicy) and inner.lays_out_memory)


def own_page(policy: Policy) -> bool:
    """Whether `policy` fixes the tree's page itself (`tree_page`: vLLM's block)."""
    inner = _unwrapped(policy)
    return isinstance(inner, BasePolicy) and inner.fixes_page


def _unwrapped(policy: Policy) -> Policy:
    from mambaradix.policies.wrap import PolicyWrapper

    while isinstance(policy, PolicyWrapper):
        policy = policy.inner
    return policy


def normalise(xs: list[float]) -> list[float]:
    """Min-max normalisation to [0, 1] (all 0 when every value is equal)."""
    lo, hi = min(xs), max(xs)
    if hi <= lo:
        return [0.0] * len(xs)
    return [(x - lo) / (hi - lo) for x in xs]


def evict_in_order(
    tree: PolicyTree, order: list[TreeNode], kv_units: int, states: int
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
