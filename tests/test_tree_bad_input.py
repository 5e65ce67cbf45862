"""Bad input to `MambaRadixCache` is rejected cleanly.

Each case checks two things: the call raises TypeError or ValueError (never a bare
AssertionError) with a non-empty message, and the tree is exactly as it was: its
printout (structure, states, locks), the four sizes, every KV index and state it
holds, and both LRU lists (order and logical clock). Cases that apply to both
behaviours run for compat None and both SGLang releases, with page sizes 1 and 4.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pytest

from driving import tree_snapshot
from mambaradix import LockReceipt, MambaRadixCache

# --------------------------------------------------------------------- helpers


def assert_rejected(
    cache: MambaRadixCache,
    call: Callable[[], object],
    exc: type[Exception] | tuple[type[Exception], ...],
    match: str | None = None,
) -> None:
    """`call` raises `exc` (a message matching `match`) and leaves `cache` unchanged."""
    before = tree_snapshot(cache)
    with pytest.raises(exc, match=match) as info:
        call()
    assert not isinstance(info.value, AssertionError)
    assert str(info.value), "the exception has no message"
    assert tree_snapshot(cache) == before, "a rejected call changed the tree"
    cache.check_invariants()


class Populated(NamedTuple):
    """A tree with branches, a namespace, a tombstone, an evicted node and a held lock."""

    cache: MambaRadixCache
    receipt: LockReceipt  # held on `locked`
    locked: Any  # a node holding a state, locked once
    tombstone: Any  # an internal node whose state was evicted
    evicted: Any  # a node deleted by eviction
    key: list[int]  # the locked key (its end holds a state)
    other_key: list[int]  # a cached key whose state is not locked
    page: int


def populate(compat: str | None, page: int) -> Populated:
    """Build the shared bad-input fixture tree:

    root ── A (tombstone) ─┬─ B (state 2, locked)
     │                     └─ C (state 3)
     └── [ns "lora"] A (state 4)          and a leaf D, evicted (state 5)
    """
    cache = MambaRadixCache(page_size=page, chunk_size=4 * page, compat=compat, check_kv=True)
    p = [[t] * page for t in range(10)]  # p[t]: one page of token t
    a, b, c, d = p[1] + p[2], p[3], p[4] + p[5], p[6]
    kv = iter(range(100, 10_000))

    def put(key: list[int], state: int, ns: Any = None) -> None:
        cache.insert(key, [next(kv) for _ in key], state, extra_key=ns)

    put(a, 1)
    put(a + b, 2)
    put(a + c, 3)
    put(a, 4, ns="lora")
    put(d, 5)
    evicted = cache.match_prefix(d).node
    receipt = cache.inc_lock_ref(cache.match_prefix(a + b).node)
    cache.match_prefix(a + c)
    cache.match_prefix(a, extra_key="lora")
    freed = cache.evict(states=2)  # oldest unlocked states: A's (tombstoned) and D (deleted)
    assert sorted(freed.freed_states) == [1, 5], freed
    tombstone = receipt.node.parent
    assert tombstone.state is None and evicted.parent is None
    cache.check_invariants()
    return Populated(cache, receipt, receipt.node, tombstone, evicted, a + b, a + c, page)


CONFIGS = [
    (compat, page) for compat in (None, "sglang-0.5.15.post1", "sglang-0.5.23") for page in (1, 4)
]


@pytest.fixture(params=CONFIGS, ids=[f"{c or 'default'}-page{p}" for c, p in CONFIGS])
def tree(request: pytest.FixtureRequest) -> Populated:
    return populate(*request.param)


def fresh_kv(n: int) -> list[int]:
    return list(range(50_000, 50_000 + n))


# ------------------------------------------------------------------------ keys

BAD_KEYS = [
    pytest.param(None, id="None"),
    pytest.param("abc", id="str"),
    pytest.param(b"\x01\x02", id="bytes"),
    pytest.param(7, id="int"),
    pytest.param(3.0, id="float"),
    pytest.param([1.5, 2.0], id="list-of-float"),
    pytest.param(["a", "b"], id="list-of-str"),
    pytest.param([1, None], id="None-item"),
    pytest.param([2**70], id="overflow"),
    pytest.param(np.array([1.0, 2.0]), id="numpy-float"),
]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_match_rejects_bad_key(tree: Populated, key: Any) -> None:
    assert_rejected(tree.cache, lambda: tree.cache.match_prefix(key), TypeError, "key")


@pytest.mark.parametrize("key", BAD_KEYS)
def test_insert_rejects_bad_key(tree: Populated, key: Any) -> None:
    kv = fresh_kv(4 * tree.page)
    assert_rejected(tree.cache, lambda: tree.cache.insert(key, kv, 77), TypeError, "key")


# ------------------------------------------------------------------ kv_indices


def test_insert_rejects_kv_length_mismatch(tree: Populated) -> None:
    key = tree.key + [9] * tree.page
    for kv in (fresh_kv(len(key) - 1), fresh_kv(len(key) + 1), []):
        assert_rejected(
            tree.cache, lambda kv=kv: tree.cache.insert(key, kv, 77), ValueError, "kv_indices"
        )


@pytest.mark.parametrize(
    "kv",
    [None, "abcd", 5, 2.5, [1.5, 2.5, 3.5, 4.5]],
    ids=["None", "str", "int", "float", "floats"],
)
def test_insert_rejects_kv_of_wrong_type(tree: Populated, kv: Any) -> None:
    key = [9] * 4 * tree.page
    if isinstance(kv, list):
        kv = kv * tree.page
    assert_rejected(tree.cache, lambda: tree.cache.insert(key, kv, 77), TypeError, "kv_indices")


def own_kv(cache: MambaRadixCache, key: list[int], ns: Any = None) -> list[int]:
    """The tree's KV indices for cached `key`, read without touching the tree (peek)."""
    node = cache.peek(key, extra_key=ns)
    assert node is not None, f"{key} is not cached"
    out: list[int] = []
    while node.parent is not None:
        out[:0] = node.value
        node = node.parent
    return out


