"""Checkpoint admission and eviction policies, each a small plug-in on the same tree.

A policy answers three questions for the serving model (`sim.py`):

* `stops(req, n_in, committed)`: at which positions (in units, beyond what the
  request reused) to checkpoint a state while computing it. Positions up to
  `n_in` happen during prefill, later ones during decode.
* `finish_insert`: whether the finished sequence is inserted with its final
  state (the "last decoded token" checkpoint).
* `evict(tree, kv_units, states)`: what to free when a pool runs short.

    sglang       compat="sglang"; every prefill chunk end, prompt end, finish; LRU
    sglang-used  0.5.16+ (#31643): same checkpoints; LRU refreshing only the used state
    vllm         align mode: block-aligned positions only; LRU
    marconi      branch point + last decoded token; FLOP-aware utility, alpha tuned
    mambaradix   branch point + last prompt unit + finish; GreedyDual on FLOPs saved
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
    name = "base"
    compat: str | None = None
    finish_insert: bool = True

    def attach(self, ctx: PolicyContext) -> None:
        self.ctx = ctx

    def stops(self, req: Request, n_in: int, committed: int) -> list[int]:
        raise NotImplementedError

    def evict(self, tree: MambaRadixCache, kv_units: int, states: int) -> EvictResult:
        return tree.evict(kv_tokens=kv_units, states=states)

    def on_admit(self, tree: MambaRadixCache, req: Request) -> None:
        """Called after a request matched (and locked) its prefix."""

    def on_request_done(self, req: Request) -> None:
        """Called once per finished request (for tuning)."""

    def should_finish_insert(self, req: Request) -> bool:
        """Insert the finished sequence with its final state?"""
        return self.finish_insert

    def on_checkpoint(self, node: TreeNode, position: int, final: bool) -> None:
        """Called with the node holding a state the request just cached (at
        `position` units; `final` for the finished sequence)."""

    def _chunk_ends(self, start: int, end: int) -> list[int]:
        c = self.ctx.chunk_units
        return list(range(start + c, end, c))


class SGLang(Policy):
    """SGLang 0.5.15.post1, no_buffer: a state at every prefill chunk end and at
    the prompt end (cache_unfinished_req), and at finish (cache_finished_req)."""

    name = "sglang"
    compat: str | None = "sglang"

    def stops(self, req: Request, n_in: int, committed: int) -> list[int]:
        return [*self._chunk_ends(req.computed, n_in), n_in] if n_in > req.computed else []


class SGLangUsed(SGLang):
    """SGLang 0.5.16+: the same checkpoints; a match refreshes only the state it uses."""

    name = "sglang-used"
    compat = None


class VLLM(Policy):
    """vLLM's "align" mode: states only at block boundaries, one at the last
    boundary of each scheduler step (prefill chunks are block aligned) and one
    whenever decoding crosses a boundary. The block is vLLM's unified block,
    per layer as vLLM computes it (`ModelProfile.vllm_block_tokens`)."""

    name = "vllm"
    finish_insert = False

    def attach(self, ctx: PolicyContext) -> None:
        super().attach(ctx)
        self.block_units = max(1, -(-ctx.profile.vllm_block_tokens // ctx.unit_tokens))

    def stops(self, req: Request, n_in: int, committed: int) -> list[int]:
        b = self.block_units
        chunk = max(b, self.ctx.chunk_units // b * b)
        start = req.computed
        ends = [*range(start + chunk, n_in, chunk), n_in]
        out = sorted({e // b * b for e in ends if e // b * b > start})
        last = out[-1] if out else start
        out += list(range((max(last, n_in) // b + 1) * b, committed + 1, b))  # decode crossings
        return out


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
        self.tuner: Callable[[float], float] | None = None  # set by the simulator

    def stops(self, req: Request, n_in: int, committed: int) -> list[int]:
        branch = req.kv_hit_len
        return [branch] if req.computed < branch < n_in else []

    def on_request_done(self, req: Request) -> None:
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
    leaves the cached KV: the next request sharing this prefix hits, Marconi's
    speculative insertion without its extra pass) and its finished sequence
    (the next turn). A third kind, the state at the last prompt unit, makes an
    identical or retried prompt hit (#22935) and, on block traces, the last
    full block that the next turn shares (Mooncake, whose outputs never
    recur). It is admitted whenever a state slot is free (it displaces
    nothing), and under pressure only once such states have a track record
    (16 admitted while slots were free, or by exploration) of being reused
    often enough, at least 2%
    of them and at least a quarter of the finished states' rate (finished
    states usually cover the same path); otherwise once in 32, to notice a
    change. A request's prompt state is demoted to the bottom as soon as its
    own finished state lands below it. The finished sequence is skipped only
    when finished states are never reused and the prompt state already put
    the request in the tree. No chunk-end checkpoints: they rarely match and
    each costs a state.

    Eviction: GreedyDual-Size-Frequency. A state's priority is
    L + hits * (prefill FLOPs it saves over the nearest cached state above it),
    per state slot, or per KV unit when KV is short (only leaves free KV);
    the lowest goes first and L rises to its priority, so recency, reuse and
    recompute cost all count."""

    name = "mambaradix"
    kinds = ("branch", "prompt", "finish")
    warmup, min_useful, relative, explore_every = 16, 0.02, 0.5, 32

    def __init__(self) -> None:
        self.inflation = 0.0
        self.stats = {k: [0, 0] for k in self.kinds}  # admitted, reused at least once
        self.skipped = dict.fromkeys(self.kinds, 0)
        self.prompt_taken: dict[int, bool] = {}

    def rate(self, kind: str) -> float:
        admitted, useful = self.stats[kind]
        return useful / admitted if admitted else 0.0

    def admits(self, kind: str) -> bool:
        """Finished states and branch points always; a prompt-end state while
        such states are reused often enough, absolutely and relative to the
        finished states that usually cover the same path (see the class doc)."""
        if kind != "prompt" or self.ctx.free_states() > 1:
            return True  # a free slot displaces nothing
        # Under pressure only a kind with a track record (from free-slot times)
        # that earns its keep is admitted.
        admitted = self.stats["prompt"][0]
        rule = max(self.min_useful, self.relative * self.rate("finish"))
        if admitted >= self.warmup and self.rate("prompt") >= rule:
            return True
        self.skipped[kind] += 1
        return self.skipped[kind] % self.explore_every == 0

    def stops(self, req: Request, n_in: int, committed: int) -> list[int]:
        points: dict[int, str] = {}
        if req.computed < req.kv_hit_len < n_in:
            points[req.kv_hit_len] = "branch"
        if n_in - 1 > req.computed and self.admits("prompt"):
            points.setdefault(n_in - 1, "prompt")
        self.pending = points
        self.prompt_taken[id(req)] = "prompt" in points.values()
        return sorted(points)

    def should_finish_insert(self, req: Request) -> bool:
        """Skip the finished sequence only when its states are never reused and
        the prompt-end checkpoint already put this request's prompt in the tree
        (otherwise the insert is what lets later requests find a branch point)."""
        took_prompt = self.prompt_taken.pop(id(req), False)
        useless = self.stats["finish"][0] >= self.warmup and self.rate("finish") < self.min_useful
        return not (useless and took_prompt)

    def on_checkpoint(self, node: TreeNode, position: int, final: bool) -> None:
        kind = "finish" if final else self.pending.get(position)
        if kind is None or node.meta is not None:
            return  # not ours, or the state already existed
        self.stats[kind][0] += 1
        node.meta = [self.inflation + self._value(node), 0.0, kind]
        if final:
            self._demote_prompt_state(node)

    def _demote_prompt_state(self, node: TreeNode) -> None:
        """The request's own prompt-end state now has a descendant state on the
        same path: only a retry of the same prompt can still use it, so it is
        the first to go under pressure (it stays while there is room)."""
        anc = node.parent
        while anc is not None and anc.parent is not None and anc.state is None:
            anc = anc.parent
        meta = anc.meta if anc is not None else None
        if meta is not None and isinstance(meta, list) and meta[2] == "prompt" and meta[1] == 0:
            meta[0] = self.inflation

    def on_admit(self, tree: MambaRadixCache, req: Request) -> None:
        node = req.lock.node if req.lock is not None else None
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
            return EvictResult(0, 0, array("q"), [])
        prio = {id(n): self._priority(n, for_kv) for n in cands}
        order = sorted(cands, key=lambda n: prio[id(n)])
        result = _evict_in_order(tree, order, kv_units, states)
        gone = [prio[id(n)] for n in order if n.state is None or n.parent is None]
        if gone:
            self.inflation = max(self.inflation, max(gone))  # L rises to the evicted priority
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
        # Per KV unit freed: rescale the value part from "per state" to "per unit".
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
        saved = ctx.profile.prefill_flops(start * u, (end - start) * u)
        return saved


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
    "sglang-used": SGLangUsed,
    "vllm": VLLM,
    "marconi": Marconi,
    "mambaradix": MambaRadix,
}


def make_policy(name: str, **kwargs: Any) -> Policy:
    if name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    return POLICIES[name](**kwargs)
