"""The hybrid radix tree: KV indices on edges, recurrent-state slots on nodes.

    root
     └── [sys prompt, 512 tok]  state=7          <- state: the SSM state after these tokens
          ├── [turn A, 40 tok]  state=None       <- tombstone: KV kept, state evicted
          │    └── [answer, 90 tok] state=3      <- a leaf always holds a state
          └── [turn B, 55 tok]  state=9

A prefix is reusable only up to the deepest matched node that holds a state
(the match is "cut back" there). Two resources, two LRU lists, two lock counts:
a KV lock covers the node and every ancestor, a state lock covers only the
node. KV eviction deletes unlocked leaves (and tombstones left childless);
state eviction tombstones internal nodes and deletes leaves.

The tree never frees memory: every operation returns the KV indices and state
slots the caller must free. Three behaviours share this code (`core.compat`):

* `compat=None` (default): read-only matching (never splits), page-aligned
  match keys, refresh of only the state a match uses (SGLang #31643), lock
  receipts that record what was locked (#27147).
* `compat="sglang-0.5.15.post1"`: the decisions of SGLang 0.5.15.post1's
  MambaRadixCache, including split-on-match and refreshing the whole matched
  path in both lists.
* `compat="sglang-0.5.23"` (alias "sglang"): the decisions of SGLang 0.5.23's
  UnifiedRadixCache: split-on-match, page-aligned keys, a match refreshes only
  the state it uses, an insert refreshes only the state at its end, and leaf
  deletion keeps state-less ancestors as KV-only leaves (`core.unified`).

Depth-independent refresh (default mode). Eviction only ever compares nodes that
are leaves at the same time, never an ancestor with its descendant, and each
refresh of a node refreshes its whole root path, ancestors older. So a leaf's
recency is the newest stamp its subtree ever received, and the KV list can hold,
instead of every node's own stamp, that newest stamp where it matters: a match
or insert stamps only the deepest node it uses (O(1) for any depth), and a
deleted node hands its stamp, and its place in the list, to its parent when
that is newer than the parent's. Leaves are then in exactly the order full-path
refreshes give (tests/test_eviction_order.py checks it against brute force);
an internal node's own stamp may be stale, and the eviction scan *parks*
(unlists) internal nodes older than every leaf, so it never walks them again:
such a node re-enters the list by a refresh or by taking a deleted child's
place. The SGLang compat modes refresh every node of the path, as upstream.

All refuse bad input that upstream accepts, among it an `insert` whose KV
indices the tree already holds or that repeat one (upstream would hold an index
twice, or hand a cached one back to be freed): the KV pool that owns the slots
answers (attached by `CacheManager`, `core/ownership.py`), or, for a tree alone,
its own record with `check_kv=True`. On valid input an SGLang compat decides
exactly as that release.
"""

from __future__ import annotations

import operator
from array import array
from typing import Any, NoReturn, Protocol, SupportsIndex, runtime_checkable

from mambaradix.core import unified
from mambaradix.core.compat import SGLANG_0_5_15, SGLANG_0_5_23, resolve_compat
from mambaradix.core.keys import EMPTY, as_int_array, check_hashable, common_prefix_len
from mambaradix.core.lru import LRUList
from mambaradix.core.node import Link, Resource, TreeNode, not_alone
from mambaradix.core.ownership import HeldSet, KVOwner
from mambaradix.core.results import EvictResult, InsertResult, MatchResult
from mambaradix.core.threads import guard as guard_threads

try:  # Cython's pure-Python mode (tree.pxd); the pure modules need no Cython at all
    import cython  # type: ignore[import-not-found, unused-ignore]
    from cython.cimports.cpython.array import clone  # type: ignore[import-not-found, unused-ignore]
    from cython.cimports.libc.string import memcmp, memcpy  # type: ignore[import-not-found, unused-ignore]
except (ImportError, AttributeError):  # no Cython; or Cython uncompiled (its shadow module)
    COMPILED = False
else:
    COMPILED = bool(cython.compiled)  # True only in the compiled build

KV, STATE = Resource.KV, Resource.STATE


@runtime_checkable  # `add_listener` refuses what is not one (isinstance)
class TreeListener(Protocol):
    """Told about every change to what a tree caches (see `add_listener`).

    Called in the middle of an operation, right after the change reported; a
    listener must not call into the tree and must not raise."""

    def node_added(self, node: TreeNode) -> None:
        """A new node with KV: `node.key` tokens below `node.parent`."""

    def node_split(self, upper: TreeNode, lower: TreeNode) -> None:
        """An edge was cut: `upper` (new, stateless) took the first tokens and
        is now `lower`'s parent; `lower` kept the rest and its state."""

    def node_removed(self, node: TreeNode) -> None:
        """A node and its KV left the tree (`node.parent` is already None)."""

    def state_added(self, node: TreeNode) -> None:
        """`node` gained a state (a new leaf, or a revived tombstone)."""

    def state_removed(self, node: TreeNode) -> None:
        """`node` lost its state (tombstoned, or a leaf about to be removed)."""

    def tree_reset(self) -> None:
        """Everything was dropped."""


_LISTENER_METHODS = tuple(n for n in vars(TreeListener) if not n.startswith("_"))
_OWNER_METHODS = tuple(n for n in vars(KVOwner) if not n.startswith("_"))


