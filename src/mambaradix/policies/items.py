"""The items our policy tracks: one per state the tree holds, kept beside the
tree (a listener of its hooks), with the class and age the value model reads,
and the segment ends it learns from."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass

from mambaradix.core.node import TreeNode
from mambaradix.core.results import EvictResult
from mambaradix.policies.seam import PolicyTree

SegmentEnd = Callable[[object, int, bool], None]  # (class, age, by a hit)


@dataclass(slots=True)
class Item:
    kind: str  # where the state was taken
    covered: bool  # a state lies below it
    reused: bool  # it was hit before
    start: int  # clock at the start of its current segment
    flops: float  # prefill FLOPs of the prefix it ends (fixed: splits never move a node's end)
    cls: object = ()  # (kind, covered, reused), or () with classes off


class Items:
    """Items by node; `clock` counts admitted requests (the age unit)."""

    def __init__(
        self,
        tree: PolicyTree,
        on_end: SegmentEnd,
        classes: bool,
        flops: Callable[[int], float],
    ) -> None:
        self.tree = tree
        self.on_end = on_end
        self.flops = flops  # of a prefix of so many units
        self.classes = classes
        self.table: dict[TreeNode, Item] = {}
        self.nodes: list[TreeNode] = []  # the table's keys, for sampling
        self.index: dict[TreeNode, int] = {}
        self.clock = 0
        self.recheck: list[TreeNode] = []  # may have lost the last state below them
        tree.add_listener(self)

    # -------------------------------------------------------------- classes

    def new_class(self, kind: str, covered: bool) -> object:
        return (kind, covered, False) if self.classes else ()

    def _classify(self, item: Item) -> None:
        item.cls = (item.kind, item.covered, item.reused) if self.classes else ()

    def get(self, node: TreeNode) -> Item | None:
        return self.table.get(node)

    # --------------------------------------------------------------- events

    def _end(self, item: Item, hit: bool) -> None:
        self.on_end(item.cls, self.clock - item.start, hit)
        item.start = self.clock

    def add(self, node: TreeNode, kind: str, now: int, covered: bool) -> None:
        """A new state; `covered` also when the request that took it goes on
        past it (its own later states will lie below)."""
        flops = self.flops(node.depth_tokens())
        new = self.table[node] = Item(kind, covered or state_below(node), False, now, flops)
        self._classify(new)
        self.index[node] = len(self.nodes)
        self.nodes.append(node)
        above = state_above(node)
        item = self.table.get(above) if above is not None else None
        if item is not None and not item.covered:
            self._end(item, hit=False)
            item.covered = True
            self._classify(item)

    def hit(self, node: TreeNode, now: int) -> None:
        item = self.table.get(node)
        if item is not None:
            self._end(item, hit=True)
            item.reused = True
            self._classify(item)

    def settle(self) -> None:
        """Items whose last state below was removed are uncovered again."""
        for node in self.recheck:
            item = self.table.get(node)
            if item is not None and item.covered and not state_below(node):
                self._end(item, hit=False)
                item.covered = False
                self._classify(item)
        self.recheck.clear()

    # -------------------------------------------------------- TreeListener

    def node_added(self, node: TreeNode) -> None:
        pass

    def node_split(self, upper: TreeNode, lower: TreeNode) -> None:
        pass

    def _forget(self, node: TreeNode) -> Item | None:
        item = self.table.pop(node, None)
        if item is not None:
            i, last = self.index.pop(node), self.nodes.pop()
            if last is not node:
                self.nodes[i], self.index[last] = last, i
        return item

    def node_removed(self, node: TreeNode) -> None:
        self._forget(node)

    def state_added(self, node: TreeNode) -> None:
        pass

    def state_removed(self, node: TreeNode) -> None:
        item = self._forget(node)
        if item is not None:
            self.on_end(item.cls, self.clock - item.start, False)
        above = state_above(node)
        if above is not None and above in self.table:
            self.recheck.append(above)

    def tree_reset(self) -> None:
        self.table.clear()
        self.nodes.clear()
        self.index.clear()
        self.recheck.clear()

    # ------------------------------------------------------------ geometry

    def saved(self, node: TreeNode, item: Item) -> float:
        """FLOPs a hit on `node` saves over the nearest state above it."""
        above = state_above(node)
        base = self.table.get(above) if above is not None else None
        return item.flops - (base.flops if base is not None else 0.0)

    def kv_freed(self, leaf: TreeNode) -> int:
        """KV units that deleting `leaf` frees: its edge and the tombstones above
        it that it leaves childless."""
        units = len(leaf.key)
        p = leaf.parent
        while p is not None and p.parent is not None:
            if p.state is not None or len(p.children) != 1 or p.kv_lock:
                break
            units += len(p.key)
            p = p.parent
        return units

    # ------------------------------------------------------------ eviction

    def evict(
        self, ranked: Callable[[], list[TreeNode]], done: Callable[[int, int], bool]
    ) -> EvictResult:
        """Evict in the order `ranked()` gives (a leaf with its KV, another
        node's state alone), asking again when a ranking runs out, until
        `done(KV units freed, states freed)` or nothing is left to rank."""
        freed_kv: array[int] = array("q")
        freed_states: list[int] = []
        tree = self.tree
        while not done(len(freed_kv), len(freed_states)):
            order = ranked()
            if not order:
                break
            for node in order:
                if node.parent is None or node.state is None:
                    continue  # gone with an earlier victim
                r = tree.evict_state_of(node) if node.children else tree.evict_leaf(node)
                freed_kv += r.freed_kv
                freed_states += r.freed_states
                if done(len(freed_kv), len(freed_states)):
                    break
        return EvictResult(len(freed_kv), len(freed_states), freed_kv, freed_states)


def state_below(node: TreeNode) -> bool:
    stack = list(node.children.values())
    while stack:
        child = stack.pop()
        if child.state is not None:
            return True
        stack.extend(child.children.values())
    return False


def state_above(node: TreeNode) -> TreeNode | None:
    x = node.parent
    while x is not None and x.parent is not None:
        if x.state is not None:
            return x
        x = x.parent
    return None
