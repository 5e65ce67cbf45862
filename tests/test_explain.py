"""`mambaradix explain`: the gap to the bound, split into categories.

Two kinds of test. The property: for every policy, on several traces and pool
sizes, in both disciplines, at page 1 and 16, on one instance and on several,
each request's categories add up to its bound minus its hit, where the bound
is `replay.bound`'s and the hit is what an independent `replay()` (or
`cluster_replay()`) of the same point served: explain runs the replay it
explains, unchanged. And one hand-built trace per category, whose expected
tokens are worked out in the test from how the trace is built.
"""

from __future__ import annotations

import json
import random
from array import array
from dataclasses import replace
from pathlib import Path

import pytest

from budget import DEEP
from mambaradix.cli import main
from mambaradix.geometry.profile import get_profile
from mambaradix.policies import POLICIES, SINGLE_RUN
from mambaradix.policies.base import BasePolicy
from mambaradix.policies.kinds import CHUNK
from mambaradix.replay.bound import bound_hit_tokens
from mambaradix.replay.cluster import ClusterSpec, cluster_replay
from mambaradix.replay.explain import CATEGORIES, Explanation, Seen, explain, ideal
from mambaradix.replay.explain.attribute import categories
from mambaradix.replay.run import replay
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.trace import Trace, TraceRequest
from mambaradix.replay.workloads import load, multi_turn, shared_prefix

PROFILE = get_profile("nemotron-h-8b")
BIG = ServingConfig(1.0, kv_units=100_000, state_slots=64)


class Ids:
    """Fresh token ids, so that two pieces of a trace share nothing by accident."""

    def __init__(self) -> None:
        self.next = 1000

    def __call__(self, n: int) -> array[int]:
        self.next += n
        return array("q", range(self.next - n, self.next))


def request(
    session: int, turn: int, ts: float, prompt: array[int], answer: array[int], **kw: float
) -> TraceRequest:
    return TraceRequest(session, turn, ts, prompt, answer, len(prompt), len(answer), **kw)


def only(e: Explanation, i: int) -> dict[str, int]:
    """Request i's categories that hold tokens."""
    return {k: v for k, v in e.requests[i].categories.items() if v}


def check_exact(e: Explanation, trace: Trace, hits: list[int]) -> None:
    """Each request: bound as `replay.bound`, hit as the replay, categories adding up."""
    bounds = bound_hit_tokens(trace)
    assert [r.request for r in e.requests] == list(range(len(trace)))
    for i, r in enumerate(e.requests):
        assert r.bound_tokens == bounds[i], i
        assert r.hit_tokens == hits[i], i
        assert sum(r.categories.values()) == r.bound_tokens - r.hit_tokens, (i, r)
        assert all(v >= 0 for k, v in r.categories.items() if k != "beyond_bound"), (i, r)
        assert r.categories["beyond_bound"] <= 0
        if not e.config.tiered:  # the tier levels are the hit without a tier
            assert not any(r.categories[k] for k in TIER_CATEGORIES), (i, r)
        if r.instance is None:  # dropped: its whole bound
            assert r.categories["dropped"] == r.bound_tokens and r.hit_tokens == 0
    totals = e.totals()
    assert sum(totals.values()) == e.gap_tokens == e.bound_tokens - e.hit_tokens


TIER_CATEGORIES = (
    "tier_dropped",
    "tier_kv_dropped",
    "lower_tier",
    "recompute_chosen",
    "load_failed",
)


# --------------------------------------------------------------- the property


def test_the_staircase_adds_up_whatever_it_is_given() -> None:
    """`categories` on arbitrary positions (in any order, past the bound too) and
    a block trace's token rule: the steps are >= 0 but `beyond_bound` (<= 0),
    and add up to the tokens of the bound minus those of the hit."""
    rng = random.Random(0)
    for _ in range(2000):
        bound = rng.randint(0, 40)
        reach = rng.randint(0, bound)
        hit = rng.randint(0, 45)
        seen = Seen(*(rng.randint(0, 45) for _ in Seen._fields))
        prompt = rng.randint(bound * 512 + 1, (bound + 6) * 512)

        def tokens(u: int, prompt: int = prompt) -> int:
            return min(u * 512, prompt - 1) if u else 0

        cats = categories(bound, reach, hit, seen, tokens)
        assert sum(cats.values()) == tokens(bound) - tokens(hit)
        assert cats["dropped"] == 0 and cats["beyond_bound"] <= 0
        assert all(v >= 0 for k, v in cats.items() if k != "beyond_bound")
        assert (cats["beyond_bound"] < 0) == (tokens(hit) > tokens(reach))


