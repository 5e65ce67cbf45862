"""FileStore against a plain dict, step by step (Hypothesis stateful test).

The reference model is a dict key -> parts, a set of keys whose file the test damaged, and
hand-kept counters. After every step: the store's own `check_invariants()`, `exists` for
every key, the ``.bin`` files on disk, and the counters equal the model's; every `get` returns
exactly the model's bytes; `longest_prefix` equals a brute force written here. `reopen` drops
the store object and opens the directory again (a restart): only the counters reset.

Runs on /dev/shm (tmpfs, where fsync is free) to keep many steps fast; the durable path on a
real disk is exercised by test_tiers_crash.py and test_tiers_file_store.py.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mambaradix.tiers import (
    HYBRID_RULES,
    KV,
    MAMBA,
    FileStore,
    HitPolicy,
    Namespace,
    ObjectKey,
    PoolRule,
    page_hashes,
)

CHAIN = page_hashes(list(range(20)), 4)  # 5 pages
KEYS = [ObjectKey(h, pool) for h in CHAIN for pool in (KV, MAMBA)]
NS = Namespace("stateful/model")
PARTS = st.dictionaries(st.sampled_from(["conv", "ssm", "kv", "v"]), st.binary(max_size=48),
                        min_size=1, max_size=3)
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") else None
RULE_SETS = [HYBRID_RULES, (PoolRule(MAMBA, HitPolicy.TRAILING_PAGES),),
             (PoolRule(KV), PoolRule(MAMBA, HitPolicy.TRAILING_PAGES, 2))]


def brute_force_prefix(have: set[ObjectKey], rules: tuple[PoolRule, ...]) -> tuple[int, ...]:
    """Every usable prefix length, straight from the definition."""
    out = []
    for p in range(1, len(CHAIN) + 1):
        ok = True
        for r in rules:
            trailing = r.policy is HitPolicy.TRAILING_PAGES
            need = range(max(0, p - r.window) if trailing else 0, p)
            ok &= all(ObjectKey(CHAIN[i], r.pool) in have for i in need)
        if any(r.pool == KV for r in rules):  # KV is the anchor: every page before p too
            ok &= all(ObjectKey(CHAIN[i], KV) in have for i in range(p))
        if ok:
            out.append(p)
    return tuple(out)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="mrx-stateful-", dir=SCRATCH)
        self.store = FileStore(self.root, NS)
        self.model: dict[ObjectKey, dict[str, bytes]] = {}
        self.damaged: set[ObjectKey] = set()
        self.counts = {"puts": 0, "gets": 0, "hits": 0, "corrupt": 0, "deletes": 0}

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(batch=st.lists(st.tuples(st.sampled_from(KEYS), PARTS), max_size=4))
    def put(self, batch: list[tuple[ObjectKey, dict[str, bytes]]]) -> None:
        assert self.store.put(batch) == [True] * len(batch)
        for key, parts in batch:
            self.model[key] = parts
            self.damaged.discard(key)
        self.counts["puts"] += len(batch)

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=4))
    def get(self, keys: list[ObjectKey]) -> None:
        got = self.store.get(keys)
        for key, parts in zip(keys, got, strict=True):
            self.counts["gets"] += 1
            if key in self.damaged:
                assert parts is None
                self.damaged.discard(key)  # found corrupt: counted and removed
                del self.model[key]
                self.counts["corrupt"] += 1
            elif key in self.model:
                assert parts is not None
                assert {p: bytes(v) for p, v in parts.items()} == self.model[key]
                assert list(parts) == list(self.model[key])
                self.counts["hits"] += 1
            else:
                assert parts is None

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=3, unique=True))
    def delete(self, keys: list[ObjectKey]) -> None:
        expected = sum(k in self.model for k in keys)
        assert self.store.delete(keys) == expected
        for key in keys:
            self.model.pop(key, None)
            self.damaged.discard(key)
        self.counts["deletes"] += expected

    @precondition(lambda self: set(self.model) - self.damaged)
    @rule(i=st.integers(0, 100), how=st.sampled_from(["flip", "truncate", "swap"]),
          at=st.integers(0, 10_000), read_now=st.booleans())
    def damage(self, i: int, how: str, at: int, read_now: bool) -> None:
        intact = sorted(set(self.model) - self.damaged)
        key = intact[i % len(intact)]
        path = os.path.join(self.root, NS.object_name(key) + ".bin")
        with open(path, "rb") as f:
            data = bytearray(f.read())
        if how == "flip":
            data[at % len(data)] ^= 1 << (at % 8)
        elif how == "truncate":
            data = data[: at % len(data)]
        else:  # another key's valid object copied over this one
            others = [k for k in self.model if k != key and k not in self.damaged]
            if not others:
                return
            with open(os.path.join(self.root, NS.object_name(others[0]) + ".bin"), "rb") as f:
                data = bytearray(f.read())
        with open(path, "wb") as f:
            f.write(data)
        self.store.close()  # the byte count changed behind the store's back: reopen
        self.store = FileStore(self.root, NS)
        self.counts = dict.fromkeys(self.counts, 0)
        self.damaged.add(key)
        if read_now:
            self.get([key])

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = FileStore(self.root, NS)
        self.counts = dict.fromkeys(self.counts, 0)

    @rule(rules=st.sampled_from(RULE_SETS))
    def longest_prefix(self, rules: tuple[PoolRule, ...]) -> None:
        have = set(self.model)  # a damaged file still exists until a get finds it
        expected = brute_force_prefix(have, rules)
        hit = self.store.longest_prefix(CHAIN, rules)
        assert hit.restorable == expected
        assert hit.pages == (expected[-1] if expected else 0)

    @invariant()
    def matches_model(self) -> None:
        self.store.check_invariants()
        assert self.store.exists(KEYS) == [k in self.model for k in KEYS]
        on_disk = {n for n in os.listdir(self.root) if n.endswith(".bin")}
        assert on_disk == {NS.object_name(k) + ".bin" for k in self.model}
        assert not [n for n in os.listdir(self.root) if n.endswith(".tmp")]
        s = self.store.stats()
        assert (s.puts, s.gets, s.hits, s.corrupt, s.deletes) == tuple(self.counts.values())
        assert s.misses == s.gets - s.hits and s.put_rejected == 0


StoreMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=15,
                                          deadline=None)
TestFileStoreQuick = StoreMachine.TestCase


class DeepStoreMachine(StoreMachine):
    pass


DeepStoreMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40,
                                              deadline=None)
TestFileStoreDeep = pytest.mark.slow(DeepStoreMachine.TestCase)
