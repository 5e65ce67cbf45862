"""`check_tree`: the O(n) invariant check behind `MambaRadixCache.check_invariants`.

Invariants (numbering of the SGLang reference, sections 3 and 8):
  I1  root: unlisted, locked once for each resource, no state
  I2  every node: non-empty key, len(key) == len(value), whole pages (default
      mode), registered in its parent under its own child key, parent link back
  I3  a leaf holds a state (compat="sglang-0.5.23": a leaf may hold KV only, as
      upstream keeps a state-less ancestor of a deleted leaf)
  I4  a tombstone holds no state lock and is not in the state list
  I5  KV lock >= state lock; a node's KV lock = its children's KV locks + the
      locks anchored on it, and each anchored lock holds the state lock
  I6  evictable / protected counters equal a recount
  I7  KV list = all non-root nodes (default mode: but the parked ones, each internal
      and older than every listed node); state list = all nodes holding a state;
      `node_count()` counts every non-root node
  I8  both lists: symmetric links, strictly decreasing stamps MRU -> LRU
  I9  no KV index and no state slot is held twice; the tree's record of held state
      slots and its KV owner's record of held KV indices (what `insert` checks
      against, core/ownership.py) are exact
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mambaradix.core.node import Resource, TreeNode

if TYPE_CHECKING:
    from mambaradix.core.tree import MambaRadixCache

KV, STATE = Resource.KV, Resource.STATE


def _fail(node: TreeNode, what: str) -> None:
    raise AssertionError(f"invariant violated at {node!r} (path {_path(node)}): {what}")


def _path(node: TreeNode) -> str:
    ids = []
    x: TreeNode | None = node
    while x is not None:
        ids.append(str(x.id))
        x = x.parent
    return "/".join(reversed(ids))


def check_tree(tree: MambaRadixCache) -> None:
    root = tree.root
    if root.state is not None or root.kv.lock != 1 or root.st.lock != 1:
        _fail(root, "I1 root must hold no state and exactly one lock per resource")
    if root.kv.prev is not None or root.st.prev is not None:
        _fail(root, "I1 root must not be listed")
    nodes = tree._nodes()
    evictable, protected = [0, 0], [0, 0]
    for node in nodes:
        _check_node(tree, node)
        res_kv = protected if node.kv.lock else evictable
        res_kv[KV] += len(node.value)
        if node.state is not None:
            res_st = protected if node.st.lock else evictable
            res_st[STATE] += 1
    if evictable != tree._evictable or protected != tree._protected:
        raise AssertionError(
            f"I6 counters evictable={tree._evictable} protected={tree._protected}, "
            f"recount evictable={evictable} protected={protected}"
        )
    _check_lists(tree, nodes)
    kv = _check_ownership(nodes)
    if tree._kv_owner is not None and kv != tree._kv_owner.tree_indices():
        raise AssertionError("I9 the KV owner's record of the tree's KV indices is out of date")
    if tree._held_states != {n.state for n in nodes if n.state is not None}:
        raise AssertionError("I9 the tree's record of held state slots is out of date")


def _check_node(tree: MambaRadixCache, node: TreeNode) -> None:
    parent = node.parent
    if parent is None:
        _fail(node, "I2 a listed node has no parent")
        return
    if len(node.key) == 0 or len(node.key) != len(node.value):
        _fail(node, f"I2 key has {len(node.key)} tokens, value {len(node.value)} indices")
    if not tree._sglang and len(node.key) % tree.page_size:
        _fail(node, f"I2 edge of {len(node.key)} tokens is not whole pages of {tree.page_size}")
    ns = node.namespace if parent is tree.root else None
    if parent.children.get(tree._child_key(parent, node.key, 0, ns)) is not node:
        _fail(node, "I2 not registered in its parent under its own child key")
    if parent is not tree.root and node.namespace != parent.namespace:
        _fail(node, "I2 namespace differs from its parent's")
    if not node.children and node.state is None and not tree._unified:
        _fail(node, "I3 a leaf must hold a state")
    if node.state is None and (node.st.lock or node.st.prev is not None):
        _fail(node, "I4 a tombstone must be unlocked for state and not in the state list")
    if node.kv.lock < node.st.lock or node.kv.lock < 0 or node.st.lock < 0:
        _fail(node, f"I5 KV lock {node.kv.lock} < state lock {node.st.lock}")
    anchored = node.kv.lock - sum(c.kv.lock for c in node.children.values())
    if anchored != node.st.lock:
        _fail(node, f"I5 {anchored} locks anchored here but state lock is {node.st.lock}")


def _check_lists(tree: MambaRadixCache, nodes: list[TreeNode]) -> None:
    kv_links = tree.lru[KV].check("KV")
    st_links = tree.lru[STATE].check("state")
    if tree.node_count() != len(nodes):
        raise AssertionError(f"I7 node_count() {tree.node_count()} but {len(nodes)} nodes")
    parked = [n for n in nodes if n.kv.prev is None]
    if {id(link.node) for link in kv_links} != {id(n) for n in nodes if n.kv.prev is not None}:
        raise AssertionError("I7 KV list holds a link of a node not in the tree")
    if parked and not tree._lazy_kv:
        _fail(parked[0], "I7 not in the KV list")
    oldest_listed = kv_links[-1].stamp if kv_links else None
    for unlisted in parked:
        if not unlisted.children:
            _fail(unlisted, "I7 a leaf is parked (out of the KV list)")
        if oldest_listed is not None and unlisted.kv.stamp >= oldest_listed:
            _fail(unlisted, "I7 a parked node is not older than every listed one")
    holders = {id(n) for n in nodes if n.state is not None}
    if {id(link.node) for link in st_links} != holders:
        raise AssertionError("I7 state list is not exactly the set of nodes holding a state")
    for links, res in ((kv_links, KV), (st_links, STATE)):
        for link in links:
            node = link.node
            assert node is not None
            if (node.kv if res == KV else node.st) is not link:
                _fail(node, f"I7 {res.name} link does not belong to its node")


def _check_ownership(nodes: list[TreeNode]) -> set[int]:
    """Check that no KV index or state slot is held twice; return the KV indices."""
    seen_kv: set[int] = set()
    seen_states: set[int] = set()
    for node in nodes:
        before = len(seen_kv)
        seen_kv.update(node.value)
        if len(seen_kv) != before + len(node.value):
            _fail(node, "I9 a KV index is held twice")
        if node.state is not None:
            if node.state in seen_states:
                _fail(node, f"I9 state slot {node.state} is held twice")
            seen_states.add(node.state)
    return seen_kv
