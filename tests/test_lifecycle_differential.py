"""The request lifecycle against SGLang 0.5.15.post1's own (issue 9, item 2).

The same ``Scheduler`` runs over ``CacheManager(MambaRadixCache(compat="sglang"))`` and over
``UpstreamLifecycle`` (SGLang's own cache, pools and allocation rules loaded from its wheel) in
lockstep, on seeded streams; after every step the queues, every in-flight request's lengths, the
tree's sizes and the free KV / state slots / rows must be equal, and every finished or aborted
request's cached length (see ``lifecycle_differential``). Pools are sized as SGLang sizes them:
``max_running_requests <= state slots // ratio`` (ratio 3, or 3 + ping-pong size with
extra_buffer), so SGLang itself never stops on a missing state slot (``crashes`` stays empty).
"""

from __future__ import annotations

import dataclasses

import pytest

from lifecycle_differential import Config, Outcome, StreamShape, run_lockstep

LONG = StreamShape(answer_len=(20, 300), first_token_finish=0.05, abort_decode=0.005)
TIGHT_KV = StreamShape(abort_decode=0.01)

# (config, stream): no_buffer at page 1; extra_buffer at pages 1, 16, 64. Chunk sizes divide no
# prompt in general (61, 37, 53; multiples of the page, as SGLang requires, at pages 16, 64).
CONFIGS: list[tuple[Config, StreamShape]] = [
    (Config("no_buffer p1 state pressure", state_slots=18), StreamShape()),
    (Config("no_buffer p1 KV pressure", state_slots=80, kv_tokens=1500), TIGHT_KV),
    (Config("no_buffer p1 unchunked", chunk_tokens=None, kv_tokens=1800, state_slots=40), TIGHT_KV),
    (Config("no_buffer p1 decode pressure", kv_tokens=1600, state_slots=24, rows=8), LONG),
    (
        Config(
            "extra_buffer p1",
            strategy="extra_buffer",
            chunk=16,
            track_interval=16,
            chunk_tokens=37,
            state_slots=30,
        ),
        StreamShape(),
    ),
    (
        Config(
            "extra_buffer p1 one track slot",
            strategy="extra_buffer",
            chunk=16,
            track_interval=32,
            chunk_tokens=53,
            state_slots=24,
            track_slots=1,
            kv_tokens=1600,
            rows=6,
        ),
        LONG,
    ),
    (
        Config(
            "extra_buffer p16",
            strategy="extra_buffer",
            page=16,
            chunk=16,
            chunk_tokens=112,
            track_interval=32,
            state_slots=30,
            kv_tokens=1600,
        ),
        TIGHT_KV,
    ),
    (
        Config(
            "extra_buffer p16 chunk 64",
            strategy="extra_buffer",
            page=16,
            chunk=64,
            chunk_tokens=208,
            track_interval=64,
            state_slots=40,
            kv_tokens=2400,
        ),
        LONG,
    ),
    (
        Config(
            "extra_buffer p64",
            strategy="extra_buffer",
            page=64,
            chunk=64,
            chunk_tokens=192,
            track_interval=128,
            state_slots=30,
            kv_tokens=2560,
        ),
        TIGHT_KV,
    ),
]
REQUESTS = 1300  # per config: 9 x 1300 = 11,700 requests in the default suite


def _check(outcome: Outcome, requests: int) -> None:
    assert outcome.requests == requests
    assert outcome.finished + sum(outcome.aborted.values()) == requests
    assert not outcome.crashes, f"SGLang itself would have stopped: {dict(outcome.crashes)}"


@pytest.mark.parametrize(("cfg", "shape"), CONFIGS, ids=[c.name for c, _ in CONFIGS])
def test_lifecycle_equals_sglang(cfg: Config, shape: StreamShape) -> None:
    outcome = run_lockstep(cfg, dataclasses.replace(shape, requests=REQUESTS), seed=9)
    _check(outcome, REQUESTS)


def test_streams_exercise_what_they_claim() -> None:
    """Across the default configs the streams reach every path the comparison is about."""
    totals: dict[str, int] = {}
    for cfg, shape in CONFIGS:
        out = run_lockstep(cfg, dataclasses.replace(shape, requests=300), seed=3)
        for key, value in {
            "cached": out.cached_tokens,
            "retractions": out.retractions,
            **{f"abort {k}": v for k, v in out.aborted.items()},
        }.items():
            totals[key] = totals.get(key, 0) + value
    for key in ("cached", "retractions", "abort prefill", "abort decode", "abort waiting"):
        assert totals.get(key, 0) > 0, f"no {key} in the streams: {totals}"


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 108))
@pytest.mark.parametrize(("cfg", "shape"), CONFIGS, ids=[c.name for c, _ in CONFIGS])
def test_lifecycle_equals_sglang_sweep(cfg: Config, shape: StreamShape, seed: int) -> None:
    outcome = run_lockstep(cfg, dataclasses.replace(shape, requests=2500), seed=seed)
    _check(outcome, 2500)