def held_elsewhere(tree: Populated) -> int:
    """A KV index the tree holds on a path other than `other_key`'s (in the locked node)."""
    return int(tree.locked.value[0])


@pytest.mark.parametrize("where", ["new-part", "duplicate-part", "past-the-cached-prefix"])
def test_insert_rejects_kv_index_the_tree_holds(tree: Populated, where: str) -> None:
    """The tree takes kv_indices[prefix_len:] and hands back [prev_prefix_len,
    prefix_len) for the caller to free: an index the tree holds in either part would
    end up held twice, or freed while cached. `other_key` is cached (prefix_len = 4
    pages here), `extra` two more pages."""
    cache, page = tree.cache, tree.page
    cached, extra = tree.other_key, [7] * page + [8] * page
    key = cached + extra
    own, held = own_kv(cache, cached), held_elsewhere(tree)
    assert held not in own
    kv = own + fresh_kv(len(extra))
    if where == "new-part":  # a scheduler's call with one bad fresh index
        prev, at = len(cached), len(cached) + page
        msg = "positions from prev_prefix_len"
    elif where == "duplicate-part":  # the caller's own copy of cached KV holds a tree index
        prev, at = page, 2 * page
        kv = own[:prev] + fresh_kv(len(key) - prev)
        msg = "positions from prev_prefix_len"
    else:  # the caller claims more is cached than is: [prefix_len, prev) is taken, checked
        prev, at = len(key), len(cached)
        msg = f"cached only up to {len(cached)} tokens"
    kv[at] = held
    want = rf"^kv_indices\[{at}\] = {held} is already held by the tree.*{msg}"
    call = lambda: cache.insert(key, kv, 77, prev_prefix_len=prev)  # noqa: E731
    assert_rejected(cache, call, ValueError, want)


def test_insert_rejects_the_trees_own_indices_without_prev_prefix_len(tree: Populated) -> None:
    """The classic slip: the matched (tree-owned) indices passed back with
    prev_prefix_len=0. The tree would hand them back as the caller's to free."""
    cache = tree.cache
    key = tree.other_key + [7] * tree.page
    kv = own_kv(cache, tree.other_key) + fresh_kv(tree.page)
    assert_rejected(
        cache, lambda: cache.insert(key, kv, 77), ValueError, rf"^kv_indices\[0\] = {kv[0]} "
    )


@pytest.mark.parametrize("where", ["new-part", "duplicate-and-new", "mid-edge"])
def test_insert_rejects_repeated_kv_index(tree: Populated, where: str) -> None:
    """An index twice in kv_indices[prev_prefix_len:]. "mid-edge": the key leaves a
    cached edge half-way, so an accepted insert would split it (compat or not)."""
    cache, page = tree.cache, tree.page
    if where == "mid-edge":
        cached = tree.other_key[: 3 * page]  # A + the first page of C's 2-page edge
        key = cached + [8] * page + [9] * page
    else:
        cached, key = tree.other_key, tree.other_key + [7] * 2 * page
    prev = 2 * page if where == "duplicate-and-new" else len(cached)
    kv = own_kv(cache, tree.other_key)[:prev] + fresh_kv(len(key) - prev)
    first, again = prev, len(key) - 1
    kv[first] = kv[again] = 66_000
    want = rf"^kv_indices\[{again}\] = 66000 repeats kv_indices\[{first}\]$"
    call = lambda: cache.insert(key, kv, 77, prev_prefix_len=prev)  # noqa: E731
    assert_rejected(cache, call, ValueError, want)


