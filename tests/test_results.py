"""Typed results (`mambaradix.results`): a result's `to_json()` is the dict the replay
wrote before results were typed (the same keys, values and order, rebuilt here from
the metrics' definitions and worked out by hand on a three-request trace), it survives
`json.dumps`, and its mapping view is its attributes' JSON."""

from __future__ import annotations

import dataclasses
import json
import statistics
from array import array
from typing import Any

import pytest

from mambaradix.engine.results import EngineStats
from mambaradix.policies import make_policy
from mambaradix.replay.results import ReplayResult
from mambaradix.replay.run import metrics, replay
from mambaradix.replay.serving import ServingConfig, ServingModel
from mambaradix.replay.sweep import sweep
from mambaradix.replay.trace import Trace, TraceRequest
from mambaradix.results import json_value
from profiles import TINY

BIG = 0.05  # nothing is evicted (tests/test_replay.py works the pools out)
THROUGHPUT = ServingConfig(memory_gb=1).prefill_flops_per_s


def toks(start: int, n: int) -> array[int]:
    return array("q", range(start, start + n))


def req(session: int, turn: int, ts: float, inp: array[int], out: array[int]) -> TraceRequest:
    return TraceRequest(session, turn, ts, inp, out, len(inp), len(out))


# A two-turn session (turn 2 = turn 1's 40-token prompt + its 30-token answer + 10
# new tokens: 80) and an unrelated 20-token prompt, 100 s apart (nothing queues).
# sglang inserts turn 1 up to 40 + 30 - 1 = 69 tokens with its final state: turn 2
# hits 69; the third request hits nothing. Prompt tokens 40 + 80 + 20 = 140.
PROMPT, ANSWER = toks(0, 40), toks(5000, 30)
TRACE = Trace(
    "three",
    [
        req(0, 0, 0.0, PROMPT, ANSWER),
        req(0, 1, 100.0, PROMPT + ANSWER + toks(7000, 10), toks(8000, 5)),
        req(1, 0, 200.0, toks(9000, 20), toks(9500, 5)),
    ],
    1,
)
HITS = [0, 69, 0]
PROMPTS = [40, 80, 20]


def expected_row(model: ServingModel, cfg: ServingConfig) -> dict[str, Any]:
    """The row as `replay.run.metrics` built it as a dict, key by key: the hit figures
    by hand, the pool figures from the serving model's own counters."""
    ttfts = sorted(
        TINY.prefill_flops(h, n - h) / THROUGHPUT for h, n in zip(HITS, PROMPTS, strict=True)
    )
    return {
        "policy": "sglang",
        "memory_gb": BIG,
        "requests": 3,
        "served": 3,
        "dropped": 0,
        "dropped_requests": [],
        "prompt_tokens": 140,
        "dropped_prompt_tokens": 0,
        "cached_tokens": 69,
        "token_hit_rate": 69 / 140,
        "request_hit_rate": 1 / 3,
        "kv_hit_tokens": 69,
        "flops_saved": TINY.flops_saved(69, 80),
        "ttft_mean_s": statistics.fmean(ttfts),
        "ttft_p50_s": ttfts[1],
        "ttft_p95_s": ttfts[2],  # index min(2, int(0.95 * 3))
        "retractions": 0,
        "kv_tokens_evicted": 0,
        "states_evicted": 0,
        "peak_kv_tokens": model.peak_kv,
        "kv_capacity_tokens": model.cache.kv.capacity,
        "peak_states": model.peak_states,
        "state_capacity": model.cache.slots.capacity,
        "config": dataclasses.asdict(cfg),
    }


def run_model(policy: str = "sglang") -> tuple[ServingModel, ServingConfig]:
    cfg = ServingConfig(memory_gb=BIG)
    model = ServingModel(TRACE, TINY, make_policy(policy), cfg)
    model.run()
    return model, cfg


