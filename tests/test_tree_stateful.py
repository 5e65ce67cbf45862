"""Hypothesis state machines for `MambaRadixCache` against a plain reference model.

One machine, run in four configurations: compat None / "sglang-0.5.15.post1" x page_size 1 / 4
(SGLang 0.5.23's compat is checked against its own code: tests/test_differential_sglang_0523.py).
Rules: insert (three ways of passing prev_prefix_len, and one with kv_indices the
tree must refuse), match, lock, unlock, evict, reset. After every step
`check_invariants()` runs and the tree is compared with the model:

* content: the model keeps, per cached position (namespace, the key up to the end of
  its page, index), the KV index stored there, and the (namespace, path) -> state
  map; it is updated only from
  what the tree *reports* (insert prefix_len / state_existed, evict freed_kv /
  freed_states) and must equal a brute-force walk of the tree;
* refusals: an insert whose kv_indices would make the tree hold an index twice (one
  it holds, or a repeat, from prev_prefix_len on) raises ValueError naming the first
  such position and changes nothing (printout, sizes, contents, both LRU lists);
  the tree's record of held KV indices equals the model's (brute force);
* ownership: every KV index and state id ever handed over is in exactly one place
  (held by the tree, returned to the caller, never taken because it was below
  prev_prefix_len, or kept by the caller because the state existed), and nothing
  is returned twice;
* match results: prefix_len, kv_indices, kv_hit_len and branching_len computed
  from the model; the default mode's match leaves the tree structure unchanged;
* locks: protected sizes equal the union of locked paths / the locked states, and
  eviction never frees a locked position or state;
* eviction amounts, and in the default mode the exact order in which states go
  and the state LRU list itself (only an insert that stores a state and the state
  a match uses refresh a state, SGLang #31643).

Budget: HYPOTHESIS_PROFILE=ci (default) is quick; HYPOTHESIS_PROFILE=deep runs long.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from driving import tree_snapshot
from mambaradix import LockReceipt, MambaRadixCache, MatchResult

# A cached KV position: (namespace, the key up to the end of the page holding it, index).
# Whole pages are shared or not at all, so a position is named by its whole page.
Pos = tuple[Any, tuple[int, ...], int]
Path = tuple[Any, tuple[int, ...]]  # (namespace, tokens): where a state sits

ALPHABET = st.integers(0, 2)  # few distinct tokens: keys share prefixes and diverge often
NAMESPACES = st.sampled_from([None, None, None, "lora-a", 7])
MAX_PAGES = 6
MAX_LOCKS = 6

if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci":
    MACHINE_SETTINGS = settings(max_examples=150, stateful_step_count=50, deadline=None)
else:  # "deep" (see tests/conftest.py) decides the budget
    MACHINE_SETTINGS = settings(deadline=None)
QUICK_SETTINGS = settings(max_examples=10, stateful_step_count=40, deadline=None)


# --------------------------------------------------------------------- helpers


def positions(ns: Any, key: Any, n: int, page: int) -> list[Pos]:
    """The positions of key[:n] (n whole pages)."""
    key = tuple(key)
    return [(ns, key[: (i // page + 1) * page], i) for i in range(n)]


def walk_tree(cache: MambaRadixCache) -> tuple[dict[Pos, int], dict[Path, int]]:
    """Brute force: every cached position with its KV index, every state with its path.
    (Every edge is whole pages here: inserted keys are, and splits are page-aligned.)"""
    kv: dict[Pos, int] = {}
    states: dict[Path, int] = {}
    stack = [(child, child.namespace, ()) for child in cache.root.children.values()]
    while stack:
        node, ns, parent_path = stack.pop()
        path = (*parent_path, *node.key)
        for pos, index in zip(
            positions(ns, path, len(path), cache.page_size)[len(parent_path) :],
            node.value,
            strict=True,
        ):
            kv[pos] = index
        if node.state is not None:
            states[(ns, path)] = node.state
        stack.extend((c, ns, path) for c in node.children.values())
    return kv, states


class Ledger:
    """Where every resource handed to the tree went. A resource is in exactly one
    of: `tree` (the model says the tree holds it), `returned` (freed by insert,
    evict or reset), `untaken` (below prev_prefix_len / kept because the state
    already existed)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.handed: set[int] = set()
        self.tree: set[int] = set()
        self.returned: set[int] = set()
        self.untaken: set[int] = set()

    def hand(self, items: list[int]) -> None:
        assert not self.handed.intersection(items)
        self.handed.update(items)

    def take(self, items: list[int]) -> None:
        """The tree took these (they must be fresh and not accounted for yet)."""
        for x in items:
            assert x in self.handed and x not in self.tree, f"{self.name} {x} taken twice"
            assert x not in self.returned and x not in self.untaken, f"{self.name} {x} reused"
            self.tree.add(x)

    def give_back(self, items: list[int], *, from_tree: bool) -> None:
        """The caller got these back; from_tree=False: never taken (duplicates)."""
        assert len(set(items)) == len(items), f"{self.name} returned twice in one call: {items}"
        for x in items:
            assert x in self.handed, f"{self.name} {x} was never handed to the tree"
            assert x not in self.returned, f"{self.name} {x} returned twice"
            assert (x in self.tree) == from_tree, f"{self.name} {x}: tree-held={x in self.tree}"
            self.tree.discard(x)
            self.returned.add(x)

    def leave(self, items: list[int]) -> None:
        for x in items:
            assert x in self.handed and x not in self.tree and x not in self.returned
            self.untaken.add(x)

    def check(self, held: list[int]) -> None:
        assert len(held) == len(set(held)), f"tree holds a {self.name} twice"
        assert set(held) == self.tree, f"tree holds {sorted(set(held) ^ self.tree)} unexpectedly"
        parts = (self.tree, self.returned, self.untaken)
        assert sum(map(len, parts)) == len(self.handed), f"{self.name} counted twice"
        assert self.tree | self.returned | self.untaken == self.handed, f"{self.name} lost"