@pytest.mark.parametrize("where", ["first", "inside-a-run", "last"])
def test_insert_rejects_negative_kv_index(tree: Populated, where: str) -> None:
    """KV indices are pool slots (>= 0); a negative one from prev_prefix_len on is
    refused wherever it sits in the new part."""
    cache, cached = tree.cache, tree.other_key
    key = cached + [7] * 2 * tree.page
    prev = len(cached)
    kv = own_kv(cache, cached) + fresh_kv(len(key) - prev)
    at = {"first": prev, "inside-a-run": prev + 1, "last": len(key) - 1}[where]
    kv[at] = -3
    want = rf"^kv_indices\[{at}\] = -3 is negative"
    call = lambda: cache.insert(key, kv, 77, prev_prefix_len=prev)  # noqa: E731
    assert_rejected(cache, call, ValueError, want)


@pytest.mark.parametrize("compat", [None, "sglang-0.5.15.post1", "sglang-0.5.23"])
def test_legal_kv_indices_still_insert(compat: str | None) -> None:
    """The tree's own indices below prev_prefix_len, the caller's own from there on
    (duplicates of cached KV included); indices freed by eviction or reset may come
    back. Hand-computed results."""
    cache = MambaRadixCache(chunk_size=2, compat=compat)
    cache.insert([1, 2], [10, 11], 1)
    m = cache.match_prefix([1, 2])
    r = cache.insert([1, 2, 3, 4], [*m.kv_indices, 12, 13], 2, prev_prefix_len=m.prefix_len)
    assert (r.prefix_len, r.state_existed, list(r.freed_kv)) == (2, False, [])
    # another request computed [1, 2, 3] itself: its copy of [1, 2, 3] comes back
    r = cache.insert([1, 2, 3, 5], [20, 21, 22, 23], 3)
    assert (r.prefix_len, r.state_existed, list(r.freed_kv)) == (3, False, [20, 21, 22])
    # re-inserting a cached key with everything tree-owned: nothing to check, nothing taken
    r = cache.insert([1, 2, 3, 4], [10, 11, 12, 13], 9, prev_prefix_len=4)
    assert (r.prefix_len, r.state_existed, list(r.freed_kv)) == (4, True, [])
    cache.check_invariants()
    assert sorted(cache.all_kv_indices()) == [10, 11, 12, 13, 23]
    e = cache.evict(kv_tokens=1)  # the oldest leaf, [5] (KV 23)
    assert list(e.freed_kv) == [23]
    cache.insert([7], [23], 4)  # a freed index may be handed over again
    freed = cache.reset().freed_kv
    cache.insert([1, 2, 3, 4], list(freed)[:4], 1)
    cache.check_invariants()


# -------------------------------------------------------------- prev_prefix_len


# -------------------------------------------------------------- prev_prefix_len


@pytest.mark.parametrize(
    "prev,exc",
    [
        (-1, ValueError),
        ("len+1", ValueError),
        (1.0, TypeError),
        ("2", TypeError),
        (True, TypeError),
        (None, TypeError),
    ],
    ids=["negative", "past-the-key", "float", "str", "bool", "None"],
)
def test_insert_rejects_bad_prev_prefix_len(tree: Populated, prev: Any, exc: type) -> None:
    key = tree.key + [9] * tree.page  # extends a cached key: an accepted call would change it
    if prev == "len+1":
        prev = len(key) + 1
    kv = fresh_kv(len(key))
    assert_rejected(
        tree.cache,
        lambda: tree.cache.insert(key, kv, 77, prev_prefix_len=prev),
        exc,
        "prev_prefix_len",
    )


# ----------------------------------------------------------------------- state


@pytest.mark.parametrize(
    "state,exc",
    [
        (None, ValueError),
        ("3", TypeError),
        (3.0, TypeError),
        (-1, ValueError),
        (True, TypeError),
        ([3], TypeError),
    ],
    ids=["missing", "str", "float", "negative", "bool", "list"],
)
def test_insert_rejects_bad_state(tree: Populated, state: Any, exc: type) -> None:
    cache = tree.cache
    new_leaf = tree.key + [9] * tree.page
    revive = tree.key[: 2 * tree.page]  # ends on the tombstone
    for key in (new_leaf, revive):
        kv = fresh_kv(len(key))
        assert_rejected(cache, lambda key=key, kv=kv: cache.insert(key, kv, state), exc, "state")


