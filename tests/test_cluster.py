"""Tests for the multi-instance replay (`replay/cluster.py`) and its routers
(`replay/routers.py`).

Router decisions are worked out by hand, first on hand-built views (loads and
overlaps given), then on tiny traces whose trees are small enough to follow in the
comments. The cost rule (routers.py): cost = weight * (prefill_tokens +
max(0, input - credited)) + decode_tokens, the lowest cost wins, ties go to the
lowest index.
"""

from __future__ import annotations

import random
from array import array
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from mambaradix.geometry.profile import get_profile
from mambaradix.index import Indexer, Overlap
from mambaradix.policies import SINGLE_RUN
from mambaradix.replay.cluster import Cluster, ClusterSpec, cluster_replay, routable
from mambaradix.replay.routers import (
    ROUTERS,
    Hybrid,
    KVOverlap,
    Load,
    Oracle,
    Route,
    Router,
    RouterView,
    make_router,
)
from mambaradix.replay.run import replay
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.trace import Trace, TraceRequest
from mambaradix.replay.workloads import agent_loop, load, multi_turn
from profiles import TINY

BIG = ServingConfig(memory_gb=0.05)  # 26,315 KV tokens, 1,184 states: nothing is evicted
WALL_CLOCK = frozenset({"replay_s", "requests_per_s"})


def req(session: int | str, t: float, prompt: list[int], output: list[int]) -> TraceRequest:
    return TraceRequest(
        session, 0, t, array("q", prompt), array("q", output), len(prompt), len(output)
    )


