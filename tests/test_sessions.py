"""Closed-loop sessions: a turn reaches the server only after its previous answer.

The trace is built by hand: 4 sessions, 10 s apart; turn 0 is a fresh
100-token prompt with a 50-token answer; turn 1 (recorded 0.1 s later, long
before the answer can be done: 50 tokens at 20 ms) is turn 0's prompt and
answer plus 20 fresh tokens, with a 10-token answer. Turn 1 can reuse turn 0's
prompt and answer but the answer's last token, whose KV is never computed:
149 tokens, so a cache that holds everything hits 4 x 149 of the
4 x 100 + 4 x 170 = 1,080 prompt tokens.
"""

from __future__ import annotations

import json
from array import array
from pathlib import Path

import pytest

from mambaradix.cli import main
from mambaradix.geometry.profile import get_profile
from mambaradix.policies import make_policy
from mambaradix.replay.cluster import Cluster, ClusterSpec
from mambaradix.replay.routers import make_router
from mambaradix.replay.run import replay
from mambaradix.replay.serving import ServingConfig, ServingModel
from mambaradix.replay.sessions import Releases, previous_turns
from mambaradix.replay.trace import Trace, TraceRequest

PROFILE = get_profile("nemotron-h-8b")
SMALL = {"kv_units": 2000, "state_slots": 3}  # one request runs at a time
LARGE = {"kv_units": 100_000, "state_slots": 64}  # every turn may run at once
ALL_HIT = 4 * 149 / (4 * 100 + 4 * 170)


def conversation(think_s: float | None = None, first_answer: int = 50) -> Trace:
    reqs, nxt = [], [1000]

    def fresh(n: int) -> array[int]:
        nxt[0] += n
        return array("q", range(nxt[0] - n, nxt[0]))

    for s in range(4):
        p0, a0 = fresh(100), fresh(first_answer)
        p1, a1 = p0 + a0 + fresh(20), fresh(10)
        reqs.append(TraceRequest(s, 0, 10.0 * s, p0, a0, len(p0), len(a0)))
        reqs.append(TraceRequest(s, 1, 10.0 * s + 0.1, p1, a1, len(p1), len(a1), think_s))
    return Trace("conversation", reqs)


def served(trace: Trace, policy: str = "mambaradix", **cfg: object) -> ServingModel:
    model = ServingModel(trace, PROFILE, make_policy(policy), ServingConfig(1.0, **cfg))  # type: ignore[arg-type]
    model.run()
    return model


def turns(model: ServingModel) -> dict[int, tuple[float, float]]:
    """Request index -> (arrival, done)."""
    return {o.request: (o.arrival_s, o.done_s) for o in model.outcomes}


def test_previous_turns_follow_session_and_turn_ids() -> None:
    t = conversation()
    assert previous_turns(t) == [-1, 0, -1, 2, -1, 4, -1, 6]
    a, b = t.requests[:2]
    late = TraceRequest(9, 3, 0.0, b.input_units, b.output_units, 170, 10)
    early = TraceRequest(9, 1, 5.0, a.input_units, a.output_units, 100, 50)
    shuffled = Trace("x", [late, early])
    assert previous_turns(shuffled) == [1, -1]  # turn 1 (later in time) comes before turn 3


def test_open_loop_releases_every_request_at_its_time() -> None:
    t = conversation()
    arrivals = Releases(t, [r.ts for r in t.requests], closed=False)
    order = [arrivals.pop() for _ in range(len(t))]
    assert order == [(r.ts, i) for i, r in enumerate(t.requests)] and not arrivals.pending


@pytest.mark.parametrize("pools", [SMALL, LARGE])
def test_closed_loop_turns_never_overlap(pools: dict[str, int]) -> None:
    times = turns(served(conversation(), **pools))
    for s in range(4):
        (_, done0), (arrival1, _) = times[2 * s], times[2 * s + 1]
        # think time = the recorded arrival gap (the trace records none): 0.1 s
        assert arrival1 == pytest.approx(done0 + 0.1) and done0 > 10.0 * s + 0.1


def test_open_loop_turns_overlap_at_large_memory() -> None:
    times = turns(served(conversation(), open_loop=True, **LARGE))
    assert all(times[2 * s + 1][0] < times[2 * s][1] for s in range(4))  # before the answer


def test_a_recorded_think_time_is_used() -> None:
    times = turns(served(conversation(think_s=2.5), **LARGE))
    assert all(times[2 * s + 1][0] == pytest.approx(times[2 * s][1] + 2.5) for s in range(4))


