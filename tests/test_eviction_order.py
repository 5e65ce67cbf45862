"""The default mode's exact eviction order against a brute-force reference.

The reference (`RefTree`) keeps the cache as a plain dict from each node's whole path
(namespace, tokens) to its edge's KV indices, state, locks and last-use stamps; parents and
children are found by scanning that dict, and recency follows the documented rule with one
eager global clock:

* a match refreshes every node of the path it returns (down to the deepest state), each
  ancestor older than its descendant, and the state it uses (SGLang #31643);
* an insert refreshes every node it walks through (ancestors older), then, when it cuts an
  edge, the new upper node and then the cut node; then the new leaf, or the node at the
  key's end; a state is refreshed only when the insert stores it (new leaf, revived
  tombstone);
* `touch(node)` refreshes as a match of the node's whole key.

Eviction is "least recently used first", by brute force: the KV phase repeatedly deletes the
unlocked leaf with the oldest KV stamp, then every tombstone ancestor left childless and
unlocked (the leaf's state and KV first, then each ancestor's KV); the state phase repeatedly
drops the unlocked state with the oldest state stamp (an internal node becomes a tombstone, a
leaf goes as above). The test drives random sequences of inserts, matches (read-only too),
touches, locks, unlocks, LRU evictions, targeted evictions and resets on the tree and the
reference together and requires the exact same `freed_kv` / `freed_states` sequences (and
match / insert results) at every step: that is the order, not only the amounts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from budget import seeds
from mambaradix import LockReceipt, MambaRadixCache
from mambaradix.core.node import TreeNode

Path = tuple[Any, tuple[int, ...]]  # (namespace, tokens from the root)


@dataclass
class RefNode:
    kv: list[int]  # the KV indices of this node's edge
    state: int | None
    kv_stamp: int = 0
    st_stamp: int = 0
    kv_lock: int = 0
    st_lock: int = 0
    children: list[Path] = field(default_factory=list)  # unused: found by scanning


class RefTree:
    """Brute force: every question is answered by scanning every node."""

    def __init__(self, page: int) -> None:
        self.page = page
        self.nodes: dict[Path, RefNode] = {}
        self.clock = 0

    # ------------------------------------------------------------ structure

    def parent(self, path: Path) -> Path | None:
        """The longest node path that is a proper prefix of `path` (None: the root)."""
        ns, toks = path
        best: Path | None = None
        for ns2, toks2 in self.nodes:
            below = ns2 == ns and len(toks2) < len(toks) and toks[: len(toks2)] == toks2
            if below and (best is None or len(toks2) > len(best[1])):
                best = (ns2, toks2)
        return best

    def has_children(self, path: Path) -> bool:
        return any(self.parent(p) == path for p in self.nodes if p != path)

    def ancestors(self, path: Path) -> list[Path]:
        """`path` and every node above it, root's child last."""
        out, p = [], path
        while p is not None:
            out.append(p)
            p = self.parent(p)  # type: ignore[assignment]
        return out

    def hit(self, ns: Any, key: tuple[int, ...]) -> int:
        """Longest cached prefix of key, in whole pages."""
        best = 0
        for ns2, toks in self.nodes:
            if ns2 != ns:
                continue
            n = 0
            while n < min(len(toks), len(key)) and toks[n] == key[n]:
                n += 1
            best = max(best, n - n % self.page)
        return best

    def on_path(self, ns: Any, key: tuple[int, ...], hit: int) -> list[Path]:
        """Nodes whose whole path is a prefix of key[:hit], root's child first."""
        full = [(ns2, t) for ns2, t in self.nodes if ns2 == ns and t == key[: len(t)]]
        return sorted((p for p in full if len(p[1]) <= hit), key=lambda p: len(p[1]))

    def stamp_kv(self, path: Path) -> None:
        self.clock += 1
        self.nodes[path].kv_stamp = self.clock

    def stamp_st(self, path: Path) -> None:
        self.clock += 1
        self.nodes[path].st_stamp = self.clock

    # ---------------------------------------------------------------- calls

    def match(self, ns: Any, key: tuple[int, ...], refresh: bool) -> tuple[int, list[int]]:
        key = key[: len(key) - len(key) % self.page]
        path = self.on_path(ns, key, self.hit(ns, key))
        while path and self.nodes[path[-1]].state is None:
            path.pop()
        if path and refresh:
            for p in path:  # root's child first: each ancestor older than its descendant
                self.stamp_kv(p)
            self.stamp_st(path[-1])
        kv = [i for p in path for i in self.nodes[p].kv]
        return (len(path[-1][1]) if path else 0), kv

    def touch(self, path: Path) -> None:
        for p in reversed(self.ancestors(path)):
            self.stamp_kv(p)
        self.stamp_st(path)

    def insert(
        self, ns: Any, key: tuple[int, ...], values: list[int], state: int, prev: int
    ) -> tuple[int, bool, list[int]]:
        hit = self.hit(ns, key)
        walked = self.on_path(ns, key, hit)
        cut: Path | None = None  # the node whose edge the key leaves in the middle
        if hit > (len(walked[-1][1]) if walked else 0):
            longer = [p for p in self.nodes if p[0] == ns and p[1][:hit] == key[:hit]]
            cut = min((p for p in longer if len(p[1]) > hit), key=lambda p: len(p[1]))
        freed = values[prev:hit] if prev < hit else []
        for p in walked + ([cut] if cut else []):
            self.stamp_kv(p)
        end: Path = (ns, key)
        if cut is not None:
            upper: Path = (ns, key[:hit])
            node = self.nodes[cut]
            at = len(node.kv) - (len(cut[1]) - hit)
            self.nodes[upper] = RefNode(node.kv[:at], None, kv_lock=node.kv_lock)
            node.kv = node.kv[at:]
            self.stamp_kv(upper)
            self.stamp_kv(cut)
        if hit < len(key):
            self.nodes[end] = RefNode(values[hit:], state)
            self.stamp_kv(end)
            self.stamp_st(end)
            return hit, False, freed
        self.stamp_kv(end)
        if self.nodes[end].state is None:
            self.nodes[end].state = state
            self.stamp_st(end)
            return hit, False, freed
        return hit, True, freed

    def lock(self, path: Path, delta: int) -> None:
        for p in self.ancestors(path):
            self.nodes[p].kv_lock += delta
        self.nodes[path].st_lock += delta

    def delete_leaf(self, path: Path, freed_kv: list[int], freed_states: list[int]) -> int:
        """Delete a leaf, then each tombstone ancestor left childless and unlocked."""
        node = self.nodes.pop(path)
        assert node.state is not None and node.kv_lock == 0
        freed_states.append(node.state)
        freed_kv += node.kv
        tokens = len(node.kv)
        p = self.parent(path)
        while p is not None:
            up = self.nodes[p]
            if up.state is not None or up.kv_lock or self.has_children(p):
                break
            grand = self.parent(p)
            del self.nodes[p]
            freed_kv += up.kv
            tokens += len(up.kv)
            p = grand
        return tokens

    def evict(self, want_kv: int, want_states: int) -> tuple[int, int, list[int], list[int]]:
        freed_kv: list[int] = []
        freed_states: list[int] = []
        got_kv = got_st = 0
        while got_kv < want_kv:
            leaves = [
                p for p, n in self.nodes.items() if not n.kv_lock and not self.has_children(p)
            ]
            if not leaves:
                break
            oldest = min(leaves, key=lambda p: self.nodes[p].kv_stamp)
            got_kv += self.delete_leaf(oldest, freed_kv, freed_states)
        while got_st < want_states:
            held = [p for p, n in self.nodes.items() if n.state is not None and not n.st_lock]
            if not held:
                break
            oldest = min(held, key=lambda p: self.nodes[p].st_stamp)
            self.drop_state(oldest, freed_kv, freed_states)
            got_st += 1
        return got_kv, got_st, freed_kv, freed_states

    def drop_state(self, path: Path, freed_kv: list[int], freed_states: list[int]) -> None:
        node = self.nodes[path]
        if self.has_children(path):
            assert node.state is not None
            freed_states.append(node.state)
            node.state = None
        else:
            self.delete_leaf(path, freed_kv, freed_states)