# ------------------------------------------------------------------ the machine


class TreeMachine(RuleBasedStateMachine):
    """Random operation sequences on one cache; see the module docstring."""

    COMPAT: str | None = None
    PAGE = 1
    CHUNK = 4

    def __init__(self) -> None:
        super().__init__()
        self.cache = MambaRadixCache(
            page_size=self.PAGE, chunk_size=self.CHUNK, compat=self.COMPAT, check_kv=True
        )
        self.default = self.COMPAT is None
        self.kv: dict[Pos, int] = {}  # model content: position -> KV index
        self.where: dict[int, Pos] = {}  # KV index -> position
        self.states: dict[Path, int] = {}  # state path -> state id
        self.state_path: dict[int, Path] = {}
        self.stamp: dict[Path, int] = {}  # default mode: state recency (logical clock)
        self.clock = 0
        self.locks: list[tuple[LockReceipt, Path | None]] = []  # None: the root
        self.kv_ledger = Ledger("KV index")
        self.state_ledger = Ledger("state")
        self.next_kv = 1000
        self.next_state = 1
        self.keys: list[list[int]] = [[]]

    # ---------------------------------------------------------------- drawing

    def fresh_kv(self, n: int) -> list[int]:
        out = list(range(self.next_kv, self.next_kv + n))
        self.next_kv += n
        self.kv_ledger.hand(out)
        return out

    def fresh_state(self) -> int:
        self.next_state += 1
        self.state_ledger.hand([self.next_state])
        return self.next_state

    def draw_key(self, data: st.DataObject, whole_pages: bool) -> list[int]:
        """An earlier key, cut somewhere, extended by a few tokens."""
        page = self.PAGE
        base = data.draw(st.sampled_from(self.keys), label="base")
        cut = data.draw(st.just(len(base)) | st.integers(0, len(base)), label="cut")
        n_ext = data.draw(st.sampled_from([0, 0, 1, 1, 2, 3]), label="ext pages") * page
        if not whole_pages:
            n_ext += data.draw(st.integers(0, page - 1), label="ext tokens")
        ext = data.draw(st.lists(ALPHABET, min_size=n_ext, max_size=n_ext), label="ext")
        key = (base[:cut] + ext)[: MAX_PAGES * page]
        if whole_pages:
            key = key[: len(key) - len(key) % page]
            if key not in self.keys:
                self.keys.append(key)
        return key

    # ------------------------------------------------------------- the model

    def positions(self, ns: Any, key: Any, n: int) -> list[Pos]:
        return positions(ns, key, n, self.PAGE)

    def hit_len(self, ns: Any, key: list[int]) -> int:
        """Longest cached prefix of key, in whole pages."""
        page, q = self.PAGE, 0
        while q + page <= len(key) and (ns, tuple(key[: q + page]), q) in self.kv:
            q += page
        return q

    def expected_match(self, ns: Any, key: list[int]) -> tuple[int, list[int], int, int | None]:
        n = len(key) - len(key) % self.PAGE
        hit = self.hit_len(ns, key[:n])
        best = max((p for p in range(hit + 1) if (ns, tuple(key[:p])) in self.states), default=0)
        indices = [self.kv[pos] for pos in self.positions(ns, key, best)]
        branching = None
        if hit > best and hit - hit % self.CHUNK > 0:
            branching = hit - hit % self.CHUNK
        return best, indices, hit, branching

    def touch(self, pos: Path) -> None:
        self.clock += 1
        self.stamp[pos] = self.clock

    def locked_positions(self) -> set[Pos]:
        out: set[Pos] = set()
        for _, pos in self.locks:
            if pos is not None:
                out.update(self.positions(*pos, len(pos[1])))
        return out

    def locked_states(self) -> set[Path]:
        return {pos for _, pos in self.locks if pos is not None}

    def forget(self, freed_kv: list[int], freed_states: list[int]) -> None:
        for index in freed_kv:
            del self.kv[self.where.pop(index)]
        for state in freed_states:
            pos = self.state_path.pop(state)
            del self.states[pos]
            self.stamp.pop(pos, None)

    # ------------------------------------------------------------------ match

    def do_match(self, ns: Any, key: list[int]) -> MatchResult:
        """match_prefix, checked against the model (and refreshes model recency)."""
        before = self.cache.pretty()
        want = self.expected_match(ns, key)
        r = self.cache.match_prefix(key, extra_key=ns)
        got = (r.prefix_len, list(r.kv_indices), r.kv_hit_len, r.branching_len)
        assert got == want, f"match {key} ns={ns!r}: got {got}, model {want}\n{before}"
        if r.prefix_len:
            assert r.node.state == self.states[(ns, tuple(key[: r.prefix_len]))]
            if self.default:
                self.touch((ns, tuple(key[: r.prefix_len])))
        else:
            assert r.node is self.cache.root
        if self.default:
            assert self.cache.pretty() == before, "a default-mode match changed the tree"
        return r

    @rule(data=st.data())
    def match(self, data: st.DataObject) -> None:
        self.do_match(data.draw(NAMESPACES, label="ns"), self.draw_key(data, whole_pages=False))

    # ----------------------------------------------------------------- insert

    # Three insert rules (inserts are 3 of 9 rules, so trees grow between evictions),
    # and one insert the tree must refuse.

    @rule(data=st.data())
    def insert_fresh(self, data: st.DataObject) -> None:
        """prev_prefix_len=0 and fresh indices for every position."""
        ns, key = data.draw(NAMESPACES, label="ns"), self.draw_key(data, whole_pages=True)
        values = self.fresh_kv(len(key))
        self.do_insert(ns, key, values, 0, values)

    @rule(data=st.data())
    def insert_prev_arbitrary(self, data: st.DataObject) -> None:
        """Fresh indices everywhere but the caller claims [0, prev) is tree-owned: the
        tree must neither store nor return the indices of [0, min(prev, prefix_len))."""
        ns, key = data.draw(NAMESPACES, label="ns"), self.draw_key(data, whole_pages=True)
        prev = data.draw(st.integers(0, len(key)), label="prev")
        values = self.fresh_kv(len(key))
        self.do_insert(ns, key, values, prev, values)

    @rule(data=st.data())
    def insert_after_match(self, data: st.DataObject) -> None:
        """A scheduler: match a prefix of the request (maybe locking it), keep the tree's
        own indices for [0, prev), compute the rest, insert the whole key."""
        ns, key = data.draw(NAMESPACES, label="ns"), self.draw_key(data, whole_pages=True)
        cut = data.draw(st.just(len(key)) | st.integers(0, len(key)), label="match cut")
        m = self.do_match(ns, key[:cut])
        receipt = None
        if data.draw(st.booleans(), label="lock while computing"):
            receipt = self.cache.inc_lock_ref(m.node)
        fresh = self.fresh_kv(len(key) - m.prefix_len)
        self.do_insert(ns, key, list(m.kv_indices) + fresh, m.prefix_len, fresh)
        if receipt is not None:
            self.cache.dec_lock_ref(receipt)

    def do_insert(
        self, ns: Any, key: list[int], values: list[int], prev: int, fresh: list[int]
    ) -> None:
        """insert, checked against the model; `fresh`: the indices handed over now."""
        state = self.fresh_state()
        want_prefix = self.hit_len(ns, key)
        want_existed = (ns, tuple(key)) in self.states or not key

        r = self.cache.insert(key, values, state, prev_prefix_len=prev, extra_key=ns)

        assert (r.prefix_len, r.state_existed) == (want_prefix, want_existed), (key, ns, r)
        p = r.prefix_len
        assert list(r.freed_kv) == values[prev:p], f"freed {list(r.freed_kv)}, prev={prev} p={p}"
        self.kv_ledger.give_back(list(r.freed_kv), from_tree=False)
        self.kv_ledger.leave([v for v in values[: min(prev, p)] if v in fresh])
        self.kv_ledger.take(values[p:])
        for pos, index in zip(self.positions(ns, key, len(key))[p:], values[p:], strict=True):
            self.kv[pos] = index
            self.where[index] = pos
        if r.state_existed:
            self.state_ledger.leave([state])  # the caller keeps it
        else:
            pos = (ns, tuple(key))
            self.states[pos] = state
            self.state_path[state] = pos
            self.state_ledger.take([state])
            self.touch(pos)

    @rule(data=st.data())
    def insert_refused(self, data: st.DataObject) -> None:
        """kv_indices with an index the tree holds, or one index twice, at positions from
        prev_prefix_len on: refused, naming the first such position; nothing changes.
        Below prev_prefix_len the tree's own indices where cached, elsewhere indices
        no one was ever handed (10**8 + i): the refused call hands nothing over."""
        ns, key = data.draw(NAMESPACES, label="ns"), self.draw_key(data, whole_pages=True)
        held = sorted(self.kv.values())
        kind = data.draw(st.sampled_from(["repeat", "held"] if held else ["repeat"]))
        if len(key) < 2:
            return
        prev = data.draw(st.integers(0, len(key) - 2), label="prev")
        hit = self.hit_len(ns, key)
        own = [self.kv[pos] for pos in self.positions(ns, key, hit)]
        values = own[:prev] + [10**8 + i for i in range(min(prev, hit), len(key))]
        if kind == "held":
            at = data.draw(st.integers(prev, len(key) - 1), label="at")
            values[at] = data.draw(st.sampled_from(held), label="held index")
            want = rf"^kv_indices\[{at}\] = {values[at]} is already held by the tree"
        else:
            first = data.draw(st.integers(prev, len(key) - 2), label="first")
            at = data.draw(st.integers(first + 1, len(key) - 1), label="again")
            values[at] = values[first]
            want = rf"^kv_indices\[{at}\] = {values[at]} repeats kv_indices\[{first}\]$"
        before = tree_snapshot(self.cache)
        with pytest.raises(ValueError, match=want):
            self.cache.insert(key, values, 10**7, prev_prefix_len=prev, extra_key=ns)
        assert tree_snapshot(self.cache) == before, "a refused insert changed the tree"

    # ------------------------------------------------------------------ locks

    @precondition(lambda self: len(self.locks) < MAX_LOCKS)
    @rule(data=st.data())
    def lock(self, data: st.DataObject) -> None:
        ns = data.draw(NAMESPACES, label="ns")
        key = self.draw_key(data, whole_pages=False)
        m = self.do_match(ns, key)
        receipt = self.cache.inc_lock_ref(m.node)
        assert receipt.state_locked == (m.prefix_len > 0)
        self.locks.append((receipt, (ns, tuple(key[: m.prefix_len])) if m.prefix_len else None))

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.locks) - 1), label="which lock")
        receipt, _ = self.locks.pop(i)
        stale_root = receipt.node.parent is None and receipt.node is not self.cache.root
        if not stale_root and data.draw(st.booleans(), label="by node"):
            self.cache.dec_lock_ref(receipt.node)  # SGLang-style release by node
        else:
            self.cache.dec_lock_ref(receipt)
            assert not receipt.active

    # ---------------------------------------------------------------- evict

    @rule(
        kv_tokens=st.sampled_from([0, 0, 0, 1, 2, 4, 9, 40]),
        states=st.sampled_from([0, 0, 1, 1, 2, 5]),
    )
    def evict(self, kv_tokens: int, states: int) -> None:
        c = self.cache
        kv_evictable, st_evictable = c.full_evictable_size(), c.state_evictable_size()
        protected = (c.full_protected_size(), c.state_protected_size())
        locked_pos, locked_st = self.locked_positions(), self.locked_states()
        unlocked_by_age = sorted(
            (pos for pos in self.states if pos not in locked_st), key=self.stamp.__getitem__
        )

        r = c.evict(kv_tokens=kv_tokens, states=states)
        freed_kv, freed_states = list(r.freed_kv), list(r.freed_states)

        # nothing locked goes, and everything freed was evictable
        assert not {self.where[i] for i in freed_kv} & locked_pos, "a locked KV was evicted"
        assert not {self.state_path[s] for s in freed_states} & locked_st, "a locked state went"
        assert (c.full_protected_size(), c.state_protected_size()) == protected
        assert len(freed_kv) == kv_evictable - c.full_evictable_size()
        assert len(freed_states) == st_evictable - c.state_evictable_size()
        # amounts: KV eviction stops only when satisfied or when no unlocked leaf is left
        assert r.kv_tokens <= len(freed_kv)
        if states == 0:  # no state phase: all the KV freed is the KV phase's
            assert r.kv_tokens == len(freed_kv)
        if kv_tokens == 0:
            assert r.kv_tokens == 0
        else:
            assert r.kv_tokens >= min(kv_tokens, kv_evictable), (r, kv_evictable)
            if r.kv_tokens < kv_tokens:
                assert c.full_evictable_size() == 0, "KV eviction stopped with leaves left"
        kv_phase_states = len(freed_states) - r.states
        assert kv_phase_states >= 0
        assert r.states == min(states, st_evictable - kv_phase_states), (r, st_evictable)
        if self.default:  # the least recently *used* unlocked states go first
            gone = set(freed_states[:kv_phase_states])
            remaining = [pos for pos in unlocked_by_age if self.states[pos] not in gone]
            want = [self.states[pos] for pos in remaining[: r.states]]
            assert freed_states[kv_phase_states:] == want, (freed_states, want)

        self.kv_ledger.give_back(freed_kv, from_tree=True)
        self.state_ledger.give_back(freed_states, from_tree=True)
        self.forget(freed_kv, freed_states)

    # ------------------------------------------------------------------ reset

    @rule(go=st.integers(0, 7))
    def reset(self, go: int) -> None:
        """Rarely (1 in 8): reset, which must refuse while a lock protects something.
        Root receipts protect nothing: reset() accepts them and they stay releasable
        (by receipt) afterwards."""
        if go:
            return
        if any(pos is not None for _, pos in self.locks):
            before = self.cache.pretty()
            with pytest.raises(RuntimeError, match="lock"):
                self.cache.reset()
            assert self.cache.pretty() == before
            return
        r = self.cache.reset()
        assert sorted(r.freed_kv) == sorted(self.kv.values())
        assert sorted(r.freed_states) == sorted(self.states.values())
        self.kv_ledger.give_back(list(r.freed_kv), from_tree=True)
        self.state_ledger.give_back(list(r.freed_states), from_tree=True)
        self.forget(list(r.freed_kv), list(r.freed_states))
        assert self.cache.node_count() == 0

    # ------------------------------------------------------------- invariants

    @invariant()
    def tree_invariants(self) -> None:
        self.cache.check_invariants()

    @invariant()
    def tree_equals_model(self) -> None:
        kv, states = walk_tree(self.cache)
        assert kv == self.kv, "tree content differs from what its results reported"
        assert states == self.states
        self.kv_ledger.check(list(self.cache.all_kv_indices()))
        self.state_ledger.check(self.cache.all_states())

    @invariant()
    def held_kv_record(self) -> None:
        """What insert checks against: exactly the KV indices the model says are held."""
        owner = self.cache.kv_owner
        assert owner is not None and owner.tree_indices() == set(self.kv.values())

    @invariant()
    def state_recency(self) -> None:
        """Default mode: the state list (MRU first) is the model's order of last use."""
        if self.default:
            listed = [link.node.state for link in self.cache.lru[1]]
            by_use = sorted(self.states, key=self.stamp.__getitem__, reverse=True)
            assert listed == [self.states[pos] for pos in by_use]

    @invariant()
    def sizes_match_locks(self) -> None:
        c = self.cache
        locked_pos, locked_st = self.locked_positions(), self.locked_states()
        assert locked_pos <= self.kv.keys() and locked_st <= self.states.keys()
        assert c.full_protected_size() == len(locked_pos)
        assert c.state_protected_size() == len(locked_st)
        assert c.full_evictable_size() + c.full_protected_size() == len(self.kv)
        assert c.state_evictable_size() + c.state_protected_size() == len(self.states)
        assert c.total_size() == (len(self.kv), len(self.states))
        # each locked node's state lock = the receipts held on it
        held = Counter(pos for _, pos in self.locks if pos is not None)
        for receipt, pos in self.locks:
            if pos is not None:
                assert receipt.node.st.lock == held[pos]

    def teardown(self) -> None:
        """Release every lock: the tree must end with nothing protected."""
        for receipt, _ in self.locks:
            self.cache.dec_lock_ref(receipt)
        self.locks.clear()
        self.cache.check_invariants()
        assert self.cache.full_protected_size() == self.cache.state_protected_size() == 0