def conversation(ids: Ids, sessions: int = 4, gap: float = 0.1) -> Trace:
    """Each session: a 100-token prompt with a 50-token answer, then that and 20
    more tokens `gap` seconds later (before the answer can be done)."""
    reqs = []
    for s in range(sessions):
        p0, a0 = ids(100), ids(50)
        reqs.append(request(s, 0, 10.0 * s, p0, a0))
        reqs.append(request(s, 1, 10.0 * s + gap, p0 + a0 + ids(20), ids(10)))
    return Trace("conversation", reqs)


def small_traces() -> list[Trace]:
    """A conversation built by hand, and small seeded multi-turn (overlapping
    sessions, a shared system prompt) and shared-prefix traces."""
    mt = multi_turn(
        sessions=6,
        turns=(2, 5),
        system_tokens=(40, 80),
        user_tokens=(10, 40),
        output_tokens=(5, 40),
        session_rate=2.0,
        think_time_s=1.0,
        seed=3,
    )
    sp = shared_prefix(
        requests=16,
        tenants=2,
        system_tokens=(60, 120),
        question_tokens=(10, 40),
        output_tokens=(5, 30),
        rate=5.0,
        seed=1,
    )
    return [conversation(Ids()), mt, sp]


POINTS = [
    ServingConfig(1.0, kv_units=608, state_slots=6),
    ServingConfig(1.0, kv_units=3008, state_slots=9),
    BIG,
]


def check_against_replay(trace: Trace, policy: str, cfg: ServingConfig) -> Explanation:
    hits = replay(trace, PROFILE, policy, cfg, per_request=True)["request_hits"]
    e = explain(trace, PROFILE, policy, cfg)
    check_exact(e, trace, hits)
    return e


@pytest.mark.parametrize("policy", SINGLE_RUN)
def test_categories_add_up_to_the_gap_for_every_policy(policy: str) -> None:
    """Tight pools, closed and open loop and Marconi's discipline."""
    trace, cfg = small_traces()[1], POINTS[0]
    for c in (cfg, replace(cfg, open_loop=True), replace(cfg, sequential=True)):
        check_against_replay(trace, policy, c)


def test_the_policys_scheduler_hooks_still_run() -> None:
    """vllm pins its hit blocks in `before_match`: explained, it decides as replayed (the
    wrapper once dropped the hook, and a state evicted between match and lock crashed)."""
    trace = load("synthetic-agent")
    check_against_replay(trace, "vllm", ServingConfig(1.0))


def test_categories_add_up_at_page_16() -> None:
    c = replace(POINTS[0], page_size=16, track_interval=64, chunk_tokens=64)
    e = check_against_replay(small_traces()[1], "sglang-extra-buffer", c)
    assert e.totals()["unreachable"] > 0  # partial pages


@pytest.mark.slow
@pytest.mark.parametrize("policy", SINGLE_RUN)
def test_categories_add_up_on_small_traces(policy: str) -> None:
    for trace in small_traces():
        for cfg in POINTS:
            for c in (cfg, replace(cfg, open_loop=True), replace(cfg, sequential=True)):
                check_against_replay(trace, policy, c)
            if policy == "sglang-extra-buffer":
                check_against_replay(trace, policy, replace(cfg, page_size=16))


def cluster_hits(trace: Trace, policy: str, cfg: ServingConfig, spec: ClusterSpec) -> int:
    return int(cluster_replay(trace, PROFILE, policy, cfg, "round-robin", spec)["cached_tokens"])


@pytest.mark.parametrize(
    "policy",
    [
        "mambaradix",
        *[pytest.param(p, marks=pytest.mark.slow) for p in SINGLE_RUN if p != "mambaradix"],
    ],
)
def test_categories_add_up_on_several_instances(policy: str) -> None:
    trace, spec = small_traces()[1], ClusterSpec(instances=2)
    cfg = POINTS[1]
    e = explain(trace, PROFILE, policy, cfg, router="round-robin", spec=spec)
    assert e.hit_tokens == cluster_hits(trace, policy, cfg, spec)
    check_exact(e, trace, [r.hit_tokens for r in e.requests])  # per request: sums, bounds
    assert {r.instance for r in e.requests} == {0, 1}
    assert e.totals()["other_instance"] > 0


