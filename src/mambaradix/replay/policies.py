"""Checkpoint admission and eviction policies, each a small plug-in on the same
tree and the same scheduler.

A policy is a `mambaradix.scheduler.CheckpointPolicy` (where states are
checkpointed: `stops`, `cache_at`, `insert_at_finish`, callbacks) plus an
eviction rule (`evict(tree, kv_units, states)`, the cache manager's evictor),
the tree behaviour (`compat`) and the lifecycle strategy (`strategy`).

    sglang               SGLang 0.5.15.post1, no_buffer: every prefill chunk end,
                         the prompt end (if decoding goes on), finish; LRU;
                         SGLang's scheduler rules (compat tree)
    sglang-extra-buffer  SGLang 0.5.15.post1's default for these models:
                         extra_buffer tracking (chunk-aligned prefill positions,
                         the branching point, every track_interval in decode)
    sglang-used          0.5.16+ (#31643): sglang's checkpoints; LRU refreshing
                         only the used state
    vllm                 align mode: block-aligned positions only; LRU
    marconi              branch point + last decoded token; FLOP-aware utility,
                         alpha tuned
    mambaradix           branch point + last prompt unit + finish; GreedyDual on
                         FLOPs saved
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mambaradix.core.node import TreeNode
from mambaradix.core.results import EvictResult
from mambaradix.core.tree import MambaRadixCache
from mambaradix.lifecycle import Request
from mambaradix.scheduler import CHUNK, DECODED, FINISH, PROMPT_END, STOP, DefaultCheckpoints

if TYPE_CHECKING:
    from mambaradix.replay.models import ModelProfile


@dataclass
class PolicyContext:
    """What a policy may know about the run."""

    profile: ModelProfile
    unit_tokens: int  # tokens per tree unit (1, or 512 for Mooncake blocks)
    chunk_units: int  # prefill chunk size in units
    kv_unit_bytes: int
    kv_capacity: int = 0  # KV pool size in units
    state_capacity: int = 0  # state pool size in slots
    free_states: Callable[[], int] = lambda: 0  # state slots free right now


class Policy:
    """The base: SGLang's checkpoints, the tree's LRU eviction."""

    name = "base"
    compat: str | None = None
    sglang_rules = False  # SGLang's head-room and eviction amounts (CacheManager)
    strategy = "no_buffer"
    finish_insert = True
    decode_interval: int | None = None  # no_buffer: checkpoint every N decoded units

    def attach(self, ctx: PolicyContext) -> None:
        self.ctx = ctx

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

    def evict(self, tree: MambaRadixCache, kv_units: int, states: int) -> EvictResult:
        return tree.evict(kv_tokens=kv_units, states=states)


class DefaultPolicy(Policy):
    """The engine's default: `DefaultCheckpoints` (chunk ends, the branch
    point, input - 1, finish) with the tree's LRU eviction."""

    name = "default"

    def stops(self, req: Request) -> list[int]:
        return DefaultCheckpoints().stops(req)

    def cache_at(self, req: Request, kind: str) -> bool:
        return kind != PROMPT_END


class SGLang(Policy):
    """SGLang 0.5.15.post1, no_buffer: a state at every prefill chunk end and at
    the prompt end (cache_unfinished_req), and at finish (cache_finished_req)."""

    name = "sglang"
    compat: str | None = "sglang"
    sglang_rules = True


class SGLangExtraBuffer(SGLang):
    """SGLang 0.5.15.post1's default strategy for Nemotron-H and Qwen3-Next:
    extra_buffer (ping-pong track slots, states only at tracked positions)."""

    name = "sglang-extra-buffer"
    strategy = "extra_buffer"


class SGLangUsed(SGLang):
    """SGLang 0.5.16+: the same checkpoints; a match refreshes only the state it
    uses (#31643). Departure: our tree's read-only match also never splits an
    edge on lookup (0.5.16 still does)."""

    name = "sglang-used"
    compat = None