# --------------------------------------------------------- four configurations


def _machine(
    compat: str | None, page: int, chunk: int, budget: settings = MACHINE_SETTINGS
) -> type[TreeMachine]:
    name = f"Tree{'Sglang' if compat else 'Default'}Page{page}"
    machine = type(name, (TreeMachine,), {"COMPAT": compat, "PAGE": page, "CHUNK": chunk})
    machine.TestCase.settings = budget
    return machine


# The full budget runs in the slow tier; the default tier runs a tenth of it.
TestDefaultPage1 = pytest.mark.slow(_machine(None, 1, 4).TestCase)
TestDefaultPage4 = pytest.mark.slow(_machine(None, 4, 8).TestCase)
TestSglangPage1 = pytest.mark.slow(_machine("sglang-0.5.15.post1", 1, 4).TestCase)
TestSglangPage4 = pytest.mark.slow(_machine("sglang-0.5.15.post1", 4, 8).TestCase)
TestDefaultPage1Quick = _machine(None, 1, 4, QUICK_SETTINGS).TestCase
TestDefaultPage4Quick = _machine(None, 4, 8, QUICK_SETTINGS).TestCase
TestSglangPage1Quick = _machine("sglang-0.5.15.post1", 1, 4, QUICK_SETTINGS).TestCase
TestSglangPage4Quick = _machine("sglang-0.5.15.post1", 4, 8, QUICK_SETTINGS).TestCase
