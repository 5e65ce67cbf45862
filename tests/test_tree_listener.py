"""Tree listener hooks: which calls each operation makes, in which order, with what.

Expected call lists are written by hand from the operation's effect on the tree."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from mambaradix import MambaRadixCache
from mambaradix.core.node import TreeNode


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def node_added(self, node: TreeNode) -> None:
        assert node.parent is not None and node in node.parent.children.values()
        self.calls.append(("added", list(node.key), node.state))

    def node_split(self, upper: TreeNode, lower: TreeNode) -> None:
        assert lower.parent is upper and upper.state is None
        self.calls.append(("split", list(upper.key), list(lower.key)))

    def node_removed(self, node: TreeNode) -> None:
        assert node.parent is None
        self.calls.append(("removed", list(node.key)))

    def state_added(self, node: TreeNode) -> None:
        self.calls.append(("state+", list(node.key), node.state))

    def state_removed(self, node: TreeNode) -> None:
        self.calls.append(("state-", list(node.key)))

    def tree_reset(self) -> None:
        self.calls.append(("reset",))

    def take(self) -> list[tuple[Any, ...]]:
        out, self.calls = self.calls, []
        return out


def tree_with(compat: str | None = None) -> tuple[MambaRadixCache, Recorder]:
    tree = MambaRadixCache(page_size=1, compat=compat)
    rec = Recorder()
    tree.add_listener(rec)
    return tree, rec


def test_insert_new_leaf_split_and_revive() -> None:
    tree, rec = tree_with()
    tree.insert([1, 2, 3, 4], [10, 11, 12, 13], state=0)
    assert rec.take() == [("added", [1, 2, 3, 4], 0), ("state+", [1, 2, 3, 4], 0)]
    tree.insert(
        [1, 2, 7], [10, 11, 20], state=1, prev_prefix_len=2
    )  # splits [1,2,3,4] after 2 tokens
    assert rec.take() == [
        ("split", [1, 2], [3, 4]),
        ("added", [7], 1),
        ("state+", [7], 1),
    ]
    tree.insert(
        [1, 2], [10, 11], state=2, prev_prefix_len=2
    )  # the split's upper node: a tombstone, revived
    assert rec.take() == [("state+", [1, 2], 2)]
    tree.insert(
        [1, 2, 3, 4], [10, 11, 12, 13], state=3, prev_prefix_len=4
    )  # already holds a state: nothing
    assert rec.take() == []


def test_state_eviction_tombstones_internal_node_and_deletes_leaf() -> None:
    tree, rec = tree_with()
    tree.insert([1, 2], [10, 11], state=0)
    tree.insert([1, 2, 3], [10, 11, 12], state=1, prev_prefix_len=2)
    rec.take()
    tree.evict_state_of(tree.peek([1, 2]))  # internal: tombstone, KV stays
    assert rec.take() == [("state-", [1, 2])]
    tree.evict(states=1)  # the leaf [3]: its state, its KV, then the childless tombstone
    assert rec.take() == [("state-", [3]), ("removed", [3]), ("removed", [1, 2])]
    assert tree.total_size() == (0, 0)


def test_kv_eviction_reports_every_removed_node() -> None:
    tree, rec = tree_with()
    tree.insert([1, 2, 3], [10, 11, 12], state=0)
    tree.insert([1, 2, 4], [10, 11, 13], state=1, prev_prefix_len=2)
    rec.take()
    tree.evict(kv_tokens=3)  # both leaves go (LRU first), then their tombstone parent
    assert rec.take() == [
        ("state-", [3]),
        ("removed", [3]),
        ("state-", [4]),
        ("removed", [4]),
        ("removed", [1, 2]),
    ]


def test_evict_leaf_and_reset() -> None:
    tree, rec = tree_with()
    tree.insert([5, 6], [1, 2], state=0)
    tree.insert([7], [3], state=1)
    rec.take()
    tree.evict_leaf(tree.peek([7]))
    assert rec.take() == [("state-", [7]), ("removed", [7])]
    tree.reset()
    assert rec.take() == [("reset",)]  # a reset reports no per-node removal


def test_sglang_compat_split_on_match_is_reported() -> None:
    tree, rec = tree_with("sglang-0.5.15.post1")
    tree.insert([1, 2, 3, 4], [10, 11, 12, 13], state=0)
    rec.take()
    tree.match_prefix([1, 2, 9])
    assert rec.take() == [("split", [1, 2], [3, 4])]


def test_default_match_reports_nothing() -> None:
    tree, rec = tree_with()
    tree.insert([1, 2, 3, 4], [10, 11, 12, 13], state=0)
    rec.take()
    m = tree.match_prefix([1, 2, 9])
    tree.dec_lock_ref(tree.inc_lock_ref(m.node))
    assert rec.take() == []


def test_several_listeners_and_removal() -> None:
    tree, first = tree_with()
    second = Recorder()
    tree.add_listener(second)
    tree.insert([1], [1], state=0)
    assert first.take() == second.take() == [("added", [1], 0), ("state+", [1], 0)]
    tree.remove_listener(first)
    tree.insert([2], [2], state=1)
    assert first.take() == [] and len(second.take()) == 2


def test_listener_registration_errors() -> None:
    tree, rec = tree_with()
    with pytest.raises(ValueError, match="already registered"):
        tree.add_listener(rec)
    with pytest.raises(TypeError, match="node_added"):
        tree.add_listener(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not registered"):
        tree.remove_listener(Recorder())
    tree.insert([1], [1], state=0)
    assert len(rec.take()) == 2  # the failed calls changed nothing


# ------------------------------------------------ random operations, a mirror


class Mirror:
    """Rebuilds the tree from the hooks alone: node -> [parent, key, state]. Each
    hook also checks the change it reports is consistent with what came before."""

    def __init__(self) -> None:
        self.nodes: dict[TreeNode, list[Any]] = {}

    def node_added(self, node: TreeNode) -> None:
        assert node not in self.nodes and (node.parent in self.nodes or not node.parent.parent)
        self.nodes[node] = [node.parent, tuple(node.key), None]

    def node_split(self, upper: TreeNode, lower: TreeNode) -> None:
        old_parent, old_key, state = self.nodes[lower]
        assert upper not in self.nodes and old_key == tuple(upper.key) + tuple(lower.key)
        self.nodes[upper] = [old_parent, tuple(upper.key), None]
        self.nodes[lower] = [upper, tuple(lower.key), state]

    def node_removed(self, node: TreeNode) -> None:
        assert not any(entry[0] is node for entry in self.nodes.values()), "a child is left"
        assert self.nodes.pop(node)[2] is None, "removed while it held a state"

    def state_added(self, node: TreeNode) -> None:
        assert self.nodes[node][2] is None
        self.nodes[node][2] = node.state

    def state_removed(self, node: TreeNode) -> None:
        assert self.nodes[node][2] is not None
        self.nodes[node][2] = None

    def tree_reset(self) -> None:
        self.nodes.clear()

    def matches(self, tree: MambaRadixCache) -> None:
        actual = {}
        stack = list(tree.root.children.values())
        while stack:
            node = stack.pop()
            actual[node] = [node.parent, tuple(node.key), node.state]
            stack.extend(node.children.values())
        assert actual == self.nodes


OPS = ["insert", "insert", "insert", "match", "lock", "unlock", "evict", "evict_one", "reset"]


QUICK = {(None, 1), ("sglang-0.5.15.post1", 64), ("sglang-0.5.23", 16)}  # the rest: -m slow


@pytest.mark.parametrize(
    ("compat", "page"),
    [
        (c, p) if (c, p) in QUICK else pytest.param(c, p, marks=pytest.mark.slow)
        for c in (None, "sglang-0.5.15.post1", "sglang-0.5.23")
        for p in (1, 2, 16, 64)
    ],
)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_hooks_rebuild_the_tree_after_random_operations(
    compat: str | None, page: int, data: st.DataObject
) -> None:
    """Every hook call, replayed on a mirror, yields the tree itself after every
    step of a random sequence (inserts sharing prefixes across namespaces, matches
    that split with an SGLang compat, locks, every kind of eviction, resets)."""
    tree = MambaRadixCache(page_size=page, chunk_size=4 * page, compat=compat)
    mirror = Mirror()
    tree.add_listener(mirror)
    fresh_kv, fresh_state, receipts = iter(range(10**6)), iter(range(10**6)), []
    for _ in range(data.draw(st.integers(1, 40), label="steps")):
        op = data.draw(st.sampled_from(OPS), label="op")
        ns = data.draw(st.sampled_from([None, None, "a"]), label="ns")
        pages = data.draw(st.lists(st.integers(0, 2), min_size=0, max_size=5), label="pages")
        key = [t for p in pages for t in [p] * page]
        ragged_ok = compat == "sglang-0.5.15.post1" or op != "insert"  # 0.5.23: whole pages
        if compat and ragged_ok and key and data.draw(st.booleans(), label="ragged"):
            key = key[: -data.draw(st.integers(1, page), label="cut")] if page > 1 else key
        if op == "insert":  # fresh indices, or the tree's own below prev_prefix_len
            cached = tree.match_prefix(key, extra_key=ns, read_only=True).kv_indices
            own = data.draw(st.booleans(), label="own")
            prev = len(cached) if own else 0
            values = list(cached[:prev]) + [next(fresh_kv) for _ in key[prev:]]
            tree.insert(key, values, next(fresh_state), prev, ns)
        elif op == "match":
            tree.match_prefix(key, extra_key=ns, read_only=data.draw(st.booleans()))
        elif op == "lock":
            receipts.append(tree.inc_lock_ref(tree.match_prefix(key, extra_key=ns).node))
        elif op == "unlock" and receipts:
            tree.dec_lock_ref(receipts.pop(data.draw(st.integers(0, len(receipts) - 1))))
        elif op == "evict":
            tree.evict(data.draw(st.integers(0, 12)), data.draw(st.integers(0, 3)))
        elif op == "evict_one" and tree.evictable_states():
            node = data.draw(st.sampled_from(tree.evictable_states()), label="node")
            if not node.children and node.kv.lock == 0:
                tree.evict_leaf(node)
            elif node.children:
                tree.evict_state_of(node)
        elif op == "reset" and not receipts:
            tree.reset()
        tree.check_invariants()
        mirror.matches(tree)
