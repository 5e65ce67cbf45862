"""The trace types and the synthetic generators refuse bad input up front
(TypeError / ValueError naming the field or parameter), and what they accept
round-trips through the neutral JSONL format and replays consistently."""

from __future__ import annotations

import json
import math
from array import array
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mambaradix.geometry.profile import get_profile
from mambaradix.policies import POLICIES
from mambaradix.replay.bound import bound_hit_tokens
from mambaradix.replay.run import replay
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.trace import Trace, TraceRequest
from mambaradix.replay.workloads import (
    agent_loop,
    load_jsonl,
    load_trace,
    multi_turn,
    save_jsonl,
    shared_prefix,
)


def units(*xs: int) -> array[int]:
    return array("q", xs)


def request(**kw: Any) -> TraceRequest:
    fields: dict[str, Any] = {
        "session_id": 0,
        "turn_id": 0,
        "ts": 0.0,
        "input_units": units(1, 2),
        "output_units": units(3),
        "input_tokens": 2,
        "output_tokens": 1,
    }
    fields.update(kw)
    return TraceRequest(**fields)


BAD_REQUESTS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"ts": math.nan}, ValueError, "ts must be a finite number"),
    ({"ts": math.inf}, ValueError, "ts must be a finite number"),
    ({"ts": -1.0}, ValueError, "ts must be >= 0"),
    ({"ts": "0"}, TypeError, "ts must be a number"),
    ({"ts": True}, TypeError, "ts must be a number"),
    ({"input_units": [1, 2]}, TypeError, "input_units must be an array"),
    ({"output_units": [3]}, TypeError, "output_units must be an array"),
    ({"input_units": array("d", [1.0, 2.0])}, TypeError, "input_units must be an array"),
    ({"input_tokens": 2.0}, TypeError, "input_tokens must be an int"),
    ({"output_tokens": True}, TypeError, "output_tokens must be an int"),
    ({"turn_id": "0"}, TypeError, "turn_id must be an int"),
    ({"turn_id": -1}, ValueError, "turn_id must be >= 0"),
    ({"session_id": 1.5}, TypeError, "session_id must be an int or a str"),
    ({"session_id": False}, TypeError, "session_id must be an int or a str"),
]


@pytest.mark.parametrize(("kw", "exc", "msg"), BAD_REQUESTS)
def test_trace_request_refuses_bad_fields(
    kw: dict[str, Any], exc: type[Exception], msg: str
) -> None:
    with pytest.raises(exc, match=msg):
        request(**kw)


def test_trace_request_accepts_good_fields() -> None:
    r = request(session_id="s", turn_id=3, ts=2)
    assert (r.session_id, r.turn_id, r.ts) == ("s", 3, 2)


def test_token_trace_refuses_token_counts_of_another_unit_size() -> None:
    # a 2-unit request of 5 tokens is a block request mixed into a token-level trace
    with pytest.raises(ValueError, match=r"requests\[0\].*unit_tokens=1"):
        Trace("t", [request(input_tokens=5)])
    with pytest.raises(ValueError, match=r"requests\[0\].*unit_tokens=1"):
        Trace("t", [request(output_tokens=7)])
    # block traces keep their true token counts (the last block may be partial)
    assert len(Trace("t", [request(input_tokens=513, output_tokens=512)], unit_tokens=512)) == 1


@pytest.mark.parametrize(
    ("kw", "exc", "msg"),
    [
        ({"requests": (request(),)}, TypeError, "requests must be a list"),
        ({"requests": [1]}, TypeError, r"requests\[0\] must be a TraceRequest"),
        ({"unit_tokens": 1.5}, TypeError, "unit_tokens must be an int"),
        ({"unit_tokens": True}, TypeError, "unit_tokens must be an int"),
        ({"unit_tokens": 0}, ValueError, "unit_tokens must be >= 1"),
        ({"name": 1}, TypeError, "name must be a str"),
    ],
)
def test_trace_refuses_bad_fields(kw: dict[str, Any], exc: type[Exception], msg: str) -> None:
    fields: dict[str, Any] = {"name": "t", "requests": [request()]}
    fields.update(kw)
    with pytest.raises(exc, match=msg):
        Trace(**fields)


GENERATORS = [
    (shared_prefix, {"requests": 3}),
    (multi_turn, {"sessions": 2}),
    (agent_loop, {"sessions": 2}),
]


@pytest.mark.parametrize(("gen", "small"), GENERATORS)
@pytest.mark.parametrize("seed", [1.0, "1", True, None])
def test_generators_refuse_seeds_that_are_not_ints(
    gen: Any, small: dict[str, Any], seed: Any
) -> None:
    with pytest.raises(TypeError, match="seed must be an int"):
        gen(seed=seed, **small)


@pytest.mark.parametrize(("gen", "small"), GENERATORS)
def test_generators_are_deterministic_per_seed(gen: Any, small: dict[str, Any]) -> None:
    a, b, c = gen(seed=7, **small), gen(seed=7, **small), gen(seed=8, **small)
    assert a.requests == b.requests
    assert a.requests != c.requests


