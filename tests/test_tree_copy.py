"""Pickling and deep-copying a MambaRadixCache at any size (core/snapshot.py).

Before the flat form, both recursed along the LRU links and the parent/child
pointers and overflowed the stack at 100-150 nodes (RecursionError; the trees here
have 550). Each copy is compared with its
original field by field (walked here, iteratively) and then by behaviour: the same
operations on both give the same answers, and the copy shares nothing."""

from __future__ import annotations

import copy
import pickle
import sys
from collections.abc import Callable
from typing import Any

import pytest

import mambaradix.core.node as node_module
from mambaradix import MambaRadixCache

WIDE, DEEP = 400, 150  # leaves under the root; nodes on one path


def build(compat: str | None = None) -> MambaRadixCache:
    """WIDE two-token leaves under the root (a 2*WIDE-link KV list) and one path of
    DEEP nodes (each turn extends the last), some tombstoned, some recently used."""
    cache = MambaRadixCache(chunk_size=2, compat=compat, check_kv=True)
    kv = 0
    for i in range(WIDE):
        cache.insert([10**6 + i, i], [kv, kv + 1], state=i)
        kv += 2
    key: list[int] = []
    for i in range(DEEP):
        key = key + [i, -1]
        cache.insert(key, list(range(kv - len(key) + 2, kv + 2)), WIDE + i, len(key) - 2)
        kv += 2
    cache.evict(states=DEEP // 3)  # tombstones along the path
    for i in range(0, WIDE, 7):
        cache.match_prefix([10**6 + i, i])  # reorder the lists
    cache.check_invariants()
    return cache


def rows(cache: MambaRadixCache) -> dict[str, Any]:
    """Everything a copy must keep, as plain values, walked without recursion."""
    nodes = cache._nodes()
    where = {id(n): i for i, n in enumerate(nodes)}
    where[id(cache.root)] = -1

    def order(lru: Any) -> list[int]:
        out, link = [], lru.head.next
        while link is not lru.tail:
            out.append(where[id(link.node)])
            link = link.next
        return out

    return {
        "nodes": [
            (
                list(n.key),
                list(n.value),
                n.state,
                n.namespace,
                n.kv.lock,
                n.st.lock,
                n.kv.stamp,
                n.st.stamp,
                where[id(n.parent)],
            )
            for n in nodes
        ],
        "lists": [order(cache.lru[0]), order(cache.lru[1])],
        "clocks": [cache.lru[0].clock, cache.lru[1].clock],
        "sizes": [cache.total_size(), cache.full_evictable_size(), cache.state_evictable_size()],
        "held": sorted(cache.kv_owner.tree_indices()),  # type: ignore[union-attr]
        "config": (cache.page_size, cache.chunk_size, cache.compat),
    }


def same_future(a: MambaRadixCache, b: MambaRadixCache) -> None:
    """The same operations on both caches give the same answers (and each takes the
    same new KV indices: a record shared with the other would refuse them)."""
    for cache in (a, b):
        cache.check_invariants()
    for key in ([10**6 + 5, 5], [0, -1, 1, -1, 2, -1], [7, 8]):
        ra, rb = a.match_prefix(key), b.match_prefix(key)
        assert (ra.prefix_len, list(ra.kv_indices)) == (rb.prefix_len, list(rb.kv_indices))
    ea, eb = a.evict(kv_tokens=500, states=200), b.evict(kv_tokens=500, states=200)
    assert (list(ea.freed_kv), ea.freed_states) == (list(eb.freed_kv), eb.freed_states)
    ia = a.insert([7, 8, 9], [10**7, 10**7 + 1, 10**7 + 2], 10**6)
    ib = b.insert([7, 8, 9], [10**7, 10**7 + 1, 10**7 + 2], 10**6)
    assert ia[:3] == ib[:3] and ia.node is not None and ib.node is not None
    assert (ia.node.key, ia.node.state) == (ib.node.key, ib.node.state)
    assert rows(a) == rows(b)


COPIES: dict[str, Callable[[MambaRadixCache], MambaRadixCache]] = {
    "pickle": lambda c: pickle.loads(pickle.dumps(c)),
    "pickle protocol 2": lambda c: pickle.loads(pickle.dumps(c, protocol=2)),
    "deepcopy": copy.deepcopy,
    "copy": copy.copy,  # a shallow copy would share nodes: it copies the tree too
}


@pytest.mark.parametrize("compat", [None, "sglang-0.5.15.post1", "sglang-0.5.23"])
@pytest.mark.parametrize("how", list(COPIES))
def test_a_large_tree_copies_whole(how: str, compat: str | None) -> None:
    original = build(compat)
    before = rows(original)
    assert sys.getrecursionlimit() < 2 * (WIDE + DEEP)  # a recursive copy would overflow
    twin = COPIES[how](original)
    assert type(twin) is MambaRadixCache
    assert rows(twin) == before
    mine = {id(n) for n in original._nodes()}
    assert not mine & {id(n) for n in twin._nodes()}  # nothing shared
    same_future(twin, original)  # same answers, and no refusal of KV the other holds


def test_new_nodes_of_a_copy_get_new_ids() -> None:
    """A cache unpickled in a fresh process must not hand out ids its nodes hold."""
    original = build()
    data = pickle.dumps(original)
    node_module._last_id = 0  # as in a new process
    twin = pickle.loads(data)
    twin.insert([5, 5, 5], [10**8, 10**8 + 1, 10**8 + 2], 10**8)
    ids = [n.id for n in twin._nodes()]
    assert len(ids) == len(set(ids))


def test_refused_while_locks_are_held() -> None:
    cache = build()
    node = cache.match_prefix([10**6 + WIDE - 3, WIDE - 3]).node
    assert node is not cache.root
    receipt = cache.inc_lock_ref(node)
    for how in ("pickle", "deepcopy"):
        with pytest.raises(TypeError, match=r"while locks are held \(2 KV tokens, 1 states"):
            COPIES[how](cache)
    cache.dec_lock_ref(receipt)
    COPIES["pickle"](cache).check_invariants()


class Listener:
    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args: None


def test_refused_with_listeners() -> None:
    cache = build()
    listener = Listener()
    cache.add_listener(listener)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"with listeners \(Listener\).*remove_listener"):
        copy.deepcopy(cache)
    cache.remove_listener(listener)  # type: ignore[arg-type]
    copy.deepcopy(cache).check_invariants()


@pytest.mark.parametrize("part", ["node", "link", "receipt"])
def test_a_node_alone_is_refused_by_name(part: str) -> None:
    cache = build()
    node = cache.match_prefix([10**6 + WIDE - 1, WIDE - 1]).node
    assert node is not cache.root
    obj: object = {"node": node, "link": node.kv}.get(part)
    if part == "receipt":
        obj = cache.inc_lock_ref(node)
    for how in (pickle.dumps, copy.deepcopy, copy.copy):
        with pytest.raises(TypeError, match="is not pickled or copied on its own"):
            how(obj)


def test_a_tree_attached_to_a_kv_pool_is_not_copied() -> None:
    """The pool records which of its slots the tree holds: a copy would hold them twice."""
    from mambaradix.pools import TokenKVAllocator

    kv = TokenKVAllocator(16)
    cache = MambaRadixCache()
    cache.attach_kv_owner(kv)
    got = kv.alloc(2)
    assert got is not None
    cache.insert([1, 2], got, 0)
    with pytest.raises(TypeError, match="attached to a KV pool"):
        copy.deepcopy(cache)
