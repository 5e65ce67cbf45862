"""Property: the indexer, fed only the emitter's events, knows what the tree knows.

A Hypothesis state machine drives a `MambaRadixCache` through random operations (insert,
insert under a namespace, match, lock, unlock, evict KV, evict states, evict a chosen
state or leaf, reset) with an `EventEmitter` on it; after every step the emitted events
go to an `Indexer` (worker 0), and for every probe prompt Q (the keys inserted lately,
each cut short and extended by an unseen token):

* KV overlap: `longest_matched` == the tree's contiguous KV for Q, `match_prefix(Q)
  .kv_hit_len`, floored to whole blocks (B = the emitter's block size);
* usable prefix at block granularity: `usable` == the largest p, a multiple of B with
  p <= len(Q) - 1, at which the tree reuses exactly p tokens (`match_prefix(Q[:p])
  .prefix_len == p`, i.e. a state sits at p on Q's path), else 0;
* the same answers from a second indexer fed the events through the vLLM wire format,
  and from a fresh indexer fed only `dump()` (a router that starts cold);
* through the SGLang wire format (KV only) the overlap is the same, and a hybrid
  worker's usable prefix is 0: a KV-only stream cannot prove any state.

Namespaced keys are never announced, so they are never credited (the oracle, a match
without a namespace, does not see them either).

`test_several_workers_at_real_page_sizes` checks the same at page sizes 16 and 64, with
three trees behind one indexer (one worker each), in plain seeded random runs.
"""

from __future__ import annotations

import os
import random

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mambaradix import LockReceipt, MambaRadixCache
from mambaradix.events import EventEmitter
from mambaradix.events.wire import decode_batch, encode_batch
from mambaradix.index import Indexer

ALPHABET = st.integers(0, 2)
UNSEEN = 9  # a token no key contains: extends a probe past everything cached

if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci":
    MACHINE_SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None)
else:
    MACHINE_SETTINGS = settings(deadline=None)
# The full budget runs in the slow tier; the default tier runs a sixth of it.
QUICK_SETTINGS = settings(max_examples=10, stateful_step_count=40, deadline=None)


