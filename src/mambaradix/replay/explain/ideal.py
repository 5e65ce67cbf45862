"""The ideal structure, computed as `replay.bound` computes the bound.

Per request, in trace order: the bound in units (the longest prefix of its
prompt, less its last unit, shared with an earlier request's prompt and
answer), the same against what a serving engine can hold of those requests
(prompt and answer but the answer's last unit, whose KV is never computed),
and one earlier request whose sequence holds the bound's prefix.
"""

from __future__ import annotations

from array import array
from typing import NamedTuple

from mambaradix.core.node import TreeNode
from mambaradix.core.tree import MambaRadixCache
from mambaradix.replay.progress import track
from mambaradix.replay.trace import Trace, TraceRequest


class Ideal(NamedTuple):
    bound: list[int]  # units; `bound_hit_tokens` is these in tokens
    computable: list[int]  # units, <= bound
    source: list[int]  # trace index of an earlier request holding the prefix (-1: none)


def computable(r: TraceRequest) -> array[int]:
    """What serving `r` can leave in a cache: its prompt and its answer but
    the answer's last unit (no KV is ever computed for it)."""
    return r.input_units + r.output_units[: max(0, len(r.output_units) - 1)]


class Prefixes:
    """Sequences added so far, in a core tree that never evicts: the longest
    common prefix of a key with any of them, and the deepest of their ends
    within a key."""

    __slots__ = ("tree", "_next")

    def __init__(self) -> None:
        self.tree = MambaRadixCache(page_size=1, chunk_size=1)
        self._next = 0

    def add(self, seq: array[int], mark: int | None = None) -> None:
        """Add `seq`; its end holds `mark` (default: a fresh number) unless an
        earlier sequence ends there too."""
        if not seq:
            return
        n = self._next
        self._next += len(seq) + 1
        # KV indices are irrelevant here, but the tree refuses one it already holds.
        self.tree.insert(seq, range(n, n + len(seq)), state=n + len(seq) if mark is None else mark)

    def common(self, key: array[int]) -> int:
        return self.tree.match_prefix(key, read_only=True).kv_hit_len if key else 0

    def deepest_end(self, key: array[int]) -> int:
        return self.tree.match_prefix(key, read_only=True).prefix_len if key else 0


def ideal(trace: Trace) -> Ideal:
    full, held = Prefixes(), Prefixes()
    bound, comp, source = [], [], []
    for i, r in enumerate(track(trace.requests, "bound", len(trace), " requests")):
        key = r.input_units[:-1]
        m = full.common(key)
        bound.append(m)
        comp.append(min(m, held.common(key)))
        source.append(_holder(full.tree, key, m) if m else -1)
        full.add(r.input_units + r.output_units, mark=i)
        held.add(computable(r))
    return Ideal(bound, comp, source)


def _holder(tree: MambaRadixCache, key: array[int], m: int) -> int:
    """The request whose sequence ends at the node holding position m - 1 of
    `key`, or, if none ends there, one that ends below it."""
    node: TreeNode = tree.root
    off = 0
    while off < m:
        node = node.children[key[off]]  # page 1, no namespace: children by first token
        off += len(node.key)
    while node.state is None:
        node = next(iter(node.children.values()))
    return int(node.state)
