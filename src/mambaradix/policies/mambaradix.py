"""Ours: one value model, for admission and for eviction.

Every state the tree holds is an item. Its value is the prefill FLOPs it can
be expected to save per byte it holds, per request served:

    value(i) = density(class_i, age_i) * saved_i / bytes_i

* `saved_i`: the FLOPs a hit on i saves over the nearest state above it
  (what is lost if i goes);
* `bytes_i`: what evicting i frees in the memory that is short: a state slot;
  when KV is short, the KV only i keeps (a leaf's edge and the tombstones
  that go with it); with one shared budget, both, in bytes;
* `density(c, a)`: hits an item of class c at age a can still expect per
  request, learned as the trace runs (`density.HitDensity`). The class says
  where the state was taken (branch point, prompt end, chunk end, finished
  sequence), whether a state lies below it (`covered`) and whether it was
  hit before (`reused`); the age counts admitted requests since it was
  cached, hit, or changed class. How fast value decays with age is learned
  per class, so the recency / efficiency trade-off needs no weight.

Eviction: lowest value first. Admission: every candidate (the branch point,
input - 1, chunk ends, the finished sequence) is cached while that costs no
eviction; otherwise only if its value at age 0 exceeds the lowest value held
(the state it would displace). A finished sequence needs no new slot (it
keeps its running state) and is always cached: it competes in the next
eviction like any other item.

Memory: one byte budget that KV and states draw on together, in every
discipline (as vLLM's one block pool, and as Marconi's simulator): the value
is per byte, so a state and the KV a leaf alone keeps compete for the same
bytes, and no fixed share of memory sits idle for states while KV is short
(or the reverse). Ablation `mambaradix/without-shared-budget`: the split
pools (`ServingConfig.state_fraction`) the SGLang rows run on.

Room: the admission test (SGLang's) counts free and evictable KV only, so on one
budget the cached states' bytes can keep out a request that fits alone, which
is then dropped (nothing in flight will free memory for it). When it hits a
state, before it is matched other states go (lowest value first) until it fits
(`before_match`): dropped, it would lose its hit. Ablation
`mambaradix/without-room`.

Queue: a state that a waiting request would hit now is a hit known in advance:
the request is admitted in `ticks` admissions (its place in the first-come
queue), so the state holds at least 1 / ticks hits per tick until then, its
density if the learned one is lower (`_look_ahead`). Without it, when requests
queue (Marconi's one-at-a-time discipline behind a backlog), a conversation's
next turn waits behind many newer first turns; the learned densities only see
the ages states were kept to, so nothing tells the value model that a state
older than that will be hit, and every conversation's state goes before its
next turn is served. Ablation `mambaradix/without-queue`.

Every constant is in `constants`, each with an ablation (`ABLATIONS`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Any

from mambaradix.core.node import TreeNode
from mambaradix.core.results import EvictResult
from mambaradix.lifecycle import Request
from mambaradix.names import Names
from mambaradix.policies import constants as C
from mambaradix.policies.base import BasePolicy, PolicyContext
from mambaradix.policies.density import HitDensity
from mambaradix.policies.items import Items
from mambaradix.policies.kinds import CHUNK, FINISH, STOP
from mambaradix.policies.seam import PolicyTree
from mambaradix.validate import as_bool, as_finite_nonnegative, as_int_nonnegative


class Label(Names):
    """Where a state was taken, the first part of its class (module docstring): the
    branch point, the prompt end, a chunk end, the finished sequence."""

    BRANCH = "branch"
    PROMPT = "prompt"
    CHUNK_END = "chunk"
    FINISHED = "finish"


BRANCH, PROMPT, CHUNK_END, FINISHED = Label

ABLATIONS: dict[str, dict[str, Any]] = {
    "mambaradix/without-prior": {"prior": 0.0},
    "mambaradix/without-classes": {"classes": False},
    "mambaradix/without-age": {"ages": False},
    "mambaradix/without-size": {"sizes": False},
    "mambaradix/without-admission": {"admission": False},
    "mambaradix/without-prompt-ends": {"prompt_ends": False},
    "mambaradix/without-free-pass": {"free_pass": False},
    "mambaradix/without-sampling": {"sample": 0},
    "mambaradix/without-shared-budget": {"shared_budget": False},
    "mambaradix/without-room": {"room": False},
    "mambaradix/without-tier-split": {"tier_split": False},
    "mambaradix/without-queue": {"queue": False},
}
"""Each ablation row of the evaluation: our policy without one constant or rule."""


@dataclass
class Settings:
    prior: float = C.DENSITY_PRIOR
    classes: bool = True  # class = (kind, covered, reused); else one class
    ages: bool = True  # density by age; else per class only
    sizes: bool = True  # per byte; else per item
    admission: bool = True  # compare with the state displaced; else cache always
    prompt_ends: bool = True  # checkpoint input - 1; else only branch points, chunk ends, finish
    free_pass: bool = True  # split pools: a free state slot admits without comparing
    sample: int = C.RANK_SAMPLE  # rank a sample of this many (0: every evictable state)
    shared_budget: bool = True  # KV and states on one byte budget; else split pools
    room: bool = True  # one budget: evict states to admit a request that would be dropped
    tier_split: bool = True  # with a host or store tier: split pools (`MambaRadix.one_budget`)
    queue: bool = True  # a state a waiting request will hit: at least 1 hit per tick till then

    def __post_init__(self) -> None:
        as_finite_nonnegative(self.prior, "prior")
        names = ("classes", "ages", "sizes", "admission", "prompt_ends", "free_pass")
        for name in (*names, "shared_budget", "room", "tier_split", "queue"):
            as_bool(getattr(self, name), name)
        as_int_nonnegative(self.sample, "sample")


class MambaRadix(BasePolicy):
    """Ours (see the module docstring)."""

    name = "mambaradix"
    admission_kinds = frozenset({STOP, CHUNK})  # `_admit`: value against the state displaced

    def __init__(self, **settings: Any) -> None:
        known = [f.name for f in fields(Settings)]
        if unknown := [k for k in settings if k not in known]:
            raise TypeError(f"unknown setting {', '.join(unknown)}; choose from {', '.join(known)}")
        self.settings = Settings(**settings)
        self.shared_budget = self.settings.shared_budget
        self.density = HitDensity(self.settings.prior)
        self.planned: dict[int, dict[int, Label]] = {}  # id(req) -> position -> label
        self.rng = random.Random(C.RANK_SEED)
        self.known: dict[TreeNode, int] = {}  # state -> ticks until a waiting request hits it
        self.seen: dict[int, tuple[Request, TreeNode | None]] = {}  # waiting: the state it hits

    def one_budget(self, tiered: bool) -> bool:
        """One byte budget on a device alone; with a host or store tier, split pools (which
        demote more states below). Set on the tuning material (`bench/tuning_pairs.py`,
        synthetic multi-turn and agent, seeds 100-104, serving): at 1 GB one budget holds
        10-12 points more on the device alone; with 10 GB of host memory split pools hold
        1.8 and 2.7 points more at 1 GB, -1.1 and +0.1 at 2 GB (docs/methodology.md)."""
        return self.shared_budget and not (tiered and self.settings.tier_split)

    def attach(self, ctx: PolicyContext) -> None:
        super().attach(ctx)
        assert ctx.tree is not None, "our policy keeps per-node data: the context needs the tree"
        self.tree = ctx.tree
        self.items = Items(ctx.tree, self._ended, self.settings.classes, self._flops)

    # ------------------------------------------------------------ admission

    def stops(self, req: Request) -> list[int]:
        points: dict[int, Label] = {}
        n = req.total_len
        if req.computed < req.kv_hit_len < n:
            points[req.kv_hit_len] = BRANCH
        if req.computed < n - 1 and self.settings.prompt_ends:
            points.setdefault(n - 1, PROMPT)
        self.planned[id(req)] = points
        return sorted(points)

    def cache_at(self, req: Request, kind: str) -> bool:
        if kind == STOP:
            label = self.planned.get(id(req), {}).get(req.computed, PROMPT)
        elif kind == CHUNK:
            label = CHUNK_END
        else:
            return False  # the prompt end is taken at input - 1, decoding adds none
        return self._admit(req, label)

    def before_match(self, req: Request) -> None:
        """One byte budget, nothing in flight: make room for `req` in states.

        The admission test counts free and evictable KV only (SGLang's), so a
        request that fits alone beside cached KV but not beside the cached
        states' bytes would be dropped. One that hits a state loses that hit
        (and drops although the hit shrinks what it needs): evict other states,
        lowest value first, until its extend, a page and its state copy fit;
        nothing if even all of them would not make it fit. One that hits
        nothing loses no hit by being dropped, and evicting for it costs hits."""
        ctx = self.ctx
        if not (ctx.shared_memory and self.settings.room) or ctx.cache is None:
            return
        tree, kv = self.tree, ctx.cache.kv
        if tree.full_protected_size():
            return  # requests in flight: one that does not fit now waits for them
        m = tree.match_prefix(req.tokens[: req.total_len - 1], req.extra_key, read_only=True)
        if not m.prefix_len:
            return
        kvb, sb = ctx.kv_unit_bytes, ctx.state_bytes
        copy = -(-sb // kvb)  # the hit's state copy is staged before the admission test
        need = req.total_len - m.prefix_len + ctx.cache.page_size + 1 + copy  # strictly below
        room = kv.available_size() + tree.full_evictable_size() - m.prefix_len
        short = (need - room) * kvb  # bytes
        if short <= 0:
            return
        self.items.settle()
        self._look_ahead()
        others = [n for n in self.items.nodes if n is not m.node and self._evictable(n, "shared")]
        if len(others) * sb < short:
            return  # it does not fit even without them: keep them
        freed = self.items.evict(
            lambda: [n for n in self._ranked("shared") if n is not m.node],
            lambda k, s: s * sb >= short,
        )
        ctx.cache.release(freed)

    def insert_at_finish(self, req: Request) -> bool:
        self.planned.pop(id(req), None)
        return True

    def _admit(self, req: Request, label: Label) -> bool:
        """Free slot: yes. Else: if worth more than the state it displaces."""
        if not self.settings.admission:
            return True
        split = not self.ctx.shared_memory
        if split and self.settings.free_pass and self.ctx.free_states() >= 1:
            return True
        saved = self._flops(req.computed) - self._flops(req.prefix_len)
        cls = self.items.new_class(label, covered=True)  # the request goes on below it
        value = self._density(cls, 0) * saved / self._new_bytes()
        mode = "shared" if self.ctx.shared_memory else "slot"
        lowest = self._lowest(mode)
        return lowest is None or value > lowest

    def _new_bytes(self) -> float:
        return self.ctx.state_bytes if self.ctx.shared_memory and self.settings.sizes else 1.0

    def on_cached(self, req: Request, node: TreeNode | None, kind: str) -> None:
        if node is None:
            return  # the tree had that state already
        if kind == FINISH:
            label = FINISHED
        elif kind == CHUNK:
            label = CHUNK_END
        else:
            label = self.planned.get(id(req), {}).get(req.prefix_len, PROMPT)
        self.items.add(node, label, self.clock, covered=label != FINISHED)

    # ---------------------------------------------------------------- hits

    @property
    def clock(self) -> int:
        return self.items.clock

    def on_admitted(self, req: Request) -> None:
        self.items.clock += 1
        self.density.tick()
        node = req.node
        if node is not None and node.parent is not None and node.state is not None:
            self.items.hit(node, self.clock)

    def _ended(self, cls: object, age: int, hit: bool) -> None:
        self.density.record(cls, age if self.settings.ages else 0, hit)

    def _density(self, cls: object, age: int) -> float:
        return self.density.density(cls, age if self.settings.ages else 0)

    # ------------------------------------------------------------ eviction

    def evict(self, tree: PolicyTree, kv_units: int, states: int) -> EvictResult:
        ctx = self.ctx
        self.items.settle()
        self._look_ahead()
        if ctx.shared_memory:
            kvb, sb = ctx.kv_unit_bytes, ctx.state_bytes
            need = kv_units * kvb + states * sb
            r = self.items.evict(
                lambda: self._ranked("shared"), lambda k, s: k * kvb + s * sb >= need
            )
            short_kv, short_states = 0, -(-max(0, need - r.kv_tokens * kvb - r.states * sb) // sb)
        else:
            mode = "kv" if kv_units else "slot"
            r = self.items.evict(
                lambda: self._ranked(mode), lambda k, s: k >= kv_units and s >= states
            )
            short_kv, short_states = max(0, kv_units - r.kv_tokens), max(0, states - r.states)
        if short_kv or short_states:  # nothing of ours left to pick: the tree's LRU
            more = tree.evict(kv_tokens=short_kv, states=short_states)
            r = EvictResult(
                r.kv_tokens + len(more.freed_kv),
                r.states + len(more.freed_states),
                r.freed_kv + more.freed_kv,
                r.freed_states + more.freed_states,
            )
        return r

    def _look_ahead(self) -> None:
        """`known`: the state each waiting request would hit, and in how many
        ticks (admissions) it is admitted, served first come first. A request
        is matched when first seen waiting, and again only when the state it
        would hit goes (a match per request, not per eviction: queues can hold
        thousands); a state cached on its path after that is not seen (closed
        loop queues a turn after its previous turn's state is cached)."""
        self.known = {}
        if not self.settings.queue:
            return
        tree, table, seen = self.tree, self.items.table, self.seen
        now: dict[int, tuple[Request, TreeNode | None]] = {}
        for ticks, req in enumerate(self.ctx.waiting(), start=1):
            got = seen.get(id(req))
            if got is None or got[0] is not req or (got[1] is not None and got[1] not in table):
                key = req.tokens[: req.total_len - 1]
                m = tree.match_prefix(key, req.extra_key, read_only=True)
                got = (req, m.node if m.prefix_len and m.node in table else None)
            now[id(req)] = got
            if got[1] is not None:
                self.known.setdefault(got[1], ticks)
        self.seen = now

    def _ranked(self, mode: str) -> list[TreeNode]:
        """Evictable states, lowest value first: all of them, or a seeded
        sample of `RANK_SAMPLE` when there are more (LHD's method)."""
        cands = self._candidates(mode)
        values = dict(zip(cands, self._values(cands, mode), strict=True))
        return sorted(cands, key=values.__getitem__)

    def _candidates(self, mode: str) -> list[TreeNode]:
        """What `_ranked` ranks, unordered (the sample draws from the seeded generator)."""
        pool, k = self.items.nodes, self.settings.sample
        cands: list[TreeNode] = []
        if k and len(pool) > k:  # drawn with replacement: repeats do no harm
            drawn = self.rng.choices(pool, k=k)
            cands = list({n: None for n in drawn if self._evictable(n, mode)})
        if not cands:
            cands = [n for n in pool if self._evictable(n, mode)]
        return cands

    def _lowest(self, mode: str) -> float | None:
        """The value `_ranked(mode)` puts first (the same draw; no sort)."""
        self.items.settle()
        self._look_ahead()
        cands = self._candidates(mode)
        return min(self._values(cands, mode)) if cands else None

    @staticmethod
    def _evictable(node: TreeNode, mode: str) -> bool:
        if node.state_lock or node.parent is None:
            return False
        if node.children:
            return mode != "kv"
        return not node.kv_lock

    def _value(self, node: TreeNode, mode: str) -> float:
        return self._values([node], mode)[0]

    def _values(self, nodes: list[TreeNode], mode: str) -> list[float]:
        """Each node's value: density x saved / bytes (the module docstring). The
        policy's inner loop, so what is fixed for the call is read once."""
        items, density = self.items, self.density.density
        table, clock, ages = items.table, items.clock, self.settings.ages
        sized = mode != "slot" and self.settings.sizes
        kvb, sb = self.ctx.kv_unit_bytes, self.ctx.state_bytes
        known = self.known
        out: list[float] = []
        for node in nodes:
            item = table[node]
            d = density(item.cls, clock - item.start if ages else 0)
            ticks = known.get(node)
            if ticks is not None:  # a known hit in `ticks` ticks: at least 1 / ticks per tick
                d = max(d, 1.0 / ticks)
            if not d:
                out.append(0.0)
                continue
            size = 1.0
            if sized:  # what evicting it frees: a leaf's KV too
                kv = 0 if node.children else items.kv_freed(node)
                size = float(max(1, kv)) if mode == "kv" else float(sb + kv * kvb)
            out.append(d * items.saved(node, item) / size)
        return out

    def _flops(self, units: int) -> float:
        return self.ctx.profile.prefill_flops(0, units * self.ctx.unit_tokens)