# Tight and roomy memory on each trace in the deep run (tests/budget.py); in CI, one each.
BUNDLED = (
    ("synthetic-agent", None, (1.0, 10.0) if DEEP else (1.0,)),
    ("synthetic-multi-turn", None, (1.0, 10.0) if DEEP else (10.0,)),
)


@pytest.mark.slow
@pytest.mark.parametrize("policy", SINGLE_RUN)
def test_categories_add_up_on_bundled_traces(policy: str) -> None:
    for name, limit, memories in (*BUNDLED, ("mooncake", 200, (20.0,))):
        trace = load(name)
        trace.requests = trace.requests[:limit]
        for memory in memories:
            cfg = ServingConfig(memory)
            for c in (cfg, replace(cfg, open_loop=True), replace(cfg, sequential=True)):
                check_against_replay(trace, policy, c)


@pytest.mark.slow
def test_categories_add_up_for_the_oracle() -> None:
    trace = load("synthetic-multi-turn")
    hits = replay(trace, PROFILE, "marconi-oracle", ServingConfig(1.0))["cached_tokens"]
    e = explain(trace, PROFILE, "marconi-oracle", ServingConfig(1.0))
    assert e.hit_tokens == hits
    check_exact(e, trace, [r.hit_tokens for r in e.requests])


@pytest.mark.slow
def test_categories_add_up_on_bundled_traces_paged_and_instanced() -> None:
    trace = load("synthetic-multi-turn")
    for memory in (1.0, 5.0) if DEEP else (1.0,):  # CI: the tight one (tests/budget.py)
        c = ServingConfig(memory, page_size=16)
        hits = replay(trace, PROFILE, "sglang-extra-buffer", c, per_request=True)["request_hits"]
        check_exact(explain(trace, PROFILE, "sglang-extra-buffer", c), trace, hits)
        for policy in SINGLE_RUN:
            spec = ClusterSpec(instances=3)
            e = explain(
                trace, PROFILE, policy, ServingConfig(memory), router="round-robin", spec=spec
            )
            assert e.hit_tokens == cluster_hits(trace, policy, ServingConfig(memory), spec)
            check_exact(e, trace, [r.hit_tokens for r in e.requests])


@pytest.mark.slow
def test_only_an_admission_refuses() -> None:
    """Refusals are counted for a policy that weighs its checkpoints (ours) and
    for no other: `BasePolicy.admission_kinds`."""
    trace = load("synthetic-agent")
    for policy in SINGLE_RUN:
        e = explain(trace, PROFILE, policy, ServingConfig(1.0))
        refused = e.totals()["admission_refused"]
        assert (refused > 0) == (policy == "mambaradix"), (policy, refused)


# -------------------------------------------------------------- by category


def test_never_seen_is_outside_the_gap() -> None:
    ids = Ids()
    trace = Trace(
        "t", [request(0, 0, 0.0, ids(100), ids(10)), request(1, 0, 5.0, ids(50), ids(10))]
    )
    e = explain(trace, PROFILE, "sglang", BIG)
    assert [(r.bound_tokens, r.hit_tokens, r.never_seen_tokens) for r in e.requests] == [
        (0, 0, 100),
        (0, 0, 50),
    ]
    assert e.totals() == dict.fromkeys(CATEGORIES, 0)


def test_unreachable_is_the_answers_last_token() -> None:
    """Turn 1 repeats turn 0's prompt (100) and answer (50): the bound counts 150,
    but the answer's last token never has KV: closed loop, everything kept, 149."""
    e = explain(conversation(Ids(), sessions=1), PROFILE, "sglang", BIG)
    r = e.requests[1]
    assert (r.bound_tokens, r.hit_tokens) == (150, 149)
    assert only(e, 1) == {"unreachable": 1}