class LockReceipt:
    """What `inc_lock_ref` locked; hand it back to `dec_lock_ref` exactly once."""

    __slots__ = ("node", "state_locked", "active")

    def __init__(self, node: TreeNode, state_locked: bool) -> None:
        self.node = node
        self.state_locked = state_locked
        self.active = True

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        raise not_alone(self)  # a copy could release the same lock twice

    def __repr__(self) -> str:
        state, active = self.state_locked, self.active
        return f"LockReceipt(node={self.node.id}, state_locked={state}, active={active})"


def _positive_int(value: Any, name: str) -> int:
    """`value` as a plain int >= 1 (numpy ints too, as everywhere else in the tree)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be a positive int, got {value!r}")
    n = operator.index(value)
    if n < 1:
        raise ValueError(f"{name} must be a positive int, got {n}")
    return n


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if n < 0:
        raise ValueError(f"{name} must be >= 0, got {n}")
    return n


class MambaRadixCache:
    """Radix tree over token ids for hybrid (attention + recurrent) models.

    page_size: tokens per KV page; keys are matched and stored in whole pages.
    chunk_size: the checkpoint grid used for `branching_len` (a multiple of page_size).
    compat: None for the fixed behaviour, or the SGLang release to reproduce:
        "sglang-0.5.15.post1", "sglang-0.5.23" ("sglang": the current one, 0.5.23).
    check_threads: raise ConcurrentUseError when two threads are inside at once (the
    cache is not thread-safe); None: on under `python -X dev` or MAMBARADIX_CHECK_THREADS=1.
    check_kv: a tree alone checks the KV indices `insert` hands it (never its own, never
    twice) against its own record; a tree attached to a KV pool (`attach_kv_owner`, done
    by `CacheManager`) asks the pool instead, whatever this says.
    """

    def __init__(
        self,
        page_size: int = 1,
        chunk_size: int = 64,
        compat: str | None = None,
        check_threads: bool | None = None,
        check_kv: bool = False,
    ) -> None:
        self.page_size = _positive_int(page_size, "page_size")
        self.chunk_size = _positive_int(chunk_size, "chunk_size")
        page, chunk = self.page_size, self.chunk_size
        if chunk % page:
            raise ValueError(f"chunk_size ({chunk}) must be a multiple of page_size ({page})")
        self.compat = resolve_compat(compat)  # the explicit release name
        self._sglang = self.compat == SGLANG_0_5_15
        self._unified = self.compat == SGLANG_0_5_23
        self._lazy_kv = self.compat is None  # depth-independent KV refresh (see the docstring)
        self._listeners: tuple[TreeListener, ...] = ()  # empty: no cost beyond one check
        if not isinstance(check_kv, bool):
            raise TypeError(f"check_kv must be a bool, got {type(check_kv).__name__}")
        # Who holds each KV index (core/ownership.py); None: unchecked.
        self._kv_owner: KVOwner | None = HeldSet() if check_kv else None
        self._init_tree()
        guard_threads(self, check_threads)  # not thread-safe: a debug guard (core/threads.py)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled and deep-copied as flat data, at any size (core/snapshot.py)."""
        from mambaradix.core.snapshot import reduce

        return reduce(self)

    def __copy__(self) -> MambaRadixCache:
        """A whole copy: a shallow one would share nodes with this cache."""
        import copy

        return copy.deepcopy(self)

    # ------------------------------------------------------------------ setup

    def _init_tree(self) -> None:
        self.root = TreeNode(None)
        # The root is permanently locked for both resources and never listed.
        self.root.kv.lock = self.root.st.lock = 1
        self.lru = (LRUList(), LRUList())
        self._node_total = 0  # non-root nodes (the default mode parks some KV links)
        self._evictable = [0, 0]  # indexed by Resource: KV tokens, states
        self._protected = [0, 0]
        self._held_states: set[int] = set()  # every state slot the tree owns

    def reset(self) -> EvictResult:
        """Empty the tree and return everything it owned (the caller frees it) in
        `freed_kv` / `freed_states`; both counts are 0 (nothing was evicted).

        Raises RuntimeError while any lock is held (receipts would dangle)."""
        if self._protected[KV] or self._protected[STATE]:
            raise RuntimeError("reset() while locks are held; release every lock first")
        freed_kv, freed_states = array("q"), []
        for node in self._nodes():
            freed_kv += node.value
            if node.state is not None:
                freed_states.append(node.state)
        self._init_tree()
        if self._kv_owner is not None:
            self._kv_owner.release(freed_kv)  # back to the caller, who frees it
        for listener in self._listeners:
            listener.tree_reset()
        return EvictResult(0, 0, freed_kv, freed_states)

    def attach_kv_owner(self, owner: KVOwner) -> None:
        """Check every KV index `insert` takes against `owner` (the KV pool whose slots
        the tree caches, see `core/ownership.py`) from now on. The tree must be empty."""
        if not isinstance(owner, KVOwner):
            raise TypeError(
                f"owner must be a KVOwner (with {', '.join(_OWNER_METHODS)}), "
                f"got {type(owner).__name__}"
            )
        if self.root.children:
            raise ValueError("attach_kv_owner() needs an empty tree (reset() it first)")
        self._kv_owner = owner

    @property
    def kv_owner(self) -> KVOwner | None:
        """What the KV indices `insert` takes are checked against (None: nothing)."""
        return self._kv_owner

    def add_listener(self, listener: TreeListener) -> None:
        """Tell `listener` about every later change (see `TreeListener`)."""
        if not isinstance(listener, TreeListener):
            raise TypeError(
                f"listener must be a TreeListener (with {', '.join(_LISTENER_METHODS)}), "
                f"got {type(listener).__name__}"
            )
        if any(x is listener for x in self._listeners):
            raise ValueError("listener is already registered")
        self._listeners += (listener,)

    def remove_listener(self, listener: TreeListener) -> None:
        if not any(x is listener for x in self._listeners):
            raise ValueError("listener is not registered")
        self._listeners = tuple(x for x in self._listeners if x is not listener)

    # ------------------------------------------------------------- key helpers

    def _check_namespace(self, extra_key: Any) -> None:
        if extra_key is not None:
            check_hashable(extra_key, "extra_key")

    def _child_key(self, node: TreeNode, tokens: array[int], off: int, extra_key: Any) -> Any:
        """Key of `node.children` for the edge starting at tokens[off]. Namespaces
        only split the root's children: below it every node shares one namespace."""
        page = self.page_size
        plain = tokens[off] if page == 1 else tuple(tokens[off : off + page])
        if extra_key is not None and node is self.root:
            return (extra_key, plain)
        return plain

    # ------------------------------------------------------------------- match

    def match_prefix(self, key: Any, extra_key: Any = None, read_only: bool = False) -> MatchResult:
        """Longest cached prefix of `key` that ends at a state.

        Mutates only LRU order (and, with an SGLang compat, splits a partially
        matched edge, as SGLang does). The returned indices stay valid while
        `node` is locked. `read_only=True` changes nothing (no refresh, no
        split) and answers the same lengths: a split's upper node holds no
        state, so the match is cut back above it either way (a router asking
        what the tree would serve).
        """
        tokens = as_int_array(key, "key")
        self._check_namespace(extra_key)
        n = len(tokens)
        if not self._sglang and n % self.page_size:
            n -= n % self.page_size  # whole pages only: never an empty split (#28692)
            tokens = tokens[:n]
        if n == 0:
            return MatchResult(0, array("q"), self.root, None, 0)
        split = (self._sglang or self._unified) and not read_only  # SGLang splits on lookup
        path, hit_len = _walk_path(self, tokens, extra_key, split)
        k = _state_depth(path)  # cut back to the deepest state
        values = _path_values(path, k)
        branching = None
        if hit_len > len(values):
            aligned = hit_len - hit_len % self.chunk_size
            floor = len(values) if self._unified else 0  # 0.5.23: past the state only
            branching = aligned if aligned > floor else None
        if k == 0:
            return MatchResult(0, values, self.root, branching, hit_len)
        if not read_only:
            self._refresh_after_match(path, k)
        return MatchResult(len(values), values, path[k - 1], branching, hit_len)

    def _refresh_after_match(self, path: list[TreeNode], k: int) -> None:
        """Make path[:k] MRU in the KV list (ancestors older than descendants);
        in the state list, only the state used (#31643; 0.5.23 too), or with
        compat="sglang-0.5.15.post1" every state on the path."""
        kv_lru, st_lru = self.lru
        _refresh_path(kv_lru, st_lru, path, k, self._lazy_kv, self._sglang)

    def touch(self, node: TreeNode) -> None:
        """Refresh `node` (holding a state) and its path as `match_prefix` of its whole
        key refreshes them, without walking the key (a caller holding the node from
        `insert` re-matches nothing)."""
        if node is self.root:
            return
        self._check_holds_state(node)
        path = self._path_to(node)
        self._refresh_after_match(path, len(path))

    def path_kv(self, node: TreeNode, start: int = 0) -> array[int]:
        """The KV indices of `node`'s root-to-node path from position `start` on (what
        `match_prefix` of its key returns in `kv_indices[start:]`), no key walked."""
        start = _count(start, "start")
        path = self._path_to(node) if node is not self.root else []
        out, at = array("q"), 0
        for x in path:
            at += len(x.value)
            if at > start:
                out += x.value[max(0, start - at + len(x.value)) :]
        return out

    def _path_to(self, node: TreeNode) -> list[TreeNode]:
        """The nodes from the root's child down to `node` (ValueError if not in this tree)."""
        if not isinstance(node, TreeNode):
            raise TypeError(f"expected a TreeNode, got {type(node).__name__}")
        path = []
        x = node
        while x.parent is not None:
            path.append(x)
            x = x.parent
        if x is not self.root:
            raise ValueError(f"{node!r} is not in this tree (evicted, or from another cache)")
        path.reverse()
        return path

    def _check_holds_state(self, node: TreeNode) -> None:
        if not isinstance(node, TreeNode):
            raise TypeError(f"expected a TreeNode, got {type(node).__name__}")
        if node.state is None:
            raise ValueError(f"{node!r} holds no state")

    def peek(self, key: Any, extra_key: Any = None) -> TreeNode | None:
        """The node that ends exactly at the end of `key`, or None. Read-only:
        no LRU refresh, no split (also with an SGLang compat)."""
        tokens = as_int_array(key, "key")
        self._check_namespace(extra_key)
        node, off, n = self.root, 0, len(tokens)
        while off < n:
            node_next = node.children.get(self._child_key(node, tokens, off, extra_key))
            if node_next is None:
                return None
            ln = len(node_next.key)
            if tokens[off : off + ln] != node_next.key:
                return None
            node, off = node_next, off + ln
        return node if node is not self.root else None

    # ------------------------------------------------------------------ insert

    def insert(
        self,
        key: Any,
        kv_indices: Any,
        state: Any,
        prev_prefix_len: int = 0,
        extra_key: Any = None,
    ) -> InsertResult:
        """Cache `key` with its KV indices and the state after its last token.

        The tree takes the indices it stores and hands back, in `freed_kv`, the
        caller's duplicates in [prev_prefix_len, prefix_len) (positions below
        prev_prefix_len are already tree-owned). If `state_existed`, the caller
        keeps `state`; otherwise the tree owns it.

        Raises ValueError, changing nothing, when an index from prev_prefix_len
        on (or from the end of the cached prefix, if that comes first) is
        negative, one the tree already holds, or one that appears twice there.
        """
        tokens = as_int_array(key, "key")
        values = as_int_array(kv_indices, "kv_indices")
        self._check_insert_args(tokens, values, state, prev_prefix_len, extra_key)
        if len(tokens) == 0:
            return InsertResult(0, True, array("q"), self.root)
        return self._insert(
            tokens, values, operator.index(state), operator.index(prev_prefix_len), extra_key
        )

    def _check_insert_args(
        self, tokens: array[int], values: array[int], state: Any, prev: Any, extra_key: Any
    ) -> None:
        if len(values) != len(tokens):
            raise ValueError(
                f"kv_indices has {len(values)} entries for a key of {len(tokens)} tokens"
            )
        if state is None:
            raise ValueError(
                "state is required: the slot holding the state after the key's last token"
            )
        if isinstance(state, bool) or not hasattr(state, "__index__"):
            raise TypeError(f"state must be an int slot id, got {type(state).__name__}")
        if operator.index(state) < 0:
            raise ValueError(f"state must be a slot id >= 0, got {state}")
        if operator.index(state) in self._held_states:
            raise ValueError(f"state slot {state} is already held by the tree")
        if isinstance(prev, bool) or not hasattr(prev, "__index__"):
            raise TypeError(f"prev_prefix_len must be an int, got {type(prev).__name__}")
        prev = operator.index(prev)
        if not 0 <= prev <= len(tokens):
            raise ValueError(f"prev_prefix_len={prev} outside [0, {len(tokens)}]")
        if not self._sglang and len(tokens) % self.page_size:
            raise ValueError(
                f"key length {len(tokens)} is not a multiple of page_size {self.page_size}: "
                "a state belongs to the key's exact end, so the key cannot be cut to whole pages"
            )
        self._check_namespace(extra_key)

    def _insert(
        self, tokens: array[int], values: array[int], state: int, prev: int, extra_key: Any
    ) -> InsertResult:
        node, off, walked, freed, split_at = _insert_walk(self, tokens, values, prev, extra_key)
        n = len(tokens)
        owner = self._kv_owner
        if owner is not None and not owner.claim(values, min(prev, off), off):
            raise ValueError(self._kv_conflict(owner, values, min(prev, off), off, prev))
        self._touch_walked(walked)
        if split_at:
            node = self._split(walked[-1], split_at)
        kv_lru, st_lru = self.lru
        if off < n:
            leaf = _add_leaf(self, node, tokens, values, off, state, extra_key)
            return InsertResult(off, False, freed, leaf)
        kv_lru.touch(node.kv)
        if node.state is None:  # a tombstone at the key's end: revive it
            node.state = state
            self._held_states.add(state)
            st_lru.push_mru(node.st)
            self._evictable[STATE] += 1
            for listener in self._listeners:
                listener.state_added(node)
            return InsertResult(off, False, freed, node)
        if self._sglang or self._unified:
            st_lru.move_mru(node.st)
        return InsertResult(off, True, freed, node)

    def _kv_conflict(
        self, owner: KVOwner, values: array[int], start: int, off: int, prev: int
    ) -> str:
        """The message for the first position from `start` on whose index is
        negative, held by the tree, or repeats an earlier one from `start`."""
        first_at: dict[int, int] = {}
        for i in range(start, len(values)):
            v = values[i]
            if v < 0:
                return f"kv_indices[{i}] = {v} is negative: KV indices are pool slots >= 0"
            if owner.held_by_tree(v):
                if i >= prev:
                    return (
                        f"kv_indices[{i}] = {v} is already held by the tree: positions from "
                        f"prev_prefix_len={prev} on must be the caller's own indices"
                    )
                return (
                    f"kv_indices[{i}] = {v} is already held by the tree elsewhere: the key "
                    f"is cached only up to {off} tokens, not prev_prefix_len={prev}"
                )
            why = owner.refusal(v)
            if why is not None:
                return f"kv_indices[{i}] = {v} {why}"
            if v in first_at:
                return f"kv_indices[{i}] = {v} repeats kv_indices[{first_at[v]}]"
            first_at[v] = i
        raise AssertionError("no conflicting KV index found")

    def _touch_walked(self, walked: list[TreeNode]) -> None:
        """Refresh the nodes an insert walked through, as SGLang does one by one
        (in the state list only with compat="sglang-0.5.15.post1", #31643); the
        default mode stamps the deepest only (its ancestors' stamps are implied)."""
        if walked:
            kv_lru, st_lru = self.lru
            _refresh_walked(kv_lru, st_lru, walked, self._lazy_kv, self._sglang)

    def _split(self, child: TreeNode, at: int) -> TreeNode:
        """Cut child's edge at `at` (0 < at < len): a new stateless node takes
        the first part and inherits child's KV lock (the same path stays locked)."""
        if not 0 < at < len(child.key):
            raise AssertionError(f"split at {at} of a {len(child.key)}-token edge")
        parent = child.parent
        assert parent is not None
        mid = TreeNode(parent, child.key[:at], child.value[:at], None, child.namespace)
        mid.kv.lock = child.kv.lock
        slot = self._child_key(parent, child.key, 0, child.namespace)
        child.key, child.value = child.key[at:], child.value[at:]
        child.parent = mid
        mid.children[self._child_key(mid, child.key, 0, None)] = child
        parent.children[slot] = mid
        self._node_total += 1
        kv_lru = self.lru[KV]
        if not self._lazy_kv:
            kv_lru.remove(child.kv)
            kv_lru.push_mru(mid.kv)
        else:  # mid's own stamp: the child's last one (the insert just listed the child)
            kv_lru.take_place(child.kv, mid.kv)
        kv_lru.push_mru(child.kv)  # the child stays newer than its new parent
        if self._sglang and child.state is not None:
            self.lru[STATE].move_mru(child.st)
        for listener in self._listeners:
            listener.node_split(mid, child)
        return mid

    # ------------------------------------------------------------------- evict

    def evict(self, kv_tokens: int = 0, states: int = 0) -> EvictResult:
        """Free at least `kv_tokens` KV tokens (whole unlocked leaves, LRU first),
        then at least `states` states (any unlocked state, LRU first), or as
        much as is evictable. Returns what the caller must free, and what each
        phase counted (see `EvictResult`)."""
        want_kv = _count(kv_tokens, "kv_tokens")
        want_states = _count(states, "states")
        if self._unified:
            return unified.evict(self, want_kv, want_states)
        freed_kv: array[int] = array("q")
        freed_states: list[int] = []
        got_kv = self._evict_kv(want_kv, freed_kv, freed_states) if want_kv else 0
        got_states = self._evict_states(want_states, freed_kv, freed_states) if want_states else 0
        return EvictResult(got_kv, got_states, freed_kv, freed_states)

    def _evict_kv(self, want: int, freed_kv: array[int], freed_states: list[int]) -> int:
        return _evict_kv_leaves(self, want, freed_kv, freed_states)

    def _evict_states(self, want: int, freed_kv: array[int], freed_states: list[int]) -> int:
        lru = self.lru[STATE]
        got = 0
        x = lru.lru_unlocked()
        while got < want and x is not None:
            nxt = lru.lru_unlocked(x)
            node = x.node
            assert node is not None and node.state is not None
            self._drop_state(node, freed_kv, freed_states)
            got += 1
            x = nxt
        return got

    def _drop_state(self, node: TreeNode, freed_kv: array[int], freed_states: list[int]) -> None:
        """Free node's state: an internal node becomes a tombstone (KV stays), a
        leaf is deleted with its KV (and childless tombstone ancestors)."""
        if node.children:
            assert node.state is not None
            freed_states.append(node.state)
            self._held_states.discard(node.state)
            self.lru[STATE].remove(node.st)
            node.state = None
            self._evictable[STATE] -= 1
            for listener in self._listeners:
                listener.state_removed(node)
        else:
            self._delete_leaf(node, freed_kv, freed_states)

    # ------------------------------------------------------ targeted eviction

    def evict_state_of(self, node: TreeNode) -> EvictResult:
        """Evict one chosen state (for eviction policies other than LRU): an
        internal node becomes a tombstone, a leaf is deleted with its KV."""
        self._check_evictable(node)
        if not node.children and node.kv.lock:
            raise ValueError(f"{node!r} is a KV-locked leaf")
        if self._unified:
            return unified.evict_state_of(self, node)
        freed_kv: array[int] = array("q")
        freed_states: list[int] = []
        self._drop_state(node, freed_kv, freed_states)
        return EvictResult(0, 1, freed_kv, freed_states)

    def evict_leaf(self, node: TreeNode) -> EvictResult:
        """Evict one chosen unlocked leaf with its KV and state (and childless
        tombstone ancestors; with compat="sglang-0.5.23" the leaf only, which may
        also be a KV-only leaf)."""
        if self._unified and isinstance(node, TreeNode) and node.state is None:
            self._check_in_tree(node)  # a KV-only leaf: nothing else to check
        else:
            self._check_evictable(node)
        if node.children or node.kv.lock or node is self.root:
            raise ValueError(f"{node!r} is not an unlocked leaf")
        if self._unified:
            return unified.evict_leaf(self, node)
        freed_kv: array[int] = array("q")
        freed_states: list[int] = []
        tokens, _ = self._delete_leaf(node, freed_kv, freed_states)
        return EvictResult(tokens, 0, freed_kv, freed_states)

    def _check_evictable(self, node: Any) -> None:
        if not isinstance(node, TreeNode):
            raise TypeError(f"expected a TreeNode, got {type(node).__name__}")
        if node is self.root or node.state is None or node.st.lock:
            raise ValueError(f"{node!r} holds no unlocked state")
        self._check_in_tree(node)

    def evictable_states(self) -> list[TreeNode]:
        """Nodes whose state is unlocked, least recently used first."""
        out = []
        for link in self.lru[STATE]:
            if not link.lock:
                assert link.node is not None
                out.append(link.node)
        out.reverse()
        return out

    def _delete_leaf(
        self, leaf: TreeNode, freed_kv: array[int], freed_states: list[int]
    ) -> tuple[int, TreeNode]:
        """Delete an unlocked leaf (KV + state), then every tombstone ancestor
        left childless and unlocked. Returns (KV tokens freed, the surviving
        ancestor)."""
        return _delete_leaf(self, leaf, freed_kv, freed_states)

    def _detach(self, node: TreeNode, freed_kv: array[int]) -> int:
        return _detach(self, node, freed_kv)

    # ------------------------------------------------------------------- locks

    def inc_lock_ref(self, node: TreeNode) -> LockReceipt:
        """Protect node's KV and its ancestors' KV, and node's state, from eviction."""
        if not isinstance(node, TreeNode):
            raise TypeError(f"expected a TreeNode from match_prefix, got {type(node).__name__}")
        if node is self.root:
            return LockReceipt(node, False)
        if node.state is None:
            self._check_in_tree(node)
            raise ValueError(f"{node!r} has no state (it was evicted): match again to lock")
        newly_locked = _path_locks(self.root, node, +1)
        if newly_locked is None:  # the walk did not end at our root: undone, now explain
            self._check_in_tree(node)
        assert newly_locked is not None
        self._evictable[KV] -= newly_locked
        self._protected[KV] += newly_locked
        if node.st.lock == 0:
            self._evictable[STATE] -= 1
            self._protected[STATE] += 1
        node.st.lock += 1
        return LockReceipt(node, True)

    def dec_lock_ref(self, lock: LockReceipt | TreeNode) -> None:
        """Release a lock taken by `inc_lock_ref` (pass its receipt; a node is
        accepted for SGLang familiarity and releases one lock taken on it)."""
        if isinstance(lock, TreeNode):
            lock = LockReceipt(
                lock, lock.parent is not None
            )  # a root (old or current) holds no state lock
        if not isinstance(lock, LockReceipt):
            raise TypeError(f"expected a LockReceipt from inc_lock_ref, got {type(lock).__name__}")
        if not lock.active:
            raise ValueError(f"{lock!r} was already released")
        node = lock.node
        if (
            node.parent is None
            and not lock.state_locked
            and node.kv.lock == 1
            and node.st.lock == 1
        ):
            lock.active = False  # a root receipt (locks nothing; also one from before a reset)
            return
        if lock.state_locked and (node.st.lock <= 0 or node.state is None):
            raise ValueError(f"{node!r} holds no state lock to release")
        newly_unlocked = _path_locks(self.root, node, -1)
        if newly_unlocked is None:
            self._check_in_tree(node)
            raise ValueError(f"{node!r} or an ancestor holds no KV lock to release")
        self._evictable[KV] += newly_unlocked
        self._protected[KV] -= newly_unlocked
        if lock.state_locked:
            node.st.lock -= 1
            if node.st.lock == 0:
                self._evictable[STATE] += 1
                self._protected[STATE] -= 1
        lock.active = False

    def _check_in_tree(self, node: TreeNode) -> None:
        x = node
        while x.parent is not None:
            x = x.parent
        if x is not self.root:
            raise ValueError(f"{node!r} is not in this tree (evicted, or from another cache)")

    # ------------------------------------------------------------------- sizes

    def full_evictable_size(self) -> int:
        return self._evictable[KV]

    def full_protected_size(self) -> int:
        return self._protected[KV]

    def state_evictable_size(self) -> int:
        return self._evictable[STATE]

    def state_protected_size(self) -> int:
        return self._protected[STATE]

    def total_size(self) -> tuple[int, int]:
        """(KV tokens held, states held)."""
        return (
            self._evictable[KV] + self._protected[KV],
            self._evictable[STATE] + self._protected[STATE],
        )

    def node_count(self) -> int:
        return self._node_total

    # ------------------------------------------------------ recency (read-only)

    def state_clock(self) -> int:
        """The state list's logical clock: it ticks once each time a state is
        added or used (moved to the most-recently-used end)."""
        return self.lru[STATE].clock

    def state_last_use(self, node: TreeNode) -> int:
        """`state_clock()` when `node`'s state was last added or used (0 for a
        node that holds none). Policies read recency here, not in the lists."""
        return node.st.stamp if node.state is not None else 0

    # ------------------------------------------------------------- inspection

    def _nodes(self) -> list[TreeNode]:
        """Every non-root node, parents before children."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def all_kv_indices(self) -> array[int]:
        out = array("q")
        for node in self._nodes():
            out += node.value
        return out

    def all_states(self) -> list[int]:
        return [n.state for n in self._nodes() if n.state is not None]

    def pretty(self) -> str:
        """The tree as indented text, one node per line."""
        lines = [f"root  kv={self.total_size()[0]} tokens, states={self.total_size()[1]}"]

        def visit(node: TreeNode, indent: str) -> None:
            kids = list(node.children.values())
            for i, child in enumerate(kids):
                last = i == len(kids) - 1
                head = ",".join(map(str, child.key[:6])) + ("…" if len(child.key) > 6 else "")
                state = "tombstone" if child.state is None else f"state={child.state}"
                ns = (
                    f" ns={child.namespace!r}"
                    if node is self.root and child.namespace is not None
                    else ""
                )
                lines.append(
                    f"{indent}{'└── ' if last else '├── '}[{head}] {len(child.key)} tok  {state}"
                    f"  locks kv={child.kv.lock} st={child.st.lock}{ns}"
                )
                visit(child, indent + ("    " if last else "│   "))

        visit(self.root, "")
        return "\n".join(lines)

    def pretty_print(self) -> None:
        print(self.pretty())

    def check_invariants(self) -> None:
        """O(n) check of every structural invariant; raises AssertionError with
        the offending node. See `mambaradix.core.invariants`."""
        from mambaradix.core.invariants import check_tree

        check_tree(self)

    def sanity_check(self) -> None:
        self.check_invariants()


# ------------------------------------------------------------ the hot loops
# Module functions, not methods: the compiled build types their locals (tree.pxd), which
# it cannot do for a method of MambaRadixCache, an ordinary class (subclassed, pickled
# through vars(), its __class__ reassigned by the thread guard).


def _edge_matches(edge: array[int], tokens: array[int], off: int) -> bool:
    """Whether tokens[off:] starts with the whole `edge`: tokens[off : off + len(edge)] == edge."""
    if COMPILED:
        return _edge_matches_in_place(edge, tokens, off)
    return tokens[off : off + len(edge)] == edge


def _edge_matches_in_place(edge: array[int], tokens: array[int], off: int) -> bool:
    """`_edge_matches` in the compiled build only (tree.pxd types the arrays as
    `cpython.array`, both of typecode "q" as every key of the tree): the two buffers
    compared where they are, no slice copied."""
    e, t = edge, tokens
    n = len(e)
    if n == 0:
        return True  # an empty slice equals an empty edge
    if off + n > len(t):
        return False
    ep, tp = e.data.as_longlongs, t.data.as_longlongs  # type: ignore[attr-defined]
    return memcmp(ep, tp + off, n * 8) == 0  # type: ignore[no-any-return]


def _match_len(edge: array[int], tokens: array[int], off: int, page: int) -> int:
    m = common_prefix_len(edge, tokens, off)
    return m - m % page


def _walk_path(
    cache: MambaRadixCache, tokens: array[int], extra_key: Any, split: bool
) -> tuple[list[TreeNode], int]:
    """Descend along `tokens`; return (fully matched nodes, matched tokens including a
    partially matched last edge). `split`: cut a partially matched edge there, as SGLang's
    lookup does (the new node has no state)."""
    page, n = cache.page_size, len(tokens)
    node = cache.root
    off = 0
    path: list[TreeNode] = []
    ck = cache._child_key(node, tokens, 0, extra_key)
    while True:
        child = node.children.get(ck)
        if child is None:
            break
        edge = child.key
        ln = len(edge)
        m = ln if _edge_matches(edge, tokens, off) else _match_len(edge, tokens, off, page)
        off += m
        if m < ln:
            if split:
                cache._split(child, m)
            break
        path.append(child)
        if off >= n:
            break
        node = child
        ck = tokens[off] if page == 1 else tuple(tokens[off : off + page])
    return path, off


def _insert_walk(
    cache: MambaRadixCache, tokens: array[int], values: array[int], prev: int, extra_key: Any
) -> tuple[TreeNode, int, list[TreeNode], array[int], int]:
    """`MambaRadixCache._insert`'s descent: (the deepest node fully matched, tokens
    matched, the nodes walked through, the caller's duplicate KV, where the last walked
    edge must be split or 0)."""
    page, n = cache.page_size, len(tokens)
    node = cache.root
    off = 0
    walked: list[TreeNode] = []
    freed = array("q")
    split_at = 0
    ck = cache._child_key(node, tokens, 0, extra_key)
    while True:
        child = node.children.get(ck)
        if child is None:
            break
        walked.append(child)
        edge = child.key
        ln = len(edge)
        m = ln if _edge_matches(edge, tokens, off) else _match_len(edge, tokens, off, page)
        if prev < off + m:  # the caller's copy of KV the tree already has
            freed += values[max(prev, off) : off + m]
        off += m
        if m < ln:
            split_at = m
            break
        node = child
        if off >= n:
            break
        ck = tokens[off] if page == 1 else tuple(tokens[off : off + page])
    return node, off, walked, freed, split_at


def _state_depth(path: list[TreeNode]) -> int:
    """How many nodes of `path` remain once cut back to the deepest one holding a state."""
    k = len(path)
    while k:
        node = path[k - 1]
        if node.state is not None:
            break
        k -= 1
    return k


def _path_values(path: list[TreeNode], k: int) -> array[int]:
    """The KV indices of path[:k], in order."""
    if COMPILED:
        return _path_values_in_place(path, k)
    values = array("q")
    for i in range(k):
        node = path[i]
        values += node.value
    return values


def _path_values_in_place(path: list[TreeNode], k: int) -> array[int]:
    """`_path_values` in the compiled build only: one allocation of the whole length,
    then one memcpy per node (instead of an array grown edge by edge)."""
    total = 0
    for i in range(k):
        node = path[i]
        total += len(node.value)
    out = clone(EMPTY, total, False)
    at = 0
    for i in range(k):
        node = path[i]
        v = node.value
        n = len(v)
        memcpy(out.data.as_longlongs + at, v.data.as_longlongs, n * 8)  # type: ignore[attr-defined]
        at += n
    return out  # type: ignore[no-any-return]


def _refresh_path(
    kv_lru: LRUList, st_lru: LRUList, path: list[TreeNode], k: int, lazy: bool, sglang: bool
) -> None:
    """`MambaRadixCache._refresh_after_match` (`lazy`: the default mode's KV refresh;
    `sglang`: compat="sglang-0.5.15.post1")."""
    last = path[k - 1]
    if lazy:
        kv_lru.touch(last.kv)  # the path's own stamps are implied
        st_lru.move_mru(last.st)
        return
    _splice_deepest_first(kv_lru, st_lru, path, k, sglang)
    if not sglang:
        st_lru.move_mru(last.st)


def _refresh_walked(
    kv_lru: LRUList, st_lru: LRUList, walked: list[TreeNode], lazy: bool, sglang: bool
) -> None:
    """`MambaRadixCache._touch_walked` of a non-empty `walked`."""
    if lazy:
        last = walked[-1]
        kv_lru.touch(last.kv)
        return
    _splice_deepest_first(kv_lru, st_lru, walked, len(walked), sglang)


def _splice_deepest_first(
    kv_lru: LRUList, st_lru: LRUList, path: list[TreeNode], k: int, sglang: bool
) -> None:
    """Move the KV links of path[:k] to the MRU end, path[k - 1] newest (each ancestor
    older than its descendant); in `sglang` mode their states' links too."""
    kv_links: list[Link] = []
    st_links: list[Link] = []
    for i in range(k - 1, -1, -1):  # deepest first
        node = path[i]
        kv_links.append(node.kv)
        if sglang and node.state is not None:
            st_links.append(node.st)
    kv_lru.splice_mru(kv_links)
    if sglang:
        st_lru.splice_mru(st_links)


