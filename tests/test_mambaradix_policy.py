"""Our policy's parts, each against numbers worked out by hand: the hit-density
estimator, the items' classes and segment ends, the value of a state, the
eviction order and the admission rule; and that the tree's hooks, not a slot
on the node, carry the policy's data."""

from __future__ import annotations

from array import array

import pytest

from mambaradix.core.node import TreeNode
from mambaradix.core.tree import MambaRadixCache
from mambaradix.geometry.profile import ModelProfile
from mambaradix.lifecycle import Request
from mambaradix.policies import MambaRadix, PolicyContext, make_policy
from mambaradix.policies.density import HitDensity, age_bin
from mambaradix.policies.items import Items
from mambaradix.policies.kinds import FINISH, STOP

# 1 FLOP per token and per attention pair: F(L) = L + L (L + 1) / 2.
UNIT = ModelProfile("unit", "hand-built", 10, 100, 1, 1)


def F(tokens: int) -> float:
    return tokens + tokens * (tokens + 1) / 2


def test_no_node_slot_for_policies() -> None:
    assert "meta" not in TreeNode.__slots__
    assert not hasattr(TreeNode(None), "meta")


# ----------------------------------------------------------------- density


def test_density_without_data_is_recency() -> None:
    d = HitDensity(prior=1.0)
    assert [d.density("x", a) for a in (0, 1, 3)] == [1.0, 0.5, 0.25]


def test_density_is_hits_per_remaining_tick() -> None:
    # Class A: segments ended by a hit at age 2 (twice) and an eviction at
    # age 4. A segment ending at x counts x - a + 1/2 ticks of life for an
    # item at age a <= x.
    d = HitDensity(prior=0.0)
    for age, hit in ((2, True), (2, True), (4, False)):
        d.record("A", age, hit)
    d.tick()
    assert d.density("A", 0) == pytest.approx(2 / (2.5 + 2.5 + 4.5))
    assert d.density("A", 2) == pytest.approx(2 / (0.5 + 0.5 + 2.5))
    assert d.density("A", 3) == 0.0  # only the eviction lies ahead
    d.record("A", 5, True)  # counts from the next tick on
    assert d.density("A", 3) == 0.0
    d.tick()
    assert d.density("A", 3) == pytest.approx(1 / (1.5 + 2.5))


def test_density_of_a_class_without_data_is_optimistic_and_fades_with_age() -> None:
    # Mean segment length over all classes: (2.5 + 2.5 + 4.5) / 3 ticks. A
    # class never seen gets prior segments of that length that end in a hit:
    # 1 / mean at age 0, fading as mean / (mean + a).
    d = HitDensity(prior=1.0)
    for age, hit in ((2, True), (2, True), (4, False)):
        d.record("A", age, hit)
    d.tick()
    mean = 9.5 / 3
    assert d.density("B", 0) == pytest.approx(1 / mean)
    assert d.density("B", 6) == pytest.approx(1 / mean * mean / (mean + 6))
    # A class with data is shrunk by one mean segment towards its own rate
    # over all ages, (2 + 1) / (9.5 + mean), faded the same way.
    target = (2 + 1) / (9.5 + mean)
    assert d.density("A", 0) == pytest.approx((2 + mean * target) / (9.5 + mean))


def test_age_bins_are_exact_then_log_spaced() -> None:
    assert [age_bin(a) for a in range(9)] == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert age_bin(16) == 8 + 4 and age_bin(32) == 8 + 8


# ------------------------------------------------------------------- items


class Ends:
    def __init__(self) -> None:
        self.ends: list[tuple[object, int, bool]] = []

    def __call__(self, cls: object, age: int, hit: bool) -> None:
        self.ends.append((cls, age, hit))


def items_on(tree: MambaRadixCache) -> tuple[Items, Ends]:
    ends = Ends()
    return Items(tree, ends, classes=True, flops=lambda units: F(units)), ends


def test_items_cover_uncover_hit_and_evict() -> None:
    tree = MambaRadixCache(page_size=1)
    items, ends = items_on(tree)
    tree.insert([1, 2, 3, 4], [10, 11, 12, 13], state=0)
    a = tree.peek([1, 2, 3, 4])
    items.add(a, "finish", now=0, covered=False)
    assert items.table[a].cls == ("finish", False, False)
    items.clock = 3
    items.hit(a, now=3)  # a hit at age 3 ends the segment, the item is reused
    assert ends.ends == [(("finish", False, False), 3, True)]
    items.clock = 5
    tree.insert([1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 14, 15], state=1, prev_prefix_len=4)
    b = tree.peek([1, 2, 3, 4, 5, 6])
    items.add(b, "finish", now=5, covered=False)  # covers a: its segment ends, no hit
    assert ends.ends[-1] == (("finish", False, True), 2, False)
    assert items.table[a].cls == ("finish", True, True)
    assert items.saved(b, items.table[b]) == F(6) - F(4)
    assert items.kv_freed(b) == 2
    items.clock = 9
    tree.evict_leaf(b)  # b's segment ends (age 4); a may be uncovered
    assert ends.ends[-1] == (("finish", False, False), 4, False)
    assert b not in items.table and items.nodes == [a]
    items.settle()
    assert ends.ends[-1] == (("finish", True, True), 4, False)
    assert items.table[a].cls == ("finish", False, True)
    assert items.saved(a, items.table[a]) == F(4) and items.kv_freed(a) == 4