def test_unreachable_and_no_checkpoint_at_page_16() -> None:
    """extra_buffer at page 16 tracks a state at 64 (the last chunk-aligned
    position of the 100-token prefill, chunk 64) and none in 50 decoded tokens
    (interval 256), so turn 0 leaves 64 tokens cached. Turn 1's bound 150, less
    the answer's last token, floored to pages: 144; unreachable 6, and 144 - 64
    = 80 that turn 0 computed but kept no state for."""
    e = explain(
        conversation(Ids(), sessions=1), PROFILE, "sglang-extra-buffer", replace(BIG, page_size=16)
    )
    assert e.requests[1].hit_tokens == 64
    assert only(e, 1) == {"unreachable": 6, "no_checkpoint": 80}


def in_flight_trace(same_session: bool) -> Trace:
    """A 100-token prompt with a 50-token answer (1 s of decoding); 0.1 s later,
    that prompt and answer and 20 more, from the same session or another."""
    ids = Ids()
    p0, a0 = ids(100), ids(50)
    later = (
        request(0, 1, 0.1, p0 + a0 + ids(20), ids(10))
        if same_session
        else request(1, 0, 0.1, p0 + a0 + ids(20), ids(10))
    )
    return Trace("t", [request(0, 0, 0.0, p0, a0), later])


def test_in_flight() -> None:
    """sglang keeps a state at the prompt end (100) while the answer is decoded:
    the later request hits 100; the answer was still running: 149 - 100 = 49
    in flight, and its last token unreachable."""
    e = explain(in_flight_trace(same_session=False), PROFILE, "sglang", BIG)
    assert e.requests[1].hit_tokens == 100
    assert only(e, 1) == {"in_flight": 49, "unreachable": 1}


def test_session_in_flight_open_loop_only() -> None:
    trace = in_flight_trace(same_session=True)
    e = explain(trace, PROFILE, "sglang", replace(BIG, open_loop=True))
    assert only(e, 1) == {"session_in_flight": 49, "unreachable": 1}
    closed = explain(trace, PROFILE, "sglang", BIG)  # the turn waits for the answer
    assert closed.requests[1].hit_tokens == 149 and only(closed, 1) == {"unreachable": 1}


def test_in_flight_includes_a_source_not_yet_released() -> None:
    """Closed loop: session 0's turn 1 (trace time 5) waits 20 s after its turn
    0's answer; session 1's request (time 6), its very prompt, is served first,
    and ours (mambaradix: a state at input - 1) then hits 19 of its 20 tokens:
    beyond its bound (turn 0's prompt and answer, 15; reachable 14): -5. Session
    1's request finds turn 0 cached (state at its end, 14) and turn 1, which
    holds 19, not yet released: 5 in flight."""
    ids = Ids()
    p0, a0 = ids(10), ids(5)
    turn1 = p0 + a0 + ids(5)
    trace = Trace(
        "t",
        [
            request(0, 0, 0.0, p0, a0),
            request(0, 1, 5.0, turn1, ids(3), think_s=20.0),
            request(1, 0, 6.0, turn1, ids(3)),
        ],
    )
    e = explain(trace, PROFILE, "mambaradix", BIG)
    assert [(r.bound_tokens, r.hit_tokens) for r in e.requests] == [(0, 0), (15, 19), (19, 14)]
    assert only(e, 1) == {"unreachable": 1, "beyond_bound": -5}
    assert only(e, 2) == {"in_flight": 5}


def test_source_dropped() -> None:
    """A 600-token prompt cannot fit 500 KV units: dropped before it ran. The
    next request shares its first 300 tokens: only the dropped one held them."""
    ids = Ids()
    big = ids(600)
    trace = Trace(
        "t", [request(0, 0, 0.0, big, ids(10)), request(1, 0, 5.0, big[:300] + ids(50), ids(10))]
    )
    e = explain(trace, PROFILE, "sglang", ServingConfig(1.0, kv_units=500, state_slots=12))
    assert e.requests[0].instance is None and only(e, 0) == {}  # dropped, with nothing to reuse
    assert e.requests[1].hit_tokens == 0
    assert only(e, 1) == {"source_dropped": 300}