class IndexMachine(RuleBasedStateMachine):
    COMPAT: str | None = None
    PAGE = 1
    BLOCK = 2

    def __init__(self) -> None:
        super().__init__()
        self.tree = MambaRadixCache(
            page_size=self.PAGE, chunk_size=4 * self.PAGE, compat=self.COMPAT
        )
        self.emitter = EventEmitter(self.tree, self.BLOCK)
        self.direct = Indexer(self.BLOCK)
        self.vllm = Indexer(self.BLOCK)
        self.sglang = Indexer(self.BLOCK)
        for ix in (self.direct, self.vllm, self.sglang):
            ix.add_worker(0)
        self.next_kv = 0
        self.next_state = 0
        self.locks: list[LockReceipt] = []
        self.probes: list[list[int]] = []

    def _key(self, pages: list[list[int]]) -> list[int]:
        return [t for page in pages for t in page]

    def _feed(self) -> None:
        events = self.emitter.take()
        self.direct.apply(0, events)
        for ix, fmt in ((self.vllm, "vllm"), (self.sglang, "sglang")):
            batch = decode_batch(encode_batch(events, fmt))
            assert not batch.problems
            ix.apply(0, batch.events)

    def _insert(self, key: list[int], extra_key: object = None) -> None:
        n = len(key)
        kv = list(range(self.next_kv, self.next_kv + n))
        self.next_kv += n
        self.tree.insert(key, kv, self.next_state, extra_key=extra_key)
        self.next_state += 1
        self._feed()

    def _probe(self, key: list[int]) -> None:
        self.probes = (self.probes + [key, key[: len(key) - 1], key + [UNSEEN]])[-12:]

    @rule(
        pages=st.lists(st.lists(ALPHABET, min_size=1, max_size=1), min_size=1, max_size=8),
        base=st.integers(0, 11),
        cut=st.integers(0, 8),
    )
    def insert(self, pages: list[list[int]], base: int, cut: int) -> None:
        """A new key, often sharing a prefix with a probe (a cached key or a cut of one)."""
        head: list[int] = []
        if self.probes:
            head = self.probes[base % len(self.probes)]
            head = [t for t in head if t != UNSEEN][: cut * self.PAGE]
            head = head[: len(head) // self.PAGE * self.PAGE]
        key = head + self._key([p * self.PAGE for p in pages])
        self._insert(key)
        self._probe(key)

    @rule(pages=st.lists(ALPHABET, min_size=1, max_size=6))
    def insert_namespaced(self, pages: list[int]) -> None:
        key = [t for t in pages for _ in range(self.PAGE)]
        self._insert(key, extra_key="tenant")
        self._probe(key)

    @rule(i=st.integers(0, 11), cut=st.integers(0, 8), lock=st.booleans())
    def match(self, i: int, cut: int, lock: bool) -> None:
        if not self.probes:
            return
        key = self.probes[i % len(self.probes)][: cut * self.PAGE + 1]
        m = self.tree.match_prefix(key)
        if lock and len(self.locks) < 6:
            self.locks.append(self.tree.inc_lock_ref(m.node))
        self._feed()  # compat="sglang" may split on match: nothing to announce

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 5))
    def unlock(self, i: int) -> None:
        self.tree.dec_lock_ref(self.locks.pop(i % len(self.locks)))

    @rule(n=st.integers(1, 12))
    def evict_kv(self, n: int) -> None:
        self.tree.evict(kv_tokens=n)
        self._feed()

    @rule(n=st.integers(1, 3))
    def evict_states(self, n: int) -> None:
        self.tree.evict(states=n)
        self._feed()

    @rule(i=st.integers(0, 50), leaf=st.booleans())
    def evict_chosen(self, i: int, leaf: bool) -> None:
        nodes = self.tree.evictable_states()
        if leaf:
            nodes = [n for n in nodes if not n.children and not n.kv.lock]
        if not nodes:
            return
        node = nodes[i % len(nodes)]
        self.tree.evict_leaf(node) if leaf else self.tree.evict_state_of(node)
        self._feed()

    @rule()
    def reset(self) -> None:
        for receipt in self.locks:
            self.tree.dec_lock_ref(receipt)
        self.locks.clear()
        self.tree.reset()
        self._feed()

    # ----------------------------------------------------------------- oracle

    def _tree_answer(self, q: list[int]) -> tuple[int, int]:
        size = self.BLOCK
        kv = self.tree.match_prefix(q).kv_hit_len // size * size
        usable = 0
        for p in range((len(q) - 1) // size * size, 0, -size):
            if self.tree.match_prefix(q[:p]).prefix_len == p:
                usable = p
                break
        return kv, usable

    @invariant()
    def indexer_matches_tree(self) -> None:
        cold = Indexer(self.BLOCK)
        cold.apply(0, self.emitter.dump())
        for q in self.probes:
            kv, usable = self._tree_answer(q)
            got = self.direct.query(q)[0]
            assert (got.longest_matched, got.usable) == (kv, usable), (q, self.tree.pretty())
            assert got.tail_recompute == kv - usable
            assert self.vllm.query(q)[0] == got
            assert cold.query(q)[0] == got
            kv_only = self.sglang.query(q)[0]
            assert (kv_only.longest_matched, kv_only.usable) == (kv, 0)
        self._feed()  # the oracle's matches may split (compat="sglang"): still nothing new
        assert not self.emitter.take()

    def teardown(self) -> None:
        for receipt in self.locks:
            self.tree.dec_lock_ref(receipt)


def _machine(
    compat: str | None, page: int, block: int, budget: settings = MACHINE_SETTINGS
) -> type[IndexMachine]:
    kind = "Default" if compat is None else compat.replace("-", "").replace(".", "_").title()
    name = f"Index{kind}Page{page}Block{block}"
    machine = type(name, (IndexMachine,), {"COMPAT": compat, "PAGE": page, "BLOCK": block})
    machine.TestCase.settings = budget
    return machine


TestDefaultPage1Block2 = pytest.mark.slow(_machine(None, 1, 2).TestCase)
TestDefaultPage1Block3 = pytest.mark.slow(_machine(None, 1, 3).TestCase)
TestDefaultPage2Block4 = pytest.mark.slow(_machine(None, 2, 4).TestCase)
TestSglangPage1Block2 = pytest.mark.slow(_machine("sglang-0.5.15.post1", 1, 2).TestCase)
TestSglangPage2Block2 = pytest.mark.slow(_machine("sglang-0.5.15.post1", 2, 2).TestCase)
TestSglang0523Page2Block2 = pytest.mark.slow(_machine("sglang-0.5.23", 2, 2).TestCase)
TestDefaultPage1Block3Quick = _machine(None, 1, 3, QUICK_SETTINGS).TestCase
TestDefaultPage2Block4Quick = _machine(None, 2, 4, QUICK_SETTINGS).TestCase
TestSglangPage2Block2Quick = _machine("sglang-0.5.15.post1", 2, 2, QUICK_SETTINGS).TestCase
TestSglang0523Page2Block2Quick = _machine("sglang-0.5.23", 2, 2, QUICK_SETTINGS).TestCase


# ------------------------------------------------ real page sizes, several workers


def _brute(tree: MambaRadixCache, q: list[int], size: int) -> tuple[int, int]:
    """The tree's contiguous KV and usable prefix for `q`, at block granularity."""
    kv = tree.match_prefix(q).kv_hit_len // size * size
    for p in range((len(q) - 1) // size * size, 0, -size):
        if tree.match_prefix(q[:p]).prefix_len == p:
            return kv, p
    return kv, 0


@pytest.mark.parametrize("compat", [None, "sglang-0.5.15.post1", "sglang-0.5.23"])
@pytest.mark.parametrize(("page", "mult"), [(16, 1), (16, 2), (64, 1)])
def test_several_workers_at_real_page_sizes(compat: str | None, page: int, mult: int) -> None:
    """Three trees, one indexer fed their vLLM streams (one worker each); random inserts
    sharing prefixes, locks, matches, evictions and resets; after every step each
    worker's answer for every probe equals its own tree's (`_brute`)."""
    rng, size, workers = random.Random(page * 10 + mult), page * mult, 3
    trees = [MambaRadixCache(page_size=page, chunk_size=4 * page, compat=compat) for _ in "abc"]
    emitters = [EventEmitter(t, size) for t in trees]
    ix = Indexer(size)
    keys: list[list[int]] = []
    locks: list[tuple[int, LockReceipt]] = []
    for step in range(40):
        w = rng.randrange(workers)
        tree, op = trees[w], rng.choice(["insert", "insert", "lock", "unlock", "evict", "reset"])
        if op == "insert" or not keys:
            head = rng.choice(keys)[: rng.randrange(4) * page] if keys else []
            key = head + [rng.randrange(2) for _ in range(page * rng.randrange(1, 5))]
            tree.insert(key, list(range(1000 * step, 1000 * step + len(key))), step)
            keys = (keys + [key])[-8:]
        elif op == "lock":
            locks.append((w, tree.inc_lock_ref(tree.match_prefix(rng.choice(keys)).node)))
        elif op == "unlock" and locks:
            owner, receipt = locks.pop(rng.randrange(len(locks)))
            trees[owner].dec_lock_ref(receipt)
        elif op == "evict":
            tree.evict(kv_tokens=rng.randrange(1, 3 * size), states=rng.randrange(2))
        elif op == "reset" and not any(owner == w for owner, _ in locks):
            tree.reset()
        ix.apply(w, decode_batch(encode_batch(emitters[w].take(), "vllm")).events)
        probes = [
            k[:cut] + [7] * extra for k in keys for cut in (len(k), len(k) // 2) for extra in (0, 1)
        ]
        for q in probes:
            got = ix.query(q)
            for v, t in enumerate(trees):
                o = got.get(v)
                have = (0, 0) if o is None else (o.longest_matched, o.usable)
                assert have == _brute(t, q, size), (step, v, q)