def test_states_taken_mid_request_are_born_covered() -> None:
    tree = MambaRadixCache(page_size=1)
    items, ends = items_on(tree)
    tree.insert([1, 2, 3], [10, 11, 12], state=0)
    p = tree.peek([1, 2, 3])
    items.add(p, "prompt", now=0, covered=True)
    items.settle()
    assert items.table[p].cls == ("prompt", True, False) and ends.ends == []
    tree.reset()
    assert not items.table and not items.nodes


# --------------------------------------------------------- value and order


def attached(
    shared: bool = False,
    free: int = 0,
    waiting: list[Request] | None = None,
    name: str = "mambaradix",
) -> tuple[MambaRadix, MambaRadixCache]:
    tree = MambaRadixCache(page_size=1)
    pol = make_policy(name)
    assert isinstance(pol, MambaRadix)
    queue = waiting if waiting is not None else []
    ctx = PolicyContext(
        UNIT,
        1,
        64,
        10,
        1000,
        10,
        lambda: free,
        tree=tree,
        shared_memory=shared,
        waiting=lambda: queue,
    )
    pol.attach(ctx)
    return pol, tree


def cached(
    pol: MambaRadix, tree: MambaRadixCache, key: list[int], state: int, kind: str
) -> TreeNode:
    """Insert a state at `key` as a request's checkpoint of `kind` would."""
    start = 1000 * state
    tree.insert(key, range(start, start + len(key)), state)
    node = tree.peek(key)
    assert node is not None
    req = Request(array("q", key))
    req.prefix_len = len(key)
    pol.planned[id(req)] = {len(key): kind}
    pol.on_cached(req, node, FINISH if kind == "finish" else STOP)
    return node


def test_value_is_density_times_flops_saved_per_byte() -> None:
    pol, tree = attached(shared=True)
    a = cached(pol, tree, [1, 2, 3, 4], 0, "finish")
    b = cached(pol, tree, [1, 2, 3, 4, 5, 6], 1, "finish")
    # No segment has ended yet: density is 1 / (1 + age) = 1 at age 0.
    # b (a leaf): saves F(6) - F(4) over a; evicting it frees its state (100
    # bytes) and its 2 KV tokens (10 bytes each). a (covered): F(4), its
    # state alone.
    assert pol._value(b, "shared") == pytest.approx((F(6) - F(4)) / (100 + 2 * 10))
    assert pol._value(a, "shared") == pytest.approx(F(4) / 100)
    assert pol._value(b, "slot") == pytest.approx(F(6) - F(4))
    assert pol._value(b, "kv") == pytest.approx((F(6) - F(4)) / 2)


def test_eviction_takes_the_lowest_value_first() -> None:
    # Teach the policy that covered finished states are never hit and fresh
    # uncovered ones are: then a covered state goes before a leaf used less
    # recently (LRU would take the leaf).
    pol, tree = attached()
    for _ in range(20):
        pol.density.record(("finish", True, False), 1, False)
        pol.density.record(("finish", False, False), 1, True)
    pol.density.tick()
    old = cached(pol, tree, [7, 8, 9], 2, "finish")  # a leaf, the least recently used
    a = cached(pol, tree, [1, 2, 3, 4], 0, "finish")
    b = cached(pol, tree, [1, 2, 3, 4, 5, 6], 1, "finish")  # covers a
    assert pol.items.table[a].cls == ("finish", True, False)
    assert [n.state for n in tree.evictable_states()][0] == old.state  # LRU's choice
    r = pol.evict(tree, 0, 1)
    assert r.freed_states == [0] and r.freed_kv.tolist() == []  # a's slot; its KV stays
    assert a.state is None and old.state == 2 and b.state == 1


