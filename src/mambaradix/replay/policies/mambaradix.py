"""Ours (placeholder port of the previous rules; replaced below)."""

from __future__ import annotations

from typing import Any

from mambaradix.core.node import TreeNode
from mambaradix.core.results import EvictResult
from mambaradix.core.tree import MambaRadixCache
from mambaradix.lifecycle import Request
from mambaradix.replay.policies.base import NodeTable, Policy, PolicyContext, evict_in_order
from mambaradix.scheduler import FINISH, STOP

ABLATIONS: dict[str, dict[str, Any]] = {}


class MambaRadix(Policy):
    name = "mambaradix"
    kinds = ("branch", "prompt", "finish")
    warmup, min_useful, relative, explore_every = 16, 0.02, 0.5, 32

    def __init__(self) -> None:
        self.inflation = 0.0
        self.stats = {k: [0, 0] for k in self.kinds}
        self.skipped = dict.fromkeys(self.kinds, 0)
        self.planned: dict[int, dict[int, str]] = {}

    def attach(self, ctx: PolicyContext) -> None:
        super().attach(ctx)
        assert ctx.tree is not None
        self.meta: NodeTable[list[Any]] = NodeTable(ctx.tree)

    def rate(self, kind: str) -> float:
        admitted, useful = self.stats[kind]
        return useful / admitted if admitted else 0.0

    def admits(self, kind: str) -> bool:
        if kind != "prompt" or self.ctx.free_states() > 1:
            return True
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
        if node is None or label is None or node in self.meta:
            return
        self.stats[label][0] += 1
        self.meta[node] = [self.inflation + self._value(node), 0.0, label]
        if kind == FINISH:
            self._demote_prompt_state(node)

    def _demote_prompt_state(self, node: TreeNode) -> None:
        anc = node.parent
        while anc is not None and anc.parent is not None and anc.state is None:
            anc = anc.parent
        meta = self.meta.get(anc) if anc is not None else None
        if meta is not None and meta[2] == "prompt" and meta[1] == 0:
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
        result = evict_in_order(tree, order, kv_units, states)
        gone = [prio[id(n)] for n in order if n.state is None or n.parent is None]
        if gone:
            self.inflation = max(self.inflation, max(gone))
        return result

    def _meta(self, node: TreeNode) -> list[Any]:
        meta = self.meta.get(node)
        if meta is None:
            meta = [self.inflation + self._value(node), 0.0, None]
            self.meta[node] = meta
        return meta

    def _priority(self, node: TreeNode, for_kv: bool) -> float:
        meta = self._meta(node)
        if not for_kv:
            return float(meta[0])
        base = float(meta[0]) - self.inflation
        return self.inflation + base / max(1, len(node.key))

    def _value(self, node: TreeNode) -> float:
        ctx = self.ctx
        end = node.depth_tokens()
        anc, start = node.parent, end - len(node.key)
        while anc is not None and anc.parent is not None and anc.state is None:
            start -= len(anc.key)
            anc = anc.parent
        u = ctx.unit_tokens
        return ctx.profile.prefill_flops(start * u, (end - start) * u)