# -------------------------------------------------------------------- evict


@pytest.mark.parametrize(
    "kwargs,exc",
    [
        ({"kv_tokens": -1}, ValueError),
        ({"states": -1}, ValueError),
        ({"kv_tokens": 5, "states": -1}, ValueError),  # nothing evicted before the check
        ({"kv_tokens": 1.5}, TypeError),
        ({"states": 2.0}, TypeError),
        ({"kv_tokens": "3"}, TypeError),
        ({"states": "1"}, TypeError),
        ({"kv_tokens": None}, TypeError),
        ({"states": True}, TypeError),
    ],
    ids=[
        "kv-negative",
        "states-negative",
        "good-kv-bad-states",
        "kv-float",
        "states-float",
        "kv-str",
        "states-str",
        "kv-None",
        "states-bool",
    ],
)
def test_evict_rejects_bad_amounts(tree: Populated, kwargs: dict[str, Any], exc: type) -> None:
    name = "kv_tokens" if "states" not in kwargs else "states"
    assert_rejected(tree.cache, lambda: tree.cache.evict(**kwargs), exc, name)


# -------------------------------------------------------------------- locks


def test_unlock_twice(tree: Populated) -> None:
    cache = tree.cache
    cache.dec_lock_ref(tree.receipt)
    assert not tree.receipt.active
    assert_rejected(cache, lambda: cache.dec_lock_ref(tree.receipt), ValueError, "released")


def test_unlock_twice_by_node(tree: Populated) -> None:
    """The SGLang-style release by node cannot release more than was locked."""
    cache = tree.cache
    cache.dec_lock_ref(tree.locked)
    assert_rejected(cache, lambda: cache.dec_lock_ref(tree.locked), ValueError, "lock")


@pytest.mark.parametrize("thing", [None, 3, "receipt", object()], ids=["None", "int", "str", "obj"])
def test_unlock_non_receipt(tree: Populated, thing: Any) -> None:
    assert_rejected(tree.cache, lambda: tree.cache.dec_lock_ref(thing), TypeError, "LockReceipt")


def test_unlock_node_never_locked(tree: Populated) -> None:
    cache = tree.cache
    node = cache.match_prefix(tree.other_key).node
    assert node.state == 3 and node.st.lock == 0
    assert_rejected(cache, lambda: cache.dec_lock_ref(node), ValueError, "lock")


def test_unlock_receipt_of_another_cache(tree: Populated) -> None:
    other = populate(tree.cache.compat, tree.page)
    before_other = tree_snapshot(other.cache)
    assert_rejected(tree.cache, lambda: tree.cache.dec_lock_ref(other.receipt), ValueError, "tree")
    assert tree_snapshot(other.cache) == before_other and other.receipt.active


def test_lock_node_of_another_cache(tree: Populated) -> None:
    other = populate(tree.cache.compat, tree.page)
    before_other = tree_snapshot(other.cache)
    assert_rejected(tree.cache, lambda: tree.cache.inc_lock_ref(other.locked), ValueError, "tree")
    assert tree_snapshot(other.cache) == before_other  # the failed walk was rolled back


def test_lock_evicted_node(tree: Populated) -> None:
    assert_rejected(tree.cache, lambda: tree.cache.inc_lock_ref(tree.evicted), ValueError, "tree")


def test_lock_node_deleted_by_reset() -> None:
    cache = MambaRadixCache()
    cache.insert([1, 2], [10, 11], 1)
    node = cache.match_prefix([1, 2]).node
    cache.reset()
    assert_rejected(cache, lambda: cache.inc_lock_ref(node), ValueError, "tree")


def test_lock_tombstone(tree: Populated) -> None:
    assert_rejected(
        tree.cache, lambda: tree.cache.inc_lock_ref(tree.tombstone), ValueError, "state"
    )


@pytest.mark.parametrize("thing", [None, 3, "node"], ids=["None", "int", "str"])
def test_lock_non_node(tree: Populated, thing: Any) -> None:
    assert_rejected(tree.cache, lambda: tree.cache.inc_lock_ref(thing), TypeError, "TreeNode")


def test_lock_receipt_instead_of_node(tree: Populated) -> None:
    assert_rejected(
        tree.cache, lambda: tree.cache.inc_lock_ref(tree.receipt), TypeError, "TreeNode"
    )


def test_reset_while_locked(tree: Populated) -> None:
    assert_rejected(tree.cache, tree.cache.reset, RuntimeError, "lock")