def test_a_state_a_waiting_request_will_hit_holds_a_hit_per_tick_until_then() -> None:
    """One budget, states of 100 B, KV 10 B a token. A = [1, 2, 3] and B = [7, 8, 9, 10],
    two finished sequences (leaves), both at age 0. The policy has learned that finished
    sequences are not hit: 20 segments ended at age 1 without a hit, so (density.py) life
    = 20 x 1.5 = 30 ticks, mean segment 1.5, prior weight 1.5, the class's rate 1 / 31.5,
    and the density at age 0 is (0 + 1.5 / 31.5) / (30 + 1.5) = 1 / 661.5 for both.
    Values: A F(3) / (100 + 30) = 9 / 130 / 661.5, B F(4) / 140 = 14 / 140 / 661.5: A is
    the lower and goes first. The queue holds a request that hits nothing, then one whose
    prompt extends A: it is admitted in 2 ticks, so A holds at least 1 / 2 hit per tick
    until then: A's value is 9 / 130 / 2, and B (1 / 661.5 < 1 / 2) goes instead."""
    later = Request(array("q", [1, 2, 3, 11, 12]))  # matches A: 3 tokens
    waiting = [Request(array("q", [20, 21, 22])), later]
    for name, kept, gone in (("mambaradix", 0, 1), ("mambaradix/without-queue", 1, 0)):
        pol, tree = attached(shared=True, waiting=waiting, name=name)
        for _ in range(20):
            pol.density.record(("finish", False, False), 1, False)
        pol.density.tick()
        a = cached(pol, tree, [1, 2, 3], 0, "finish")
        b = cached(pol, tree, [7, 8, 9, 10], 1, "finish")
        assert pol.density.density(("finish", False, False), 0) == pytest.approx(1 / 661.5)
        r = pol.evict(tree, 0, 1)
        assert r.freed_states == [gone], name
        assert (a.state if kept == 0 else b.state) == kept
        if name == "mambaradix":
            assert pol.known == {a: 2}
            assert pol._value(a, "shared") == pytest.approx(F(3) / 130 / 2)
        else:
            assert pol.known == {}


def test_admission_compares_with_the_state_it_would_displace() -> None:
    # Split pools, no free slot: a branch point is taken only if its value at
    # age 0 beats the lowest value held.
    pol, tree = attached(free=0)
    held = cached(pol, tree, [1, 2, 3, 4, 5, 6, 7, 8], 0, "finish")
    pol.density.record(("branch", True, False), 1, False)  # branch points: never hit
    pol.density.record(("finish", False, False), 1, True)
    pol.density.tick()
    req = Request(array("q", [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    req.prefix_len, req.computed = 0, 5
    pol.planned[id(req)] = {5: "branch"}
    assert pol._value(held, "slot") > 0
    assert pol.cache_at(req, STOP) is False
    pol.density.record(("branch", True, False), 1, True)
    pol.density.record(("branch", True, False), 1, True)
    for _ in range(10):
        pol.density.record(("finish", False, False), 1, False)
    pol.density.tick()
    assert pol.cache_at(req, STOP) is True
    free_pol, _ = attached(free=1)  # a free slot in split pools: no comparison
    free_pol.planned[id(req)] = {5: "branch"}
    assert free_pol.cache_at(req, STOP) is True


def test_one_budget_evicts_states_to_admit_a_request_that_would_be_dropped() -> None:
    """Sequential, TINY (1,000 B of KV per token, a 20,000 B state = 20 tokens' worth),
    210,000 B: room for 210 tokens. r0 = A (100 tokens) + 1 output: ours keeps A's KV
    (100 tokens), a state at its prompt end (99) and one at the finished sequence (100):
    140 used, 70 free. r1 = A[:99] + 60 new tokens + 1 output hits the state at 99. Its
    state copy takes 20 (50 free) and its match locks A[:99], leaving 1 evictable KV
    token; the admission test needs 60 + 1 output + 1 page = 62 strictly below 50 + 1:
    without the rule r1 is dropped. With it, before the match: need 60 + 1 + 1 + 20 = 82
    against 70 + 100 - 99 = 71 of room, 11 short, so the one state it does not hit (the
    leaf at 100: 20 + 1) goes; 91 free, 71 after the copy, and r1 is served with 99
    tokens hit. (The old rule, room for every request, also evicted for requests that hit
    nothing: on the tuning material's shared documents with a Qwen3-Next state it cost
    hits, 17.7% -> 16.8% at 0.75 GB.)"""
    from mambaradix.replay.run import replay
    from mambaradix.replay.serving import ServingConfig
    from mambaradix.replay.trace import Trace, TraceRequest
    from profiles import TINY

    a, new = list(range(1000, 1100)), list(range(5000, 5060))

    def req(session: int, ts: float, units: list[int], out: int) -> TraceRequest:
        return TraceRequest(session, 0, ts, array("q", units), array("q", [out]), len(units), 1)

    trace = Trace("room", [req(0, 0.0, a, 7), req(1, 10.0, a[:99] + new, 8)], 1)
    cfg = ServingConfig(memory_gb=0.00021, sequential=True)
    names = ("mambaradix", "mambaradix/without-room")
    rows = {p: replay(trace, TINY, p, cfg, per_request=True) for p in names}
    assert (rows["mambaradix"]["request_hits"], rows["mambaradix"]["dropped"]) == ([0, 99], 0)
    without = rows["mambaradix/without-room"]
    assert (without["request_hits"], without["dropped"]) == ([0, 0], 1)
    # r1 = 168 tokens that hit nothing: 168 + 1 + 1 = 170 is not below 70 free + 100
    # evictable. Dropped, it loses no hit: the rule keeps the states, and it is dropped.
    other = Trace("none", [trace.requests[0], req(1, 10.0, list(range(5000, 5168)), 8)], 1)
    for p in names:
        assert replay(other, TINY, p, cfg, per_request=True)["dropped"] == 1
