"""Tree nodes and their per-resource LRU links.

A node's edge holds `key` tokens and their KV indices (`value`); the node may
also hold one recurrent-state slot (`state`), the state after consuming every
token on the root-to-node path. A node whose state is None is a *tombstone*.

Each node owns one `Link` per resource (KV, STATE). A link is both the node's
entry in that resource's LRU list and the home of that resource's lock count,
so the list code never needs to know which resource it serves.

The compiled build (docs/build.md) makes `Link` and `TreeNode` extension types with
typed fields (`node.pxd`); this file stays the reference and the pure-Python fallback.
Node ids come from a module counter (`last_node_id`), not a class attribute: an
extension type's attributes cannot be assigned.
"""

from __future__ import annotations

from array import array
from enum import IntEnum
from typing import Any, NoReturn, SupportsIndex

from mambaradix.core.keys import EMPTY


class Resource(IntEnum):
    KV = 0
    STATE = 1


class Link:
    """Entry of a node in one resource's intrusive LRU list."""

    __slots__ = ("prev", "next", "node", "lock", "stamp")

    def __init__(self, node: TreeNode | None) -> None:
        self.prev: Link | None = None  # None <=> not in the list
        self.next: Link | None = None
        self.node = node
        self.lock = 0
        self.stamp = 0  # logical time of the last move to MRU

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        raise not_alone(self)


_last_id = 0  # the last node id issued (per copy of this module)


def last_node_id() -> int:
    """The last id a `TreeNode` got in this process (ids count up from 1)."""
    return _last_id


def skip_node_ids(upto: int) -> None:
    """New nodes get ids above `upto` (a restored snapshot holds ids up to it)."""
    global _last_id
    _last_id = max(_last_id, upto)


class TreeNode:
    __slots__ = (
        "parent",
        "children",
        "key",
        "value",
        "state",
        "namespace",
        "kv",
        "st",
        "id",
    )

    def __init__(
        self,
        parent: TreeNode | None,
        key: array[int] = EMPTY,
        value: array[int] = EMPTY,
        state: int | None = None,
        namespace: Any = None,
    ) -> None:
        self.parent = parent
        self.children: dict[Any, TreeNode] = {}
        self.key = key
        self.value = value
        self.state = state
        self.namespace = namespace
        self.kv = Link(self)
        self.st = Link(self)
        global _last_id
        _last_id += 1
        self.id = _last_id

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        raise not_alone(self)

    @property
    def is_tombstone(self) -> bool:
        return self.state is None

    @property
    def kv_lock(self) -> int:
        return self.kv.lock

    @property
    def state_lock(self) -> int:
        return self.st.lock

    def depth_tokens(self) -> int:
        """Tokens on the root-to-node path (O(depth))."""
        n, node = 0, self
        while node.parent is not None:
            n += len(node.key)
            node = node.parent
        return n

    def __repr__(self) -> str:
        head = ",".join(str(t) for t in self.key[:4]) + ("..." if len(self.key) > 4 else "")
        return (
            f"TreeNode(id={self.id}, key=[{head}] ({len(self.key)} tokens), state={self.state}, "
            f"kv_lock={self.kv.lock}, state_lock={self.st.lock})"
        )


def not_alone(obj: object) -> TypeError:
    """Nodes and links point into their whole tree: they are copied with it."""
    return TypeError(
        f"a {type(obj).__name__} is not pickled or copied on its own: pickle or copy the "
        "MambaRadixCache that holds it (core/snapshot.py)"
    )
