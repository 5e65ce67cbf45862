"""Pickling and deep-copying a `MambaRadixCache` at any size, without recursion.

The tree is a graph of small objects that point at each other (a node at its parent
and children, each LRU link at its neighbours): pickle and `copy.deepcopy` follow such
pointers recursively and overflow the stack after a few hundred nodes. `freeze` turns
the graph into a flat table instead, walked with a work list: every graph object
(node, link, LRU list) gets an index, and each pointer to one becomes a `Ref` to that
index. `thaw` makes every object first, then sets its fields, so neither direction
recurses deeper than a field's own (shallow) containers.

What travels is the tree and nothing else. Refused, with a TypeError saying why:
* a cache with listeners (they live outside the cache and may hold its nodes);
* a cache attached to a KV pool (`attach_kv_owner`): the pool lives outside the cache
  and records which of its slots the tree holds (a copy would hold them twice);
* a cache with locks held (the `LockReceipt`s would not follow; the copy's locks could
  never be released);
* a node or a link on its own (`TreeNode.__reduce_ex__`): copy the cache that holds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from mambaradix.core.lru import LRUList
from mambaradix.core.node import Link, TreeNode, skip_node_ids
from mambaradix.core.ownership import HeldSet
from mambaradix.core.threads import guard, plain_class

if TYPE_CHECKING:
    from mambaradix.core.tree import MambaRadixCache

GRAPH = (TreeNode, Link, LRUList)  # the classes that point at each other
SKIP = frozenset({"_thread_guard"})  # per-process fields (core/threads.py), never copied


class Ref(NamedTuple):
    """A pointer to graph object `i` of the table."""

    i: int


class _Unset:
    """A slot that was never assigned."""

    def __reduce__(self) -> str:
        return "UNSET"


UNSET = _Unset()


class Frozen(NamedTuple):
    """A cache as flat data: its own fields, and one row per graph object."""

    fields: dict[str, Any]
    table: list[tuple[type, tuple[Any, ...]]]


def slot_names(cls: type) -> tuple[str, ...]:
    """Every `__slots__` name of `cls` and its bases."""
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        slots = vars(klass).get("__slots__", ())
        names += [slots] if isinstance(slots, str) else list(slots)
    return tuple(names)


def refuse(cache: MambaRadixCache) -> None:
    """TypeError if `cache` cannot be copied faithfully (see the module docstring)."""
    if cache._listeners:
        kinds = ", ".join(sorted({type(x).__name__ for x in cache._listeners}))
        raise TypeError(
            f"a MambaRadixCache with listeners ({kinds}) cannot be pickled or copied: they "
            "live outside the cache; remove_listener() first, and add them to the copy"
        )
    owner = cache._kv_owner
    if owner is not None and type(owner) is not HeldSet:
        raise TypeError(
            f"a MambaRadixCache attached to a KV pool ({type(owner).__name__}) cannot be "
            "pickled or copied: the pool records which of its slots this tree holds"
        )
    kv, states = cache.full_protected_size(), cache.state_protected_size()
    if kv or states:
        raise TypeError(
            f"a MambaRadixCache cannot be pickled or copied while locks are held ({kv:,} KV "
            f"tokens, {states:,} states locked): their LockReceipts would not follow it; "
            "release them with dec_lock_ref() first"
        )


def freeze(cache: MambaRadixCache) -> Frozen:
    """`cache` as flat, picklable data (TypeError if refused)."""
    refuse(cache)
    index: dict[int, int] = {}
    objects: list[Any] = []

    def enc(value: Any) -> Any:
        kind = type(value)
        if kind in GRAPH:
            i = index.get(id(value))
            if i is None:
                i = index[id(value)] = len(objects)
                objects.append(value)
            return Ref(i)
        if kind is dict:
            return {enc(k): enc(v) for k, v in value.items()}
        if kind is list:
            return [enc(v) for v in value]
        if kind is tuple:
            return tuple(enc(v) for v in value)
        if kind is set or kind is frozenset:
            return kind(enc(v) for v in value)
        return value

    fields = {k: enc(v) for k, v in vars(cache).items() if k not in SKIP}
    table: list[tuple[type, tuple[Any, ...]]] = []
    while len(table) < len(objects):  # `objects` grows as rows find new pointers
        obj = objects[len(table)]
        # A generic walk over slots: a field added to a node or a link travels too.
        row = tuple(enc(getattr(obj, name, UNSET)) for name in slot_names(type(obj)))
        table.append((type(obj), row))
    return Frozen(fields, table)


def reduce(cache: MambaRadixCache) -> tuple[Any, ...]:
    """`MambaRadixCache.__reduce__`: rebuilt by `restore` from flat data, guarded
    against threads (core/threads.py) if the original is."""
    plain = plain_class(type(cache))
    return (restore, (plain, freeze(cache), plain is not type(cache)))


def restore(cls: type[MambaRadixCache], frozen: Frozen, guarded: bool) -> MambaRadixCache:
    cache = cls.__new__(cls)
    thaw(cache, frozen)
    guard(cache, guarded)
    return cache


def bare(cls: Any) -> Any:
    """An instance of `cls` with no field set (its __init__ not run)."""
    return cls.__new__(cls)


def thaw(cache: MambaRadixCache, frozen: Frozen) -> None:
    """Make `cache` (a bare instance) the cache that `frozen` describes."""
    fields, table = frozen
    if strange := {cls.__name__ for cls, _ in table if cls not in GRAPH}:
        raise TypeError(f"not a MambaRadixCache's data: rows of {', '.join(sorted(strange))}")
    # cls.__new__: object.__new__ for the pure classes; the compiled build's extension
    # types refuse object.__new__ and need their own (fields start as None / 0)
    objects: list[Any] = [bare(cls) for cls, _ in table]

    def dec(value: Any) -> Any:
        kind = type(value)
        if kind is Ref:
            return objects[value.i]
        if kind is dict:
            return {dec(k): dec(v) for k, v in value.items()}
        if kind is list:
            return [dec(v) for v in value]
        if kind is tuple:
            return tuple(dec(v) for v in value)
        if kind is set or kind is frozenset:
            return kind(dec(v) for v in value)
        return value

    for obj, (cls, row) in zip(objects, table, strict=True):
        for name, value in zip(slot_names(cls), row, strict=True):
            if value is not UNSET:
                object.__setattr__(obj, name, dec(value))
    vars(cache).update({k: dec(v) for k, v in fields.items()})
    ids = [obj.id for obj in objects if type(obj) is TreeNode]
    skip_node_ids(max(ids, default=0))  # new nodes of this process stay unique