def test_dropped() -> None:
    """The request that shares 100 tokens with the first but cannot fit is dropped:
    its whole bound."""
    ids = Ids()
    p0 = ids(100)
    trace = Trace(
        "t", [request(0, 0, 0.0, p0, ids(10)), request(1, 0, 5.0, p0 + ids(600), ids(10))]
    )
    e = explain(trace, PROFILE, "sglang", ServingConfig(1.0, kv_units=500, state_slots=12))
    assert e.requests[1].instance is None
    assert only(e, 1) == {"dropped": 100}


def test_no_checkpoint_at_the_branch_point() -> None:
    """The second request shares 60 of the first's 100 prompt tokens; sglang kept
    states only at 100 (prompt end) and 109 (finish): KV for 60, no state."""
    ids = Ids()
    p0 = ids(100)
    trace = Trace(
        "t", [request(0, 0, 0.0, p0, ids(10)), request(1, 0, 5.0, p0[:60] + ids(40), ids(10))]
    )
    e = explain(trace, PROFILE, "sglang", BIG)
    assert e.requests[1].hit_tokens == 0
    assert only(e, 1) == {"no_checkpoint": 60}


class RefusesChunks(BasePolicy):
    """SGLang's checkpoints, but an admission that refuses every chunk end."""

    name = "refuses-chunks"
    admission_kinds = frozenset({CHUNK})

    def cache_at(self, req: object, kind: str) -> bool:
        return kind != CHUNK


def test_admission_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 32: the first request's prefill stops at 32, 64 and 96, and
    each checkpoint is refused; it keeps states at 100 and 109. The second
    shares 70 tokens: 64 of them a refused checkpoint would have served, the
    last 6 no checkpoint at all."""
    monkeypatch.setitem(POLICIES, RefusesChunks.name, RefusesChunks)
    ids = Ids()
    p0 = ids(100)
    trace = Trace(
        "t", [request(0, 0, 0.0, p0, ids(10)), request(1, 0, 5.0, p0[:70] + ids(30), ids(10))]
    )
    e = explain(trace, PROFILE, RefusesChunks.name, replace(BIG, chunk_tokens=32))
    assert e.requests[1].hit_tokens == 0
    assert only(e, 1) == {"admission_refused": 64, "no_checkpoint": 6}


def test_kv_evicted() -> None:
    """100 KV units: the unrelated 80-token request (84 with its answer) evicts
    all 49 cached units of the first (prompt 40, answer 10); the third repeats
    the first's prompt and answer: its bound 50, reachable 49, all evicted."""
    ids = Ids()
    p0, a0 = ids(40), ids(10)
    trace = Trace(
        "t",
        [
            request(0, 0, 0.0, p0, a0),
            request(1, 0, 5.0, ids(80), ids(5)),
            request(2, 0, 10.0, p0 + a0 + ids(5), ids(5)),
        ],
    )
    serving = ServingConfig(1.0, kv_units=100, state_slots=12)
    e = explain(trace, PROFILE, "sglang-0.5.15.post1", serving)
    assert (e.requests[2].bound_tokens, e.requests[2].hit_tokens) == (50, 0)
    assert only(e, 2) == {"unreachable": 1, "kv_evicted": 49}
    # Every eviction made room for KV: the first request's 49 units (two leaves,
    # a state each) for the second, whose 84 (80 + 4) then go for the third.
    nothing = {"kv_tokens": 0, "states": 0}
    kv = {"kv_tokens": 49 + 84, "states": 4}
    assert e.evicted == {"kv": kv, "states": nothing, "both": nothing}


def state_evicted_trace() -> Trace:
    """The first request keeps states at 40 (prompt end) and 49 (finish); with 4
    slots, 2 free, admitting the unrelated second one evicts one state (SGLang's
    rules want 3 free), the oldest, at 40: its node keeps its KV and its child
    (a tombstone). The third shares the first's 40-token prompt, then leaves
    its answer."""
    ids = Ids()
    p0 = ids(40)
    return Trace(
        "t",
        [
            request(0, 0, 0.0, p0, ids(10)),
            request(1, 0, 5.0, ids(30), ids(5)),
            request(2, 0, 10.0, p0 + ids(10), ids(5)),
        ],
    )


SLOTS_4 = ServingConfig(1.0, kv_units=1000, state_slots=4)