# A lock on the root (a match that found nothing) protects nothing, so reset() accepts
# it; releasing that receipt afterwards must still succeed (a scheduler finishing such
# a request after a reset must not crash).
def test_root_receipt_survives_reset() -> None:
    cache = MambaRadixCache()
    receipt = cache.inc_lock_ref(cache.match_prefix([1, 2]).node)  # empty tree: the root
    with contextlib.suppress(RuntimeError):
        cache.reset()
    cache.dec_lock_ref(receipt)
    assert not receipt.active


# ----------------------------------------------------------- pages and namespaces


def test_default_mode_rejects_partial_page_insert() -> None:
    tree = populate(None, 4)
    for key in ([9] * 7, tree.key + [9], [9] * 3):
        kv = fresh_kv(len(key))
        assert_rejected(
            tree.cache,
            lambda key=key, kv=kv: tree.cache.insert(key, kv, 77),
            ValueError,
            "page_size",
        )


@pytest.mark.parametrize(
    "ns", [[1], {"a": 1}, {1}, (1, [2])], ids=["list", "dict", "set", "tuple-with-list"]
)
def test_unhashable_extra_key(tree: Populated, ns: Any) -> None:
    cache, key = tree.cache, tree.key
    kv = fresh_kv(len(key))
    says = "^extra_key must be hashable"  # (1, [2]) is a Hashable instance that cannot hash
    assert_rejected(cache, lambda: cache.match_prefix(key, extra_key=ns), TypeError, says)
    assert_rejected(cache, lambda: cache.insert(key, kv, 77, extra_key=ns), TypeError, says)
    assert_rejected(cache, lambda: cache.peek(key, extra_key=ns), TypeError, says)


# ----------------------------------------------------------------- constructor


@pytest.mark.parametrize(
    "kwargs",
    [
        {"page_size": 0},
        {"page_size": -1},
        {"page_size": 1.5},
        {"page_size": "4"},
        {"page_size": True},
        {"page_size": None},
        {"chunk_size": 0},
        {"chunk_size": -64},
        {"chunk_size": 64.0},
        {"page_size": 4, "chunk_size": 6},
        {"page_size": 16, "chunk_size": 8},
        {"compat": "vllm"},
        {"compat": "SGLang"},
        {"compat": 1},
    ],
    ids=lambda kw: ",".join(f"{k}={v!r}" for k, v in kw.items()),
)
def test_constructor_rejects(kwargs: dict[str, Any]) -> None:
    name = "compat" if "compat" in kwargs else ("chunk_size" if "chunk_size" in kwargs else "page")
    with pytest.raises((TypeError, ValueError), match=name) as info:
        MambaRadixCache(**kwargs)
    assert str(info.value)


def test_constructor_takes_numpy_ints_as_plain_ints() -> None:
    cache = MambaRadixCache(page_size=np.int64(4), chunk_size=np.int32(8))
    assert (cache.page_size, cache.chunk_size) == (4, 8)
    assert type(cache.page_size) is int and type(cache.chunk_size) is int
    cache.insert(list(range(8)), kv_indices=list(range(8)), state=0)
    assert cache.match_prefix(list(range(8))).prefix_len == 8


# ------------------------------------------------------------ state ids, numpy ints


@pytest.mark.parametrize("compat", [None, "sglang-0.5.15.post1", "sglang-0.5.23"])
def test_state_already_held_is_rejected(compat: str | None) -> None:
    cache = MambaRadixCache(compat=compat)
    cache.insert([1, 2], [10, 11], 7)
    before = cache.pretty(), cache.all_kv_indices(), cache.all_states()
    with pytest.raises(ValueError, match="already held"):
        cache.insert([3, 4], [12, 13], 7)
    assert (cache.pretty(), cache.all_kv_indices(), cache.all_states()) == before
    cache.evict(states=1)  # once freed, the slot id may come back
    cache.insert([3, 4], [12, 13], 7)
    cache.check_invariants()


def test_numpy_ints_are_accepted_where_ints_are() -> None:
    import numpy as np

    cache = MambaRadixCache()
    r = cache.insert(
        np.array([1, 2, 3]), np.array([5, 6, 7]), np.int64(2), prev_prefix_len=np.int64(0)
    )
    assert r.prefix_len == 0 and not r.state_existed
    assert cache.evict(kv_tokens=np.int64(3)).kv_tokens == 3
    cache.check_invariants()


def test_old_root_released_by_node_after_reset() -> None:
    cache = MambaRadixCache()
    old_root = cache.match_prefix([1, 2]).node  # empty tree: the root
    cache.inc_lock_ref(old_root)
    cache.reset()
    cache.dec_lock_ref(old_root)  # SGLang-style release by node still works
    cache.check_invariants()