def path_of(node: TreeNode) -> Path:
    """The (namespace, tokens) of a live tree node, read off its parent links."""
    parts, x = [], node
    while x.parent is not None:
        parts.append(tuple(x.key))
        ns = x.namespace
        x = x.parent
    return ns, tuple(t for part in reversed(parts) for t in part)


def tree_nodes(cache: MambaRadixCache) -> list[TreeNode]:
    return sorted(cache._nodes(), key=lambda n: n.id)


def run(seed: int, page: int, steps: int, chain: bool = False) -> dict[str, int]:
    """Drive the tree and the reference together; return how often each call ran.
    chain: mostly extend the newest key by a page (an agent's deep path)."""
    rng = random.Random(seed)
    cache = MambaRadixCache(page_size=page, chunk_size=4 * page)
    ref = RefTree(page)
    keys: list[tuple[Any, tuple[int, ...]]] = [(None, ())]
    locks: list[tuple[LockReceipt, Path]] = []
    next_kv, next_state = 0, 0
    seen: dict[str, int] = {}
    crowd = 80 if chain else 20  # nodes above which evictions come often

    def draw_key() -> tuple[Any, tuple[int, ...]]:
        if chain and rng.random() < 0.9:  # the newest key, one page longer (no cap)
            ns, base = keys[-1]
            return ns, base + tuple(rng.randint(0, 2) for _ in range(page))
        ns, base = rng.choice(keys)
        if rng.random() < 0.15:
            ns = rng.choice([None, "a"])
        cut = len(base) if rng.random() < 0.5 else rng.randint(0, len(base) // page) * page
        ext = tuple(rng.randint(0, 2) for _ in range(rng.choice([0, 1, 1, 2, 3]) * page))
        return ns, (base[:cut] + ext)[: 40 * page]

    for _ in range(steps):
        op = rng.choice(
            ["insert"] * 6
            + ["match"] * 4
            + ["peek_match", "touch", "lock", "unlock", "evict"] * 1
            + ["evict_leaf", "evict_state_of", "reset"] * (cache.node_count() > crowd // 2)
            + ["evict"] * 2 * (cache.node_count() > crowd)
        )
        if op == "reset" and (locks or rng.random() < 0.8):
            continue
        seen[op] = seen.get(op, 0) + 1
        if op == "insert":
            ns, key = draw_key()
            if not key:
                continue
            m = cache.match_prefix(key, extra_key=ns, read_only=True)
            prev = m.prefix_len if rng.random() < 0.7 else 0
            fresh = list(range(next_kv, next_kv + len(key) - prev))
            next_kv += len(fresh)
            values = list(m.kv_indices[:prev]) + fresh
            next_state += 1
            r = cache.insert(key, values, next_state, prev_prefix_len=prev, extra_key=ns)
            want = ref.insert(ns, key, values, next_state, prev)
            assert (r.prefix_len, r.state_existed, list(r.freed_kv)) == want, (op, key)
            keys.append((ns, key))
        elif op in ("match", "peek_match", "lock"):
            ns, key = draw_key()
            extra = tuple(rng.randint(0, 2) for _ in range(rng.randint(0, page)))
            key += extra  # not always whole pages: the match cuts to them
            refresh = op != "peek_match"
            r = cache.match_prefix(key, extra_key=ns, read_only=not refresh)
            want_len, want_kv = ref.match(ns, key, refresh)
            assert (r.prefix_len, list(r.kv_indices)) == (want_len, want_kv), (op, key)
            if op == "lock" and r.prefix_len and len(locks) < 6:
                locks.append((cache.inc_lock_ref(r.node), path_of(r.node)))
                ref.lock(locks[-1][1], +1)
        elif op == "touch":
            holders = [n for n in tree_nodes(cache) if n.state is not None]
            if holders:
                node = rng.choice(holders)
                ref.touch(path_of(node))
                cache.touch(node)
        elif op == "unlock" and locks:
            receipt, path = locks.pop(rng.randrange(len(locks)))
            cache.dec_lock_ref(receipt)
            ref.lock(path, -1)
        elif op == "evict":
            kv_tokens = rng.choice([0, 1, 1, 2, 3, 5, 12]) * page
            states = rng.choice([0, 0, 0, 1, 2])
            r = cache.evict(kv_tokens=kv_tokens, states=states)
            got = (r.kv_tokens, r.states, list(r.freed_kv), list(r.freed_states))
            assert got == ref.evict(kv_tokens, states), (kv_tokens, states)
        elif op == "evict_leaf":
            leaves = [n for n in tree_nodes(cache) if not n.children and not n.kv.lock]
            if leaves:
                node = rng.choice(leaves)
                path = path_of(node)
                freed_kv: list[int] = []
                freed_states: list[int] = []
                tokens = ref.delete_leaf(path, freed_kv, freed_states)
                r = cache.evict_leaf(node)
                assert (r.kv_tokens, list(r.freed_kv), list(r.freed_states)) == (
                    tokens,
                    freed_kv,
                    freed_states,
                )
        elif op == "evict_state_of":
            held = [n for n in tree_nodes(cache) if n.state is not None and not n.st.lock]
            if held:
                node = rng.choice(held)
                freed_kv, freed_states = [], []
                ref.drop_state(path_of(node), freed_kv, freed_states)
                r = cache.evict_state_of(node)
                assert (list(r.freed_kv), list(r.freed_states)) == (freed_kv, freed_states)
        elif op == "reset":
            cache.reset()
            ref.nodes.clear()
    # Finally drain everything: the whole remaining order, locks released first.
    for receipt, path in locks:
        cache.dec_lock_ref(receipt)
        ref.lock(path, -1)
    r = cache.evict(kv_tokens=10**9)
    assert (r.kv_tokens, r.states, list(r.freed_kv), list(r.freed_states)) == ref.evict(10**9, 0)
    assert cache.node_count() == 0 and not ref.nodes
    cache.check_invariants()
    return seen


@pytest.mark.parametrize("page", [1, 2])
@pytest.mark.parametrize("seed", range(4))
def test_default_mode_evicts_in_the_reference_order(seed: int, page: int) -> None:
    seen = run(seed, page, steps=400)
    assert seen["evict"] > 15 and seen["insert"] > 100  # the sequence exercised eviction


@pytest.mark.parametrize("seed", range(2))
def test_deep_paths_evict_in_the_reference_order(seed: int) -> None:
    """Agent-like paths tens of nodes deep, where most nodes are internal."""
    run(seed, 1, steps=300, chain=True)


@pytest.mark.slow
@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize("page", [1, 2, 4])
@pytest.mark.parametrize("seed", seeds(100, ci=8, deep=40))
def test_default_mode_evicts_in_the_reference_order_long(seed: int, page: int, chain: bool) -> None:
    run(seed, page, steps=1500, chain=chain)


def test_the_reference_catches_a_wrong_order() -> None:
    """The comparison can fail: a tree whose match refreshes only the state it uses, not
    the KV of its path, evicts in another order, and the reference catches it."""
    original = MambaRadixCache._refresh_after_match

    def state_only(self: MambaRadixCache, path: list[TreeNode], k: int) -> None:
        self.lru[1].move_mru(path[k - 1].st)

    MambaRadixCache._refresh_after_match = state_only  # type: ignore[method-assign]
    try:
        with pytest.raises(AssertionError):
            for seed in range(20):
                run(seed, 1, steps=250)
    finally:
        MambaRadixCache._refresh_after_match = original  # type: ignore[method-assign]