def _evict_kv_leaves(
    cache: MambaRadixCache, want: int, freed_kv: array[int], freed_states: list[int]
) -> int:
    """`MambaRadixCache._evict_kv`."""
    lru = cache.lru[KV]
    lazy = cache._lazy_kv
    got = 0
    x = lru.lru_leaf_parking() if lazy else lru.lru_unlocked_leaf()
    while got < want and x is not None:
        nxt = lru.lru_unlocked_leaf(x)
        node = x.node
        assert node is not None
        tokens, survivor = _delete_leaf(cache, node, freed_kv, freed_states)
        got += tokens
        if not survivor.children:  # a new leaf may be older than nxt: restart
            nxt = lru.lru_leaf_parking() if lazy else lru.lru_unlocked_leaf()
        x = nxt
    return got


def _delete_leaf(
    cache: MambaRadixCache, leaf: TreeNode, freed_kv: array[int], freed_states: list[int]
) -> tuple[int, TreeNode]:
    """`MambaRadixCache._delete_leaf`."""
    assert leaf.state is not None and leaf.kv.lock == 0 and leaf.st.lock == 0
    freed_states.append(leaf.state)
    cache._held_states.discard(leaf.state)
    cache.lru[STATE].remove(leaf.st)
    cache._evictable[STATE] -= 1
    for listener in cache._listeners:
        listener.state_removed(leaf)
    parent = leaf.parent
    assert parent is not None
    tokens = _detach(cache, leaf, freed_kv)
    while (
        parent.parent is not None
        and parent.state is None
        and not parent.children
        and parent.kv.lock == 0
    ):
        grandparent = parent.parent
        tokens += _detach(cache, parent, freed_kv)
        parent = grandparent
    return tokens, parent