def span(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


# ------------------------------------------------------------ hand-built views


@dataclass
class View:
    """A router's view given by hand: per instance a load and an overlap (in
    tokens: one unit per token), and what its tree would serve."""

    loads: list[Load]
    found: list[Overlap] = field(default_factory=list)
    usable_now: list[int] = field(default_factory=list)

    @property
    def instances(self) -> int:
        return len(self.loads)

    def load(self, instance: int) -> Load:
        return self.loads[instance]

    def overlaps(self, request: TraceRequest) -> list[Overlap]:
        return self.found

    def probe(self, instance: int, request: TraceRequest) -> int:
        return self.usable_now[instance]

    def hit_tokens(self, request: TraceRequest, units: int) -> int:
        return min(units, request.input_tokens - 1)


IDLE = Load(0, 0, 0, 0)
PROMPT80 = req("s", 0.0, span(0, 80), [1])


def test_round_robin_cycles_through_the_instances() -> None:
    view, router = View([IDLE] * 3), make_router("round-robin")
    assert [router.route(PROMPT80, view) for _ in range(4)] == [
        Route(0, 0),
        Route(1, 0),
        Route(2, 0),
        Route(0, 0),
    ]


def test_session_sticks_and_places_a_first_turn_on_the_least_loaded() -> None:
    router = make_router("session")
    # Requests per instance (running + waiting): 2, 0+1=1, 1 -> instance 1 and 2 tie at
    # one request; the lowest index, 1, takes session "a".
    view = View([Load(1, 1, 0, 0), Load(1, 0, 0, 0), Load(0, 1, 0, 0)])
    first = req("a", 0.0, [1, 2], [3])
    assert router.route(first, view) == Route(1, 0)
    # Later instance 1 is the busiest; "a" stays there, a new session "b" goes to 0 (0 requests).
    view = View([IDLE, Load(5, 5, 0, 0), Load(0, 1, 0, 0)])
    assert router.route(req("a", 1.0, [1, 2, 3], [4]), view) == Route(1, 0)
    assert router.route(req("b", 1.0, [9], [4]), view) == Route(0, 0)


def test_kv_overlap_credits_kv_without_a_state_hybrid_does_not() -> None:
    # An 80-token prompt. Instance 0 holds 64 tokens of its KV but no state in them (its
    # state was evicted); instance 1 holds 32 tokens of KV with a state at 32. Both idle.
    view = View([IDLE, IDLE], [Overlap(64, 0, 64), Overlap(32, 32, 0)], usable_now=[0, 32])
    # kv-overlap: cost 0 = 80 - 64 = 16, cost 1 = 80 - 32 = 48 -> instance 0, credit 64.
    assert make_router("kv-overlap").route(PROMPT80, view) == Route(0, 64)
    # hybrid: cost 0 = 80 - 0 = 80, cost 1 = 48 -> instance 1, credit 32.
    assert make_router("hybrid").route(PROMPT80, view) == Route(1, 32)
    # oracle (what the trees would serve now: 0 and 32): as hybrid.
    assert make_router("oracle").route(PROMPT80, view) == Route(1, 32)


def test_the_load_terms_can_outweigh_the_credit() -> None:
    # Instance 1 has the usable prefix (32) but 40 tokens of KV in use: hybrid's cost
    # 0 = 80, cost 1 = (80 - 32) + 40 = 88 -> instance 0, crediting nothing.
    busy = Load(0, 1, 0, 40)
    view = View([IDLE, busy], [Overlap(0, 0, 0), Overlap(32, 32, 0)])
    assert make_router("hybrid").route(PROMPT80, view) == Route(0, 0)
    # Queued prompt work counts with the overlap weight: with weight 0.5, cost 0 =
    # 0.5 * (100 + 80) = 90 with 100 tokens queued there, cost 1 = 0.5 * 48 + 40 = 64.
    view = View([Load(1, 0, 100, 0), busy], view.found)
    assert Hybrid(weight=0.5).route(PROMPT80, view) == Route(1, 32)
    # Weight 0 ignores prefill work: only the decode tokens count (0 vs 40).
    assert Hybrid(weight=0.0).route(PROMPT80, view) == Route(0, 0)


def test_credit_is_capped_at_input_minus_one_and_ties_go_to_the_lowest_index() -> None:
    # Both instances hold the whole prompt: 80 matched, capped at 79 servable.
    view = View([IDLE, IDLE], [Overlap(80, 79, 1), Overlap(80, 79, 1)], usable_now=[79, 79])
    for router in (KVOverlap(), Hybrid(), Oracle()):
        assert router.route(PROMPT80, view) == Route(0, 79)


def test_make_router_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown router 'nope'"):
        make_router("nope")
    assert set(ROUTERS) == {"round-robin", "session", "kv-overlap", "hybrid", "oracle"}


# ------------------------------------------------------- routing a whole trace

P, A, U = span(1000, 32), span(5000, 8), span(7000, 10)
Q, B, V = span(2000, 32), span(6000, 8), span(8000, 10)
# r0 (session a) at 0 s decodes 8 tokens (7 steps of 20 ms) and still runs when r1
# (session b) arrives at 0.05 s. r2, r3 come back to their sessions with the answer
# and 10 new tokens, long after everything finished; r4 is new.
HAND = Trace(
    "hand",
    [
        req("a", 0.0, P, A),
        req("b", 0.05, Q, B),
        req("a", 100.0, P + A + U, [1, 2]),
        req("b", 200.0, Q + B + V, [1, 2]),
        req("c", 300.0, span(9000, 20), [1, 2]),
    ],
)


def run_cluster(trace: Trace, router: str, cfg: ServingConfig, n: int, **spec: Any) -> Cluster:
    c = Cluster(trace, TINY, "mambaradix", cfg, make_router(router), ClusterSpec(n, **spec))
    c.run()
    return c


@pytest.mark.parametrize(
    "router, expected",
    [
        # The i-th request goes to i mod 2.
        ("round-robin", [0, 1, 0, 1, 0]),
        # r0 to 0 (both idle, lowest index); r1 to 1 (0 runs r0); r2, r3 follow their
        # sessions; r4 is a first turn with both idle: 0.
        ("session", [0, 1, 0, 1, 0]),
        # r0 to 0 (all costs 32 - 0 = 32, lowest index). r1: instance 0 holds r0's 32
        # tokens plus its outputs so far -> cost 32 + decode > 32 = cost 1 -> 1. r2: instance
        # 0 holds r0's finished sequence (P + A up to the last token fed back, 39 tokens,
        # with a state at 39): cost 0 = 50 - 39 = 11 < 50 -> 0, credit 39; r3 likewise on 1.
        # r4: nobody holds it, all idle -> 0.
        ("kv-overlap", [0, 1, 0, 1, 0]),
        ("hybrid", [0, 1, 0, 1, 0]),
        ("oracle", [0, 1, 0, 1, 0]),
    ],
)
def test_which_instance_each_request_goes_to(router: str, expected: list[int]) -> None:
    c = run_cluster(HAND, router, BIG, 2)
    assert [r.instance for r in c.routes if r] == expected
    hits = {o.request: o.hit_tokens for m in c.models for o in m.outcomes}
    # Each return turn hits its session's finished state at 32 + 8 - 1 = 39 wherever the
    # router keeps sessions together; round-robin also does here (r2 -> 0, r3 -> 1).
    assert (hits[2], hits[3]) == (39, 39)
    credits = [r.credited_tokens for r in c.routes if r]
    assert credits == (
        [0, 0, 39, 39, 0] if router in ("kv-overlap", "hybrid", "oracle") else [0] * 5
    )


def test_round_robin_splits_sessions_and_loses_their_hits() -> None:
    # Three turns of one session 100 s apart: round-robin sends turn 1 to instance 1,
    # where nothing is cached (hit 0); turn 2 comes back to 0, which holds turn 0's
    # finished sequence (32 + 8 - 1 = 39 tokens with a state). Session routing keeps all
    # three on 0: turn 1 hits 39 and turn 2 hits turn 1's finished state at 50 + 2 - 1 = 51.
    trace = Trace(
        "t",
        [
            req("a", 0.0, P, A),
            req("a", 100.0, P + A + U, [1, 2]),
            req("a", 200.0, P + A + U + [1, 2] + span(300, 5), [1, 2]),
        ],
    )
    hits = {}
    for router in ("round-robin", "session"):
        c = run_cluster(trace, router, BIG, 2)
        hits[router] = sorted((o.request, o.hit_tokens) for m in c.models for o in m.outcomes)
    assert hits["round-robin"] == [(0, 0), (1, 0), (2, 39)]
    assert hits["session"] == [(0, 0), (1, 39), (2, 51)]


# Units go down as they are cached (write-through) and, larger than the 1-byte host, straight
# to the store; links fast enough that loading beats recomputing.
STORE_ONLY = replace(BIG, host_gb=1e-9, store_gb=1e-3, tier_write="through", host_gbps=1e5,
                     host_latency_us=0.0, store_gbps=1e5, store_latency_us=0.0)  # fmt: skip


@pytest.mark.parametrize("shared", [False, True])
def test_a_shared_store_serves_a_turn_another_instance_cached(shared: bool) -> None:
    """Round-robin sends turn 1 to instance 1, where nothing is cached: with a store each,
    it misses (hit 0) as without tiers; with one store shared, it loads turn 0's finished
    sequence that instance 0 wrote there (39 tokens, all from the store). Turn 2 comes back
    to instance 0, which holds turn 0's 39 on its device; with the shared store it also loads
    the rest of turn 1's finished sequence (50 + 2 - 1 = 51), which instance 1 wrote."""
    trace = Trace(
        "t",
        [
            req("a", 0.0, P, A),
            req("a", 100.0, P + A + U, [1, 2]),
            req("a", 200.0, P + A + U + [1, 2] + span(300, 5), [1, 2]),
        ],
    )
    c = run_cluster(trace, "round-robin", STORE_ONLY, 2, shared_store=shared)
    got = {o.request: (o.hit_tokens, o.store_hit_tokens) for m in c.models for o in m.outcomes}
    assert got[1] == ((39, 39) if shared else (0, 0))
    assert got[2] == ((51, 12) if shared else (39, 0))
    stores = [m.tiered.tiers.store for m in c.models if m.tiered is not None]
    assert (stores[0] is stores[1]) is shared
    for m in c.models:
        assert m.tiered is not None
        m.tiered.residency.check_invariants()
        m.cache.check_conservation()


class Recording(Router):
    """Routes with `inner`; records, per request, what every credit rule would give
    and what each tree would serve right now (read-only), all in tokens."""

    def __init__(self, inner: Router) -> None:
        self.inner = inner
        self.needs_events = True
        self.seen: list[dict[str, list[int]]] = []

    def route(self, request: TraceRequest, view: RouterView) -> Route:
        trees = [m.cache.tree for m in view.models]  # type: ignore[attr-defined]
        key = request.input_units[:-1]
        hybrid = Hybrid().credits(request, view)  # delivers the events due by now (lag)
        self.seen.append(
            {
                "kv": KVOverlap().credits(request, view),
                "hybrid": hybrid,
                "hybrid_emitted": hybrid_emitted(request, view),
                "pending": [len(n.events) for n in view.nodes],  # type: ignore[attr-defined]
                "usable": [
                    view.hit_tokens(request, t.match_prefix(key, read_only=True).prefix_len)
                    for t in trees
                ],
                "kv_now": [
                    view.hit_tokens(request, t.match_prefix(key, read_only=True).kv_hit_len)
                    for t in trees
                ],
            }
        )
        return self.inner.route(request, view)


def hybrid_emitted(request: TraceRequest, view: RouterView) -> list[int]:
    """Hybrid's credits had every event emitted so far been delivered: the steps in
    flight at the routing time have changed the trees already, but their events are
    stamped with the step's end (`replay.cluster`'s docstring), so no lag delivers them
    by now. A fresh index fed each emitter's `dump` (the router's own stays as it is)."""
    cluster = view
    assert isinstance(cluster, Cluster)
    index = Indexer(cluster.block_units)
    for k, node in enumerate(cluster.nodes):
        assert node.emitter is not None
        index.apply(k, node.emitter.dump())
    found = index.query(request.input_units)
    none = Overlap(0, 0, 0)
    return [view.hit_tokens(request, found.get(k, none).usable) for k in range(len(cluster.nodes))]


def test_kv_overlap_over_credits_an_evicted_state_hybrid_does_not() -> None:
    # Eight state slots, policy sglang-0.5.15.post1 (LRU states; 3 free slots per admitted
    # request). r0 leaves two states: P's prompt end (32) and its finished sequence (39).
    # x1..x3 (unrelated, 10 s apart) leave two each; when x3 is admitted 2 slots are free, one
    # is evicted and the least recently used state, P's, goes: P becomes a tombstone whose KV
    # stays. r4 = P + 16 new tokens. Everything lands on instance 0 (both idle at every
    # arrival, lowest index; nobody else holds anything).
    x = [
        req(f"x{j}", 10.0 * j, span(2000 + 100 * j, 32), span(6000 + 10 * j, 8)) for j in (1, 2, 3)
    ]
    trace = Trace("evict", [req("a", 0.0, P, A), *x, req("c", 100.0, P + span(3000, 16), [1])])
    cfg = ServingConfig(memory_gb=1, kv_units=10_000, state_slots=8)
    rows = {}
    for name in ("kv-overlap", "hybrid"):
        rec = Recording(make_router(name))
        c = Cluster(trace, TINY, "sglang-0.5.15.post1", cfg, rec, ClusterSpec(2))
        c.run()
        # At r4's routing, instance 0's tree holds P's 32 tokens of KV and no state in them.
        assert (rec.seen[4]["kv_now"][0], rec.seen[4]["usable"][0]) == (32, 0)
        assert [r.instance for r in c.routes if r] == [0, 0, 0, 0, 0]
        rows[name] = {k: v for k, v in cluster_row(c, name).items()}
    # kv-overlap credits those 32 tokens (cost 48 - 32 = 16 vs 48); r4 hits 0.
    assert (rows["kv-overlap"]["credited_tokens"], rows["kv-overlap"]["mispredicted_tokens"]) == (
        32,
        32,
    )
    assert (rows["hybrid"]["credited_tokens"], rows["hybrid"]["mispredicted_tokens"]) == (0, 0)


def cluster_row(c: Cluster, router: str) -> dict[str, Any]:
    from mambaradix.replay.cluster import cluster_metrics

    return cluster_metrics(c, router)


@pytest.mark.parametrize("block", [None, 16])
def test_hybrid_never_credits_more_than_the_tree_would_serve(block: int | None) -> None:
    # Multi-turn sessions under memory pressure on 3 instances (states and KV evicted),
    # lag 0. At every routing decision, for every instance: hybrid's credit from every
    # event emitted so far is at most what that tree would serve right now, and hybrid's
    # credit is at most kv-overlap's. With the router's block at the tree's page every
    # state can be announced: that credit is exactly what the tree would serve (with
    # 16-token blocks it is floored to the block, the tree is not). An instance with no
    # events in flight has had them all delivered: there hybrid's credit as routed is
    # that one. (One whose decode step in flight evicted blocks, a step that ends after
    # the arrival, is ahead of any router's view: its events carry the step's end. At
    # this memory that happens with ours' one byte budget, where a decode step's KV can
    # evict KV that a split KV pool did not need to: request 35 on instance 1 was
    # credited 964 tokens against a tree that by then served 719.) kv-overlap credits
    # more than is usable somewhere.
    trace = multi_turn(sessions=12, turns=(5, 5), seed=3)
    cfg = ServingConfig(memory_gb=0.004, rate=20.0)
    rec = Recording(make_router("hybrid"))
    c = Cluster(trace, TINY, "mambaradix", cfg, rec, ClusterSpec(3, block_tokens=block))
    c.run()
    over = 0
    for s in rec.seen:
        for k in range(3):
            assert s["hybrid_emitted"][k] <= s["usable"][k]
            assert s["hybrid"][k] <= s["kv"][k]
            if block is None:
                assert s["hybrid_emitted"][k] == s["usable"][k]
            if not s["pending"][k]:
                assert s["hybrid"][k] == s["hybrid_emitted"][k]
            over += max(0, s["kv"][k] - s["usable"][k])
    assert over > 0
    assert sum(m.cache.evictions["states"] for m in c.models) > 0


# ------------------------------------------------------------- whole runs


SMALL_TRACES = ("synthetic-multi-turn", "synthetic-agent", "mooncake")


def small_trace(name: str) -> Trace:
    """Made when a test runs, not when pytest collects (Mooncake's file takes a second)."""
    if name == "mooncake":
        mooncake = load("mooncake")
        mooncake.requests = mooncake.requests[:250]
        return mooncake
    if name == "synthetic-agent":
        return agent_loop(sessions=4, steps=(4, 6), seed=2)
    return multi_turn(sessions=8, turns=(4, 4), seed=1)


def check_one_instance(trace: Trace, cfg: ServingConfig, routers: list[str]) -> None:
    profile = get_profile("nemotron-h-8b")
    for policy in SINGLE_RUN:  # marconi-oracle (a run per alpha) has no cluster form
        single = replay(trace, profile, policy, cfg)
        for router in routers:
            row = cluster_replay(trace, profile, policy, cfg, router, ClusterSpec(1))
            diff = {
                k: (v, row.get(k))
                for k, v in single.items()
                if k not in WALL_CLOCK and row.get(k) != v
            }
            assert not diff, (policy, router, diff)
            assert row["instances"] == 1 and row["router"] == router
            assert row["load_imbalance"] == 1.0


@pytest.mark.slow  # every policy and router on three traces: half a minute
@pytest.mark.parametrize("name", SMALL_TRACES)
def test_one_instance_reproduces_the_single_instance_replay_exactly(name: str) -> None:
    trace = small_trace(name)
    # Every metric of `replay()` (wall-clock times aside), every policy, every router.
    # 0.9 GB holds 4 states: what an extra_buffer request that reuses a state holds.
    check_one_instance(
        trace, ServingConfig(memory_gb=0.9 if trace.unit_tokens == 1 else 20.0), list(ROUTERS)
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", SMALL_TRACES)
def test_one_instance_reproduces_the_single_instance_replay_at_a_rate(name: str) -> None:
    trace = small_trace(name)
    mem = 0.9 if trace.unit_tokens == 1 else 10.0
    check_one_instance(trace, ServingConfig(memory_gb=mem, rate=50.0), list(ROUTERS))


@pytest.mark.slow
def test_conservation_and_every_request_once_on_every_instance() -> None:
    trace = multi_turn(sessions=10, turns=(4, 4), seed=5)
    cfg = ServingConfig(memory_gb=0.003, rate=40.0)
    for router in ROUTERS:
        for policy in ("sglang", "mambaradix", "marconi"):
            c = Cluster(trace, TINY, policy, cfg, make_router(router), ClusterSpec(3))
            c.run()
            seen = []
            for m in c.models:
                m.cache.check_conservation()
                m.cache.tree.check_invariants()
                assert not m.scheduler.busy
                seen += [o.request for o in m.outcomes]
                seen += [trace.requests.index(r) for r in m.dropped]
            assert sorted(seen) == list(range(len(trace)))
            routed = [r.instance for r in c.routes if r is not None]
            assert len(routed) == len(trace)
            assert [n.routed for n in c.nodes] == [routed.count(k) for k in range(3)]


def test_load_imbalance_is_the_busiest_instances_prefill_time_over_the_mean() -> None:
    # Two sessions of one request each, 100 s apart, same prompt length (no hits).
    # round-robin: one on each instance, equal prefill time -> 1.0. session: both first
    # turns find both instances idle and go to instance 0; instance 1 prefills nothing ->
    # max / mean = x / (x / 2) = 2.0.
    trace = Trace("t", [req("a", 0.0, P, A), req("b", 100.0, Q, B)])
    rr = cluster_row(run_cluster(trace, "round-robin", BIG, 2), "round-robin")
    se = cluster_row(run_cluster(trace, "session", BIG, 2), "session")
    assert rr["load_imbalance"] == pytest.approx(1.0)
    assert se["load_imbalance"] == pytest.approx(2.0)
    assert [i["requests"] for i in se["per_instance"]] == [2, 0]


def test_router_lag_hides_recent_events() -> None:
    # r2 returns to session a 100 s after r0 finished: with a 200 s lag the router has seen
    # no event yet (nothing credited, r2 goes to 0 on the tie anyway); with no lag it
    # credits r0's 39 tokens.
    trace = Trace("t", [req("a", 0.0, P, A), req("a", 100.0, P + A + U, [1, 2])])
    fresh = run_cluster(trace, "hybrid", BIG, 2)
    stale = run_cluster(trace, "hybrid", BIG, 2, router_lag_s=200.0)
    assert [r.credited_tokens for r in fresh.routes if r] == [0, 39]
    assert [r.credited_tokens for r in stale.routes if r] == [0, 0]


def test_cluster_spec_and_block_checks() -> None:
    for bad in ({"instances": 0}, {"instances": True}, {"router_lag_s": -1.0}):
        with pytest.raises(ValueError):
            ClusterSpec(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block_tokens"):
        ClusterSpec(2, block_tokens=0)
    mooncake = load("mooncake")
    mooncake.requests = mooncake.requests[:5]
    with pytest.raises(ValueError, match="multiple of the tree's page"):
        Cluster(
            mooncake,
            TINY,
            "mambaradix",
            BIG,
            make_router("hybrid"),
            ClusterSpec(2, block_tokens=100),
        )


def test_routable_relabels_units_outside_uint32_consistently() -> None:
    t = Trace(
        "t",
        [req("a", 0.0, [5, -1, 7], [-2, 1 << 40]), req("b", 1.0, [5, -1, 9], [-2])],
    )
    out = routable(t)
    # Ids inside uint32 stay; -1, -2 and 2^40 get 10, 11, 12 (above the largest, 9), in
    # order of first appearance, the same id for the same unit.
    assert [r.input_units.tolist() for r in out.requests] == [[5, 10, 7], [5, 10, 9]]
    assert [r.output_units.tolist() for r in out.requests] == [[11, 12], [11]]
    assert routable(out) is out
    assert [r.input_units.tolist() for r in t.requests][0] == [5, -1, 7]  # untouched


def test_read_only_match_changes_nothing_and_answers_the_same() -> None:
    from mambaradix import MambaRadixCache

    def build() -> MambaRadixCache:
        tree = MambaRadixCache(page_size=1, compat="sglang-0.5.15.post1")
        tree.insert(span(0, 10), span(100, 10), state=0)
        tree.insert(
            span(0, 10) + span(50, 5), span(100, 10) + span(200, 5), state=1, prev_prefix_len=10
        )
        return tree

    probe = span(0, 10) + [50, 51, 99]
    ro, rw = build(), build()
    before = ro.pretty()
    a = ro.match_prefix(probe, read_only=True)
    b = rw.match_prefix(probe)
    assert (a.prefix_len, a.kv_hit_len) == (b.prefix_len, b.kv_hit_len) == (10, 12)
    assert ro.pretty() == before and ro.node_count() == 2
    assert rw.node_count() == 3  # SGLang's lookup split the partially matched edge
    # LRU untouched: evicting one state frees the same slot as on a fresh tree.
    assert ro.evict(states=1).freed_states == build().evict(states=1).freed_states


@pytest.mark.slow
def test_hybrid_decides_as_the_oracle_with_no_lag_at_page_granularity() -> None:
    # With no lag and the router's block at the tree's page, the indexer's usable prefix
    # is what each tree would serve (the property test above), so hybrid and the oracle
    # make the same decision for every request, under memory pressure too. Round-robin
    # scatters the sessions' turns and hits less than session routing, which keeps them.
    trace = multi_turn(sessions=8, turns=(4, 4), seed=11)
    for cfg in (BIG, ServingConfig(memory_gb=0.004, rate=20.0)):
        runs = {r: run_cluster(trace, r, cfg, 4) for r in ROUTERS}
        assert runs["hybrid"].routes == runs["oracle"].routes
        row = {r: cluster_row(c, r) for r, c in runs.items()}
        assert row["hybrid"]["mispredicted_tokens"] == row["oracle"]["mispredicted_tokens"]
        assert _hit_rate(runs["session"]) > _hit_rate(runs["round-robin"])
    assert row["kv-overlap"]["mispredicted_tokens"] > row["hybrid"]["mispredicted_tokens"]


def _hit_rate(c: Cluster) -> float:
    outs = [o for m in c.models for o in m.outcomes]
    return sum(o.hit_tokens for o in outs) / sum(o.input_tokens for o in outs)


def test_random_traces_keep_every_instance_consistent() -> None:
    rng = random.Random(7)
    for _ in range(3):
        trace = multi_turn(sessions=rng.randint(3, 8), turns=(2, 4), seed=rng.randint(0, 99))
        n = rng.randint(2, 4)
        router = rng.choice(list(ROUTERS))
        cfg = ServingConfig(
            memory_gb=rng.choice([0.002, 0.004, 0.05]), rate=rng.choice([None, 30.0])
        )
        c = Cluster(
            trace,
            TINY,
            rng.choice(SINGLE_RUN),
            cfg,
            make_router(router),
            ClusterSpec(n, router_lag_s=rng.choice([0.0, 0.5])),
        )
        c.run()
        for m in c.models:
            m.cache.check_conservation()


def test_a_huge_overlap_weight_still_ranks_by_prefill_work() -> None:
    # Weight 1e308 (finite, accepted): prefill work dominates, so instance 1 (80 tokens to
    # prefill) beats instance 0 (100 queued + 80). In floats both costs overflow to inf and
    # the tie went to instance 0; the rule compared exactly picks 1, as any weight > 0 does.
    view = View([Load(1, 0, 100, 0), IDLE], [Overlap(0, 0, 0)] * 2, usable_now=[0, 0])
    for router in (KVOverlap(1e308), Hybrid(1e308), Oracle(1e308), Hybrid(2.0)):
        assert router.route(PROMPT80, view) == Route(1, 0)
    # A tiny weight: the decode tokens dominate (0 vs 40); prefill only breaks their tie.
    view = View([IDLE, Load(0, 1, 0, 40), IDLE], [Overlap(0, 0, 0)] * 3, usable_now=[0] * 3)
    view.loads[0] = Load(1, 0, 5, 0)
    assert Hybrid(1e-300).route(PROMPT80, view) == Route(2, 0)


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), -1.0, True, "1"])
def test_cost_routers_refuse_a_bad_weight(weight: Any) -> None:
    for name in ("kv-overlap", "hybrid", "oracle"):
        with pytest.raises((TypeError, ValueError), match="^weight must be a finite number >= 0"):
            make_router(name, weight)
