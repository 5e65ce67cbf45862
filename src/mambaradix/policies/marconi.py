"""Marconi (MLSys'25): judicious admission and FLOP-aware eviction."""

from __future__ import annotations

from collections.abc import Callable

from mambaradix.core.node import TreeNode
from mambaradix.core.results import EvictResult
from mambaradix.lifecycle import Request
from mambaradix.policies import constants as C
from mambaradix.policies.base import (
    BasePolicy,
    NodeTable,
    PolicyContext,
    evict_in_order,
    normalise,
)
from mambaradix.policies.kinds import STOP
from mambaradix.policies.seam import PolicyTree
from mambaradix.validate import as_finite_nonnegative, as_int_nonnegative


class Marconi(BasePolicy):
    """Marconi, from the paper and its simulator: admit a checkpoint at the
    branch point that speculative insertion finds (where the input leaves the
    cached KV) and after the last decoded token: at most two per sequence.
    Evict by utility recency + alpha * FLOP efficiency (both min-max
    normalised over the nodes with at most one child; recency 1 / (now - last
    use), efficiency the FLOPs a hit saves over the node's parent per byte the
    node holds); alpha is tuned once, `MARCONI_BOOTSTRAP` x (requests before
    the first eviction) requests after it, by replaying the last
    `MARCONI_TUNING_WINDOW` requests for each alpha of `MARCONI_ALPHAS` and
    keeping the most FLOPs saved (the replay sets `tuner`). With `alpha` given,
    no tuning (`marconi-oracle` runs each alpha of its grid that way).

    Departures: one ranking frees a batch of `MARCONI_EVICT_BATCH` of the pool
    (Marconi re-ranks per eviction; the result differs only in ties of
    recency, at O(n) per batch instead of per state); the alpha grid is
    `MARCONI_ALPHAS` (Marconi's code: 0, 0.1, ..., 2.0); the window replay
    starts from an empty cache of the same size (Marconi's from a snapshot)."""

    name = "marconi"
    alphas = C.MARCONI_ALPHAS

    def __init__(self, alpha: float | None = None, bootstrap_multiplier: int | None = None) -> None:
        if alpha is not None:
            as_finite_nonnegative(alpha, "alpha", "a finite number >= 0 or None")
        if bootstrap_multiplier is not None:
            as_int_nonnegative(bootstrap_multiplier, "bootstrap_multiplier")
        self.alpha = 0.0 if alpha is None else float(alpha)
        self.tune = alpha is None
        boot = C.MARCONI_BOOTSTRAP if bootstrap_multiplier is None else bootstrap_multiplier
        self.bootstrap = boot
        self.requests_seen = 0
        self.first_eviction_at: int | None = None
        self.tuner: Callable[[float], float] | None = None  # set by the replay

    def attach(self, ctx: PolicyContext) -> None:
        super().attach(ctx)
        assert ctx.tree is not None, "Marconi keeps per-node data: the context needs the tree"
        self.efficiency: NodeTable[float] = NodeTable(ctx.tree, drop_on_split=True)

    def stops(self, req: Request) -> list[int]:
        branch = req.kv_hit_len
        return [branch] if req.computed < branch < req.total_len else []

    def cache_at(self, req: Request, kind: str) -> bool:
        return kind == STOP

    def on_request_done(self) -> None:
        self.requests_seen += 1
        if not self.tune or self.first_eviction_at is None or self.tuner is None:
            return
        if self.requests_seen >= self.first_eviction_at * (1 + self.bootstrap):
            self.alpha = max(self.alphas, key=self.tuner)
            self.tune = False

    def evict(self, tree: PolicyTree, kv_units: int, states: int) -> EvictResult:
        if self.first_eviction_at is None:
            self.first_eviction_at = max(1, self.requests_seen)
        batch = C.MARCONI_EVICT_BATCH
        if kv_units:
            kv_units = max(kv_units, int(self.ctx.kv_capacity * batch))
        if states:
            states = max(states, int(self.ctx.state_capacity * batch))
        ranked = self.ranked(tree, leaves_only=kv_units > 0)
        return evict_in_order(tree, ranked, kv_units, states)

    def ranked(self, tree: PolicyTree, leaves_only: bool) -> list[TreeNode]:
        """Eviction candidates, lowest utility first."""
        most = 0 if leaves_only else 1
        cands = [n for n in tree.evictable_states() if len(n.children) <= most]
        if not cands:
            return []
        now = tree.state_clock() + 1
        recency = [1.0 / (now - tree.state_last_use(n)) for n in cands]
        eff = [self.flop_efficiency(n) for n in cands]
        r, e = normalise(recency), normalise(eff)
        scores = [ri + self.alpha * ei for ri, ei in zip(r, e, strict=True)]
        order = sorted(range(len(cands)), key=scores.__getitem__)
        return [cands[i] for i in order]

    def flop_efficiency(self, node: TreeNode) -> float:
        """FLOPs a hit on this node saves over its parent, per byte it holds
        (kept per node until a split shortens its edge or its state goes)."""
        cached = self.efficiency.get(node)
        if cached is not None:
            return cached
        ctx = self.ctx
        end = node.depth_tokens()
        start = end - len(node.key)
        u = ctx.unit_tokens
        saved = ctx.profile.prefill_flops(start * u, (end - start) * u)
        held = len(node.key) * ctx.kv_unit_bytes + ctx.state_bytes
        self.efficiency[node] = saved / held
        return saved / held