def _detach(cache: MambaRadixCache, node: TreeNode, freed_kv: array[int]) -> int:
    """`MambaRadixCache._detach`: take `node` (a leaf) out of the tree, its KV into
    `freed_kv`; return its KV tokens."""
    parent = node.parent
    assert parent is not None
    ck = cache._child_key(parent, node.key, 0, node.namespace)
    if parent.children.pop(ck, None) is not node:
        raise AssertionError(f"{node!r} is not registered under its own key")
    freed_kv += node.value
    if cache._kv_owner is not None:
        cache._kv_owner.release(node.value)
    kv_lru = cache.lru[KV]
    if cache._lazy_kv and parent.parent is not None and parent.kv.stamp < node.kv.stamp:
        # The parent's implied stamp was at least this node's: it takes its place.
        if parent.kv.prev is not None:
            kv_lru.remove(parent.kv)
        kv_lru.take_place(node.kv, parent.kv)
    else:
        kv_lru.remove(node.kv)
    cache._node_total -= 1
    cache._evictable[KV] -= len(node.value)
    node.parent = None  # marks the node as deleted (stale handles are rejected)
    node.kv.node = node.st.node = None  # no cycle: the node is freed at once
    for listener in cache._listeners:
        listener.node_removed(node)
    return len(node.value)