@pytest.mark.parametrize(
    ("gen", "kw", "exc", "msg"),
    [
        (shared_prefix, {"requests": 2.5}, TypeError, "requests must be an int"),
        (shared_prefix, {"requests": 3, "tenants": 0}, ValueError, "tenants must be >= 1"),
        (shared_prefix, {"requests": 3, "rate": math.nan}, ValueError, "rate must be a finite"),
        (shared_prefix, {"requests": 3, "rate": math.inf}, ValueError, "rate must be a finite"),
        (shared_prefix, {"requests": 3, "tenant_skew": math.nan}, ValueError, "tenant_skew"),
        (shared_prefix, {"requests": 3, "system_tokens": (1.5, 3)}, TypeError, "system_tokens"),
        (multi_turn, {"sessions": -1}, ValueError, "sessions must be >= 0"),
        (multi_turn, {"sessions": 2, "think_time_s": math.nan}, ValueError, "think_time_s"),
        (multi_turn, {"sessions": 2, "decode_tps": math.inf}, ValueError, "decode_tps"),
        (multi_turn, {"sessions": 2, "turns": (3, 2)}, ValueError, "turns"),
        (agent_loop, {"sessions": 2.0}, TypeError, "sessions must be an int"),
        (agent_loop, {"sessions": 2, "tool_time_s": -1.0}, ValueError, "tool_time_s"),
    ],
)
def test_generators_refuse_bad_parameters(
    gen: Any, kw: dict[str, Any], exc: type[Exception], msg: str
) -> None:
    with pytest.raises(exc, match=msg):
        gen(**kw)


# -- property tests: round trip and replay consistency on random small traces --

_VOCAB = st.integers(min_value=0, max_value=2**63 - 1)


@st.composite
def token_traces(draw: st.DrawFn, vocab: st.SearchStrategy[int] = _VOCAB) -> Trace:
    """Token-level traces whose prompts often share prefixes (drawn from a few stems)."""
    stems = draw(st.lists(st.lists(vocab, min_size=1, max_size=12), min_size=1, max_size=3))
    n = draw(st.integers(min_value=1, max_value=8))
    sessions = draw(
        st.lists(
            st.one_of(st.integers(-5, 5), st.text(max_size=4)), min_size=n, max_size=n, unique=True
        )
    )
    reqs = []
    for i, sid in enumerate(sessions):
        inp = draw(st.sampled_from(stems)) + draw(st.lists(vocab, max_size=6))
        out = draw(st.lists(vocab, max_size=5))
        ts = draw(st.floats(min_value=0, max_value=1e6, allow_nan=False))
        reqs.append(TraceRequest(sid, i, ts, array("q", inp), array("q", out), len(inp), len(out)))
    return Trace("random", reqs)


def rows(t: Trace) -> list[tuple[object, ...]]:
    return [
        (
            r.session_id,
            r.turn_id,
            r.ts,
            r.input_units.tolist(),
            r.output_units.tolist(),
            r.input_tokens,
            r.output_tokens,
        )
        for r in t.requests
    ]


@pytest.mark.slow
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(trace=token_traces(), gz=st.booleans())
def test_save_then_load_round_trips_exactly(tmp_path: Path, trace: Trace, gz: bool) -> None:
    path = tmp_path / ("t.jsonl.gz" if gz else "t.jsonl")
    save_jsonl(trace, path)
    for back in (load_jsonl(path), load_trace(path)):
        assert rows(back) == rows(trace)
        assert back.unit_tokens == 1


_PROFILE = get_profile("marconi-7b")


@pytest.mark.parametrize("policy", list(POLICIES))
@settings(max_examples=15, deadline=None)
@given(trace=token_traces(st.integers(0, 3)), kv=st.integers(24, 80), slots=st.integers(4, 12))
def test_replay_results_are_consistent(policy: str, trace: Trace, kv: int, slots: int) -> None:
    cfg = ServingConfig(1.0, kv_units=kv, state_slots=slots, track_interval=4)
    try:
        out = replay(trace, _PROFILE, policy, cfg, per_request=True)
    except ValueError as e:  # too small a pool for every request: refused up front
        assert "memory" in str(e) or "state" in str(e)
        return
    json.dumps(out.to_json(), allow_nan=False)  # JSON without nan / inf
    prompts = [r.input_tokens for r in trace.requests]
    assert out["requests"] == len(trace) == out["served"] + out["dropped"]
    assert out["prompt_tokens"] == sum(prompts)
    assert out["cached_tokens"] == sum(out["request_hits"])
    assert 0 <= out["cached_tokens"] <= out["prompt_tokens"]
    assert out["token_hit_rate"] == out["cached_tokens"] / sum(prompts)
    bound = bound_hit_tokens(trace)
    for i, (hit, cap) in enumerate(zip(out["request_hits"], bound, strict=True)):
        assert 0 <= hit <= cap < max(prompts[i], 1), (i, hit, cap)
    dropped = set(out["dropped_requests"])
    assert all(out["request_hits"][i] == 0 for i in dropped)
    assert out["dropped_prompt_tokens"] == sum(prompts[i] for i in dropped)