class VLLM(Policy):
    """vLLM's "align" mode: states only at block boundaries: the last boundary
    a prefill step reaches and every boundary decoding crosses; no partial
    block is cached (no finish insert). The block is vLLM's unified block, per
    layer as vLLM computes it (`ModelProfile.vllm_block_tokens`). Departure:
    our scheduler's chunks are not block aligned, so a chunk's state is taken
    at the last block boundary inside it (a stop there)."""

    name = "vllm"
    finish_insert = False

    def attach(self, ctx: PolicyContext) -> None:
        super().attach(ctx)
        self.block_units = max(1, -(-ctx.profile.vllm_block_tokens // ctx.unit_tokens))
        self.decode_interval = self.block_units

    def stops(self, req: Request) -> list[int]:
        b, n_in = self.block_units, req.total_len
        chunk = max(b, self.ctx.chunk_units // b * b)
        ends = [*range(req.computed + chunk, n_in, chunk), n_in]
        return sorted({e // b * b for e in ends if req.computed < e // b * b < n_in})

    def cache_at(self, req: Request, kind: str) -> bool:
        return kind == STOP or req.computed % self.block_units == 0


class Marconi(Policy):
    """Marconi (MLSys'25), from the paper: admit a checkpoint at the branch point
    that speculative insertion finds (where the input leaves the cached KV) and
    after the last decoded token: at most two per sequence. Evict by utility
    recency + alpha * FLOP efficiency (both min-max normalised over the nodes with
    at most one child); alpha is tuned once, after the first eviction, by
    replaying recent requests for each alpha and keeping the most FLOPs saved."""

    name = "marconi"
    alphas = (0.0, 0.5, 1.0, 2.0, 4.0)

    def __init__(self, alpha: float | None = None, bootstrap_multiplier: int = 5) -> None:
        self.alpha = 0.0 if alpha is None else alpha
        self.tune = alpha is None
        self.bootstrap = bootstrap_multiplier
        self.requests_seen = 0
        self.first_eviction_at: int | None = None
        self.tuner: Callable[[float], float] | None = None  # set by the replay

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

    def evict(self, tree: MambaRadixCache, kv_units: int, states: int) -> EvictResult:
        if self.first_eviction_at is None:
            self.first_eviction_at = max(1, self.requests_seen)
        # One utility ranking (a full scan, as in Marconi's code) frees a batch of
        # 1% of the pool, so a run costs O(n) per batch instead of per state.
        if kv_units:
            kv_units = max(kv_units, self.ctx.kv_capacity // 100)
        if states:
            states = max(states, self.ctx.state_capacity // 100)
        ranked = self._ranked(tree, leaves_only=kv_units > 0)
        return _evict_in_order(tree, ranked, kv_units, states)

    def _ranked(self, tree: MambaRadixCache, leaves_only: bool) -> list[TreeNode]:
        cands = [n for n in tree.evictable_states() if len(n.children) <= (0 if leaves_only else 1)]
        if not cands:
            return []
        now = tree.lru[1].clock + 1
        recency = [1.0 / (now - n.st.stamp) for n in cands]
        eff = [self._flop_efficiency(n) for n in cands]
        r, e = _normalise(recency), _normalise(eff)
        scores = [ri + self.alpha * ei for ri, ei in zip(r, e, strict=True)]
        order = sorted(range(len(cands)), key=scores.__getitem__)
        return [cands[i] for i in order]

    def _flop_efficiency(self, node: TreeNode) -> float:
        """FLOPs a hit on this node saves over its parent, per byte it holds
        (cached per node: it changes only when a split shortens the edge)."""
        meta = node.meta
        if meta is not None and meta[0] == len(node.key):
            return float(meta[2])
        ctx = self.ctx
        end = meta[1] if meta is not None else node.depth_tokens()
        start = end - len(node.key)
        u = ctx.unit_tokens
        saved = ctx.profile.prefill_flops(start * u, (end - start) * u)
        held = len(node.key) * ctx.kv_unit_bytes + ctx.profile.state_bytes
        node.meta = (len(node.key), end, saved / held)
        return saved / held


class MambaRadix(Policy):
    """Ours.

    Admission. Every request checkpoints its branch point (where its input
    leaves the cached KV) and its finished sequence. A third kind, the state
    at the last prompt unit, makes an identical or retried prompt hit (#22935)
    and, on block traces, the last full block that the next turn shares. It is
    admitted whenever a state slot is free, and under pressure only once such
    states have a track record of being reused. No chunk-end checkpoints.

    Eviction: GreedyDual-Size-Frequency. A state's priority is
    L + hits * (prefill FLOPs it saves over the nearest cached state above it),
    per state slot, or per KV unit when KV is short; the lowest goes first and
    L rises to its priority."""

    name = "mambaradix"
    kinds = ("branch", "prompt", "finish")
    warmup, min_useful, relative, explore_every = 16, 0.02, 0.5, 32

    def __init__(self) -> None:
        self.inflation = 0.0
        self.stats = {k: [0, 0] for k in self.kinds}  # admitted, reused at least once
        self.skipped = dict.fromkeys(self.kinds, 0)
        self.planned: dict[int, dict[int, str]] = {}  # id(req) -> position -> kind

    def rate(self, kind: str) -> float:
        admitted, useful = self.stats[kind]
        return useful / admitted if admitted else 0.0

    def admits(self, kind: str) -> bool:
        if kind != "prompt" or self.ctx.free_states() > 1:
            return True  # a free slot displaces nothing
        admitted = self.stats["prompt"][0]
        rule = max(self.min_useful, self.relative * self.rate("finish"))
        if admitted >= self.warmup and self.rate("prompt") >= rule:
            return True
        self.skipped[kind] += 1
        return self.skipped[kind] % self.explore_every == 0

    def stops(self, req: Request) -> list[int]:
        points: dict[int, str] = {}
        n_in = req.total_len
        if req.computed < req.kv_hit_len < n_in:
            points[req.kv_hit_len] = "branch"
        if n_in - 1 > req.computed and self.admits("prompt"):
            points.setdefault(n_in - 1, "prompt")
        self.planned[id(req)] = points
        return sorted(points)

    def cache_at(self, req: Request, kind: str) -> bool:
        return kind == STOP

    def insert_at_finish(self, req: Request) -> bool:
        took_prompt = "prompt" in self.planned.get(id(req), {}).values()
        useless = self.stats["finish"][0] >= self.warmup and self.rate("finish") < self.min_useful
        return not (useless and took_prompt)

    def on_cached(self, req: Request, node: TreeNode | None, kind: str) -> None:
        if kind == FINISH:
            self.planned.pop(id(req), None)
            label: str | None = "finish"
        else:
            label = self.planned.get(id(req), {}).get(req.prefix_len)
        if node is None or label is None or node.meta is not None:
            return  # not ours, or the state already existed
        self.stats[label][0] += 1
        node.meta = [self.inflation + self._value(node), 0.0, label]
        if kind == FINISH:
            self._demote_prompt_state(node)

    def _demote_prompt_state(self, node: TreeNode) -> None:
        anc = node.parent
        while anc is not None and anc.parent is not None and anc.state is None:
            anc = anc.parent
        meta = anc.meta if anc is not None else None
        if meta is not None and isinstance(meta, list) and meta[2] == "prompt" and meta[1] == 0:
            meta[0] = self.inflation

    def on_admitted(self, req: Request) -> None:
        node = req.node
        if node is None or node.parent is None or node.state is None:
            return
        meta = self._meta(node)
        if meta[1] == 0 and meta[2] in self.stats:
            self.stats[meta[2]][1] += 1
        meta[1] += 1
        meta[0] = self.inflation + meta[1] * self._value(node)

    def evict(self, tree: MambaRadixCache, kv_units: int, states: int) -> EvictResult:
        for_kv = kv_units > 0
        cands = [n for n in tree.evictable_states() if not (for_kv and n.children)]
        if not cands:
            return tree.evict(kv_tokens=kv_units, states=states)
        prio = {id(n): self._priority(n, for_kv) for n in cands}
        order = sorted(cands, key=lambda n: prio[id(n)])
        result = _evict_in_order(tree, order, kv_units, states)
        gone = [prio[id(n)] for n in order if n.state is None or n.parent is None]
        if gone:
            self.inflation = max(self.inflation, max(gone))
        return result

    def _meta(self, node: TreeNode) -> list[Any]:
        if node.meta is None:
            node.meta = [self.inflation + self._value(node), 0.0, None]
        meta: list[Any] = node.meta
        return meta

    def _priority(self, node: TreeNode, for_kv: bool) -> float:
        meta = self._meta(node)
        if not for_kv:
            return float(meta[0])
        base = float(meta[0]) - self.inflation
        return self.inflation + base / max(1, len(node.key))

    def _value(self, node: TreeNode) -> float:
        """Prefill FLOPs this state saves over the nearest state above it."""
        ctx = self.ctx
        end = node.depth_tokens()
        anc, start = node.parent, end - len(node.key)
        while anc is not None and anc.parent is not None and anc.state is None:
            start -= len(anc.key)
            anc = anc.parent
        u = ctx.unit_tokens
        return ctx.profile.prefill_flops(start * u, (end - start) * u)


def _normalise(xs: list[float]) -> list[float]:
    lo, hi = min(xs), max(xs)
    if hi <= lo:
        return [0.0] * len(xs)
    return [(x - lo) / (hi - lo) for x in xs]


def _evict_in_order(
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
        if node.parent is None or node.state is None or node.st.lock:
            continue  # deleted or tombstoned by an earlier cascade, or locked
        if kv_units > got_kv:
            if node.children or node.kv.lock:
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


POLICIES: dict[str, Callable[[], Policy]] = {
    "sglang": SGLang,
    "sglang-extra-buffer": SGLangExtraBuffer,
    "sglang-used": SGLangUsed,
    "vllm": VLLM,
    "marconi": Marconi,
    "mambaradix": MambaRadix,
}

__all__ = [
    "CHUNK",
    "DECODED",
    "DefaultPolicy",
    "FINISH",
    "POLICIES",
    "PROMPT_END",
    "STOP",
    "MambaRadix",
    "Marconi",
    "Policy",
    "PolicyContext",
    "SGLang",
    "SGLangExtraBuffer",
    "SGLangUsed",
    "VLLM",
    "make_policy",
]


def make_policy(name: str, **kwargs: Any) -> Policy:
    if name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    return POLICIES[name](**kwargs)