def _add_leaf(
    cache: MambaRadixCache,
    parent: TreeNode,
    tokens: array[int],
    values: array[int],
    off: int,
    state: int,
    extra_key: Any,
) -> TreeNode:
    """A new leaf below `parent` for tokens[off:], listed MRU in both LRU lists."""
    ns = extra_key if parent is cache.root else parent.namespace
    leaf = TreeNode(parent, tokens[off:], values[off:], state, ns)
    parent.children[cache._child_key(parent, tokens, off, extra_key)] = leaf
    cache._held_states.add(state)
    cache._node_total += 1
    kv_lru, st_lru = cache.lru
    kv_lru.push_mru(leaf.kv)
    st_lru.push_mru(leaf.st)
    cache._evictable[KV] += len(leaf.value)
    cache._evictable[STATE] += 1
    for listener in cache._listeners:
        listener.node_added(leaf)
        listener.state_added(leaf)
    return leaf


def _path_locks(root: TreeNode, node: TreeNode, delta: int) -> int | None:
    """Add delta (+1 or -1) to the KV lock of node and every ancestor; return the KV
    tokens whose lock changed between zero and non-zero. If the path does not end at
    `root`, or a lock would go negative, undo the partial walk and return None."""
    moved = 0
    x = node
    if delta > 0:
        while x.parent is not None:
            link = x.kv
            if not link.lock:
                moved += len(x.value)
            link.lock += 1
            x = x.parent
    else:
        while x.parent is not None:
            link = x.kv
            lock = link.lock
            if lock <= 0:
                break
            if lock == 1:
                moved += len(x.value)
            link.lock = lock - 1
            x = x.parent
    if x is root:
        return moved
    y = node
    while y is not x:  # roll back
        y.kv.lock -= delta
        assert y.parent is not None
        y = y.parent
    return None


__all__ = ["MambaRadixCache", "LockReceipt", "TreeListener", "EMPTY"]
