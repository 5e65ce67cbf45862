"""The request lifecycle against SGLang 0.5.23's own (issue 16, item 3).

The same ``Scheduler`` runs over ``CacheManager(MambaRadixCache(compat="sglang-0.5.23"))`` and
over ``UpstreamLifecycle0523`` (0.5.23's own ``UnifiedRadixCache``, pools and allocation helpers
loaded from its wheel) in lockstep, on seeded streams; after every step the queues, every
in-flight request's lengths, the tree's sizes and the free KV / state slots / rows must be equal,
and every finished or aborted request's cached length (``lifecycle_differential``). The configs
are those of the 0.5.15.post1 differential (no_buffer at page 1, extra_buffer at pages 1, 16, 64;
KV, state and decode pressure; aborts while waiting, part-way through a chunked prefill and
while decoding), plus one whose decode track interval is not a multiple of the chunk (0.5.23
tracks on lcm(chunk, interval)). Pools are sized as SGLang sizes them (``max_running_requests
<= state slots // (3 + ping-pong size)``), so SGLang itself never stops (``crashes`` stays
empty).
"""

from __future__ import annotations

import dataclasses

import pytest

from lifecycle_differential import (
    CACHED,
    RETRACTIONS,
    SGLANG_0_5_23,
    Config,
    StreamShape,
    check_outcome,
    run_lockstep,
)
from test_lifecycle_differential import CONFIGS, LONG_WAIT

ODD_TRACK = (
    Config(
        "extra_buffer p16 chunk 64 track 48",
        strategy="extra_buffer",
        page=16,
        chunk=64,
        chunk_tokens=208,
        track_interval=48,
        state_slots=40,
        kv_tokens=1600,
        rows=8,
    ),
    LONG_WAIT,
    (CACHED, RETRACTIONS),
)
ALL = [*CONFIGS, ODD_TRACK]
IDS = [c.name for c, _, _ in ALL]
QUICK = {"no_buffer p1 state pressure": 90, "extra_buffer p16": 90}  # config: requests
SLOW_SEEDS = range(200, 201)


@pytest.mark.parametrize(("cfg", "shape", "expects"), [c for c in ALL if c[0].name in QUICK])
def test_lifecycle_equals_sglang_0523(
    cfg: Config, shape: StreamShape, expects: tuple[str, ...]
) -> None:
    short = dataclasses.replace(shape, requests=QUICK[cfg.name], abort_waiting=0.05)
    out = run_lockstep(cfg, short, seed=9, release=SGLANG_0_5_23)
    assert out.requests == short.requests and not out.crashes
    assert out.cached_tokens > 0 and sum(out.aborted.values()) > 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLOW_SEEDS)
@pytest.mark.parametrize(("cfg", "shape", "expects"), ALL, ids=IDS)
def test_lifecycle_equals_sglang_0523_sweep(
    cfg: Config, shape: StreamShape, expects: tuple[str, ...], seed: int
) -> None:
    check_outcome(run_lockstep(cfg, shape, seed=seed, release=SGLANG_0_5_23), shape, expects)


def test_slow_tier_covers_1e4_requests() -> None:
    assert len(SLOW_SEEDS) * sum(shape.requests for _, shape, _ in ALL) >= 10_000