def same_row(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Equal keys in the same order; TTFTs (sums of floats) to rounding."""
    assert list(got) == list(want)
    ttft = {k for k in want if k.startswith("ttft_")}
    assert {k: v for k, v in got.items() if k not in ttft} == {
        k: v for k, v in want.items() if k not in ttft
    }
    assert [got[k] for k in sorted(ttft)] == pytest.approx([want[k] for k in sorted(ttft)])


def test_a_result_is_the_dict_the_replay_wrote() -> None:
    model, cfg = run_model()
    result = metrics(model, "sglang", cfg)
    assert isinstance(result, ReplayResult)
    same_row(result.to_json(), expected_row(model, cfg))


def test_replay_adds_its_timing_and_the_asked_for_keys_at_the_end() -> None:
    result = replay(TRACE, TINY, "sglang", ServingConfig(memory_gb=BIG), per_request=True)
    got = result.to_json()
    model, cfg = run_model()
    want = expected_row(model, cfg)
    assert list(got) == [*want, "replay_s", "requests_per_s", "request_hits"]
    same_row({k: got[k] for k in want}, want)
    assert got["request_hits"] == HITS
    assert got["requests_per_s"] == pytest.approx(3 / got["replay_s"])
    assert "alpha" not in result and "oracle_grid" not in result and "tiers" not in result


def test_the_oracle_keeps_the_best_run_and_adds_its_grid_last() -> None:
    result = replay(TRACE, TINY, "marconi-oracle", ServingConfig(memory_gb=BIG))
    keys = list(result)
    assert keys[-4:] == ["replay_s", "requests_per_s", "alpha", "oracle_grid"]
    assert result["policy"] == "marconi-oracle" and keys[0] == "policy"
    # marconi checkpoints only branch points: turn 2's lookup finds turn 1's finished
    # state at 69 whatever the alpha (nothing is evicted), so every alpha ties
    assert set(result.oracle_grid or {}) and set((result.oracle_grid or {}).values()) == {69 / 140}


def test_a_sweep_row_is_the_replay_row_with_its_fraction_and_share_of_the_bound() -> None:
    cfg = ServingConfig(memory_gb=BIG)
    data = sweep(TRACE, TINY, ["sglang"], [BIG], cfg, workers=1, progress=False)
    got = data.to_json()
    assert list(got) == ["trace", "model", "bound", "results"]
    assert got["trace"] == {
        "name": "three",
        "requests": 3,
        "prompt_tokens": 140,
        "unit_tokens": 1,
        "source": "",
    }
    assert got["model"] == {"name": "tiny", "kv_bytes_per_token": 1000, "state_bytes": 20_000}
    # the bound reuses turn 1's whole prompt and answer: 70 of turn 2's 80 tokens
    assert got["bound"] == {"token_hit_rate": 70 / 140}
    (row,) = got["results"]
    model, _ = run_model()
    want = expected_row(model, cfg)
    assert list(row) == [*want, "replay_s", "requests_per_s", "state_fraction", "share_of_bound"]
    same_row({k: row[k] for k in want}, want)
    assert row["state_fraction"] == cfg.state_fraction
    assert row["share_of_bound"] == pytest.approx(69 / 70)


def test_the_json_round_trips_and_the_mapping_is_the_attributes_json() -> None:
    model, cfg = run_model()
    result = metrics(model, "sglang", cfg)
    data = sweep(TRACE, TINY, ["sglang"], [BIG], cfg, workers=1, progress=False)
    for r in (result, data, data.results[0]):
        assert json.loads(json.dumps(r.to_json())) == r.to_json()
        assert list(r) == list(r.to_json()) and len(r) == len(r.to_json())
        assert r == r.to_json() and dict(r.items()) == r.to_json()
    for f in dataclasses.fields(result):
        if getattr(result, f.name) is not None:
            assert result[f.name] == json_value(getattr(result, f.name))
    assert result["config"] == dataclasses.asdict(result.config)
    assert "alpha" not in result and result.get("alpha", "absent") == "absent"
    with pytest.raises(KeyError):
        result["alpha"]
    with pytest.raises(TypeError):
        result["policy"] = "x"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.policy = "x"  # type: ignore[misc]
    changed = result.to_json()
    changed["policy"] = "x"  # a fresh dict: the result does not change
    assert result.policy == "sglang"


def test_engine_stats_keep_their_keys_and_prefix_the_host_tier() -> None:
    counts = dict(
        requests=2,
        prompt_tokens=8,
        cached_tokens=2,
        computed_prefill_tokens=6,
        decode_tokens=4,
        retractions=0,
        retracted_prefill_tokens=0,
        forwards=6,
        decode_forwards=2,
        hit_rate=0.25,
        evicted_kv_tokens=3,
        evicted_states=1,
        evictions=4,
    )
    plain = EngineStats(**counts)  # type: ignore[arg-type]
    assert plain.to_json() == counts and list(plain) == list(counts)
    tiered = EngineStats(**counts, host={"loads": 1, "failed_loads": 0})  # type: ignore[arg-type]
    assert list(tiered.to_json()) == [*counts, "host_loads", "host_failed_loads"]
    assert tiered["host_loads"] == 1 and "host" not in tiered


def test_the_strategy_is_its_name_and_knows_its_page_rule() -> None:
    from mambaradix.lifecycle.strategy import (
        EXTRA_BUFFER,
        NO_BUFFER,
        STRATEGIES,
        Strategy,
        check_strategy,
    )

    assert NO_BUFFER == "no_buffer" and EXTRA_BUFFER == "extra_buffer"
    assert STRATEGIES == ("no_buffer", "extra_buffer") and ", ".join(STRATEGIES) == (
        "no_buffer, extra_buffer"
    )
    assert (
        f"{NO_BUFFER}" == str(NO_BUFFER) == "no_buffer" and json.dumps(NO_BUFFER) == '"no_buffer"'
    )
    assert Strategy("extra_buffer") is EXTRA_BUFFER and "no_buffer" in STRATEGIES
    assert {NO_BUFFER: 0}["no_buffer"] == 0 and {"no_buffer": 0}[NO_BUFFER] == 0  # hashes too
    # no_buffer checkpoints at exact token ends: pages of one token only
    assert NO_BUFFER.takes_page(1) and not NO_BUFFER.takes_page(16)
    assert EXTRA_BUFFER.takes_page(1) and EXTRA_BUFFER.takes_page(16)
    assert check_strategy("no_buffer") == "no_buffer"
    with pytest.raises(ValueError, match="strategy must be one of no_buffer, extra_buffer"):
        check_strategy("buffer")


def test_the_oracle_reports_its_best_run_the_first_among_equals() -> None:
    from mambaradix.replay.run import oracle_pick

    assert oracle_pick([0.1, 0.3, 0.3, 0.2]) == 1 and oracle_pick([0.5]) == 0