def test_state_evicted_while_its_kv_stayed() -> None:
    e = explain(state_evicted_trace(), PROFILE, "sglang-0.5.15.post1", SLOTS_4)
    assert (e.requests[2].bound_tokens, e.requests[2].hit_tokens) == (40, 0)
    assert only(e, 2) == {"state_evicted": 40}
    assert e.evicted is not None and e.evicted["kv"]["kv_tokens"] == 0  # all for state room


def test_other_instance() -> None:
    """Round robin over 2 instances: the second request, which repeats the
    first's prompt (100) and answer (10), lands on the other instance."""
    ids = Ids()
    p0, a0 = ids(100), ids(10)
    trace = Trace("t", [request(0, 0, 0.0, p0, a0), request(1, 0, 5.0, p0 + a0 + ids(10), ids(10))])
    e = explain(trace, PROFILE, "sglang", BIG, router="round-robin", spec=ClusterSpec(2))
    assert [r.instance for r in e.requests] == [0, 1]
    assert only(e, 1) == {"unreachable": 1, "other_instance": 109}


def test_the_oracle_is_explained_on_its_best_run() -> None:
    trace = conversation(Ids())
    e = explain(trace, PROFILE, "marconi-oracle", POINTS[0])
    assert e.policy == "marconi-oracle" and e.alpha is not None
    best = replay(trace, PROFILE, "marconi-oracle", POINTS[0])
    assert e.hit_tokens == best["cached_tokens"]


# ---------------------------------------------------------------- bad input


def test_bad_input_is_refused_before_any_work() -> None:
    trace = conversation(Ids())
    with pytest.raises(ValueError, match="policy: unknown policy nope"):
        explain(trace, PROFILE, "nope", BIG)
    with pytest.raises(TypeError, match="trace"):
        explain("t", PROFILE, "sglang", BIG)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="router and spec"):
        explain(trace, PROFILE, "sglang", BIG, router="round-robin")
    with pytest.raises(ValueError, match="policy_name|policy"):
        explain(trace, PROFILE, "sglang", replace(BIG, page_size=16))
    short = ideal(Trace("t", trace.requests[:2]))
    with pytest.raises(ValueError, match="structure"):
        explain(trace, PROFILE, "sglang", BIG, structure=short)


def cli(tmp_path: Path, *args: str) -> int:
    return main(
        ["explain", "--trace", "sample", "--memory", "1", "--workers", "1", "--no-progress", *args]
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--policy", "nope"], "--policy: unknown policy nope"),
        (["--shard", "1/2", "--json", "x.json"], "--shard and --executor have no explain form"),
        (["--plot", "x.png"], "unrecognized arguments: --plot"),
        (["--json", "same.json", "--jsonl", "same.json"], "--json and --jsonl name the same file"),
        (["--policy", "sglang", "--page-size", "16"], "no_buffer needs --page-size 1"),
        (["--memory", "0.001"], "--memory"),
    ],
)
def test_cli_bad_input(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    says: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli(tmp_path, *args) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_cli_writes_the_table_the_json_and_the_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code = cli(tmp_path, "--policy", "sglang,mambaradix", "--json", "e.json", "--jsonl", "e.jsonl")
    assert code == 0
    out = capsys.readouterr().out
    assert "1 GB sglang: hit" in out and "1 GB mambaradix: hit" in out
    data = json.loads((tmp_path / "e.json").read_text())
    lines = [json.loads(x) for x in (tmp_path / "e.jsonl").read_text().splitlines()]
    trace = load("sample")
    assert len(lines) == 2 * len(trace)
    bounds = bound_hit_tokens(trace)
    for row in data["results"]:
        mine = [x for x in lines if x["policy"] == row["policy"]]
        assert [x["bound_tokens"] for x in mine] == bounds
        assert sum(x["hit_tokens"] for x in mine) == row["hit_tokens"]
        hits = replay(trace, PROFILE, row["policy"], ServingConfig(1.0))["cached_tokens"]
        assert row["hit_tokens"] == hits
        assert sum(row["categories"].values()) == row["gap_tokens"]
        for x in mine:
            assert sum(x["categories"].values()) == x["gap_tokens"]


def test_cli_jsonl_to_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli(tmp_path, "--policy", "sglang", "--jsonl", "-") == 0
    captured = capsys.readouterr()
    lines = [json.loads(x) for x in captured.out.splitlines()]
    assert len(lines) == len(load("sample")) and "gap to the bound" in captured.err
