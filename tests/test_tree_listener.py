"""Tree listener hooks: which calls each operation makes, in which order, with what.

Expected call lists are written by hand from the operation's effect on the tree."""

from __future__ import annotations

from typing import Any

import pytest

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
    tree, rec = tree_with("sglang")
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
