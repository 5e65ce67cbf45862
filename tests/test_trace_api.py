"""The trace types and the synthetic generators refuse bad input up front
(TypeError / ValueError naming the field or parameter), and what they accept
round-trips through the neutral JSONL format and replays consistently."""

from __future__ import annotations

import math
from array import array
from typing import Any

import pytest

from mambaradix.replay.trace import Trace, TraceRequest
from mambaradix.replay.workloads import agent_loop, multi_turn, shared_prefix


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


def test_trace_refuses_duplicate_ids_and_leaves_the_list_alone() -> None:
    reqs = [request(ts=1.0), request(ts=0.5, input_units=units(9), input_tokens=1)]
    before = list(reqs)
    with pytest.raises(ValueError, match=r"requests: session 0 turn 0 is given twice"):
        Trace("t", reqs)
    assert reqs == before  # not sorted in place when refused


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