@pytest.mark.parametrize("policy", ["mambaradix", "sglang", "marconi"])
def test_hit_rate_no_longer_falls_with_memory(policy: str) -> None:
    trace = conversation()
    rate = {
        (loop, name): replay(trace, PROFILE, policy, ServingConfig(1.0, open_loop=loop, **pools))[
            "token_hit_rate"
        ]
        for loop in (False, True)
        for name, pools in (("small", SMALL), ("large", LARGE))
    }
    assert rate[False, "small"] == rate[False, "large"] == ALL_HIT  # closed loop
    assert rate[True, "small"] == ALL_HIT > rate[True, "large"]  # the symptom


def test_a_dropped_turn_releases_the_next() -> None:
    # turn 0 needs 100 + 100 positions, more than the 160 KV units: dropped;
    # turn 1 (a fresh 50-token prompt) is released after the drop, not held forever
    reqs = []
    for s in range(2):
        big, long_answer = array("q", range(100 * s, 100 * s + 100)), array("q", [5] * 100)
        small, answer = array("q", range(9000 + 50 * s, 9050 + 50 * s)), array("q", [7] * 10)
        reqs.append(TraceRequest(s, 0, 10.0 * s, big, long_answer, 100, 100))
        reqs.append(TraceRequest(s, 1, 10.0 * s + 0.1, small, answer, 50, 10))
    trace = Trace("drops", reqs)
    model = served(trace, kv_units=160, state_slots=3)
    assert sorted(trace.requests.index(r) for r in model.dropped) == [0, 2]
    assert sorted(o.request for o in model.outcomes) == [1, 3]


def test_cluster_turns_never_overlap() -> None:
    trace = conversation()
    cfg = ServingConfig(1.0, **LARGE)  # type: ignore[arg-type]
    cluster = Cluster(
        trace, PROFILE, "mambaradix", cfg, make_router("round-robin", 1.0), ClusterSpec(2)
    )
    cluster.run()
    times = {o.request: (o.arrival_s, o.done_s) for m in cluster.models for o in m.outcomes}
    assert len(times) == len(trace)
    for s in range(4):
        assert times[2 * s + 1][0] == pytest.approx(times[2 * s][1] + 0.1)


@pytest.mark.slow  # a whole replay with its plot: about 4-10 s
def test_cli_open_loop_flag(tmp_path: Path) -> None:
    path = tmp_path / "conv.jsonl"
    rows = [
        {"session_id": r.session_id, "turn_id": r.turn_id, "ts": r.ts,
         "input_tokens": r.input_units.tolist(), "output_tokens": r.output_units.tolist()}
        for r in conversation().requests
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = {}
    for flag in ([], ["--open-loop"]):
        out = tmp_path / f"r{len(flag)}.json"
        args = ["replay", "--trace", str(path), "--memory", "20", "--policy", "sglang"]
        args += ["--workers", "1", "--no-progress", "--json", str(out), "--plot", f"{out}.png"]
        assert main(args + flag) == 0
        (result,) = json.loads(out.read_text())["results"]
        got[bool(flag)] = (result["config"]["open_loop"], result["token_hit_rate"])
    assert got[False] == (False, ALL_HIT) and got[True][0] is True and got[True][1] < ALL_HIT


@pytest.mark.slow  # loads and tokenizes every bundled workload
@pytest.mark.parametrize(
    "name",
    ["mooncake", "swe-agent", "mt-bench", "chitchat", "synthetic-multi-turn", "synthetic-agent",
     "sample"],
)  # fmt: skip
def test_every_workload_with_sessions_replays_closed_loop(name: str) -> None:
    from mambaradix.replay.workloads import load

    full = load(name)
    trace = Trace(full.name, full.requests[:400], full.unit_tokens)
    later = [(i, j) for j, i in enumerate(previous_turns(trace)) if i >= 0]
    assert later, "the workload has sessions"
    if name != "mooncake":  # the loaders record the think time they drew or read
        assert all(trace.requests[j].think_s is not None for _, j in later)
    model = served(trace, policy="mambaradix")
    times = turns(model)
    for i, j in later:
        if i in times and j in times:
            think = trace.requests[j].think_s
            gap = trace.requests[j].ts - trace.requests[i].ts
            want = times[i][1] + (think if think is not None else gap)
            assert times[j][0] == pytest.approx(want), (name, i, j)
