"""The request lifecycle against SGLang 0.5.15.post1's own (issue 9, item 2).

The same ``Scheduler`` runs over ``CacheManager(MambaRadixCache(compat="sglang-0.5.15.post1"))``
and over ``UpstreamLifecycle`` (SGLang's own cache, pools and allocation rules loaded from its
wheel) in lockstep, on seeded streams; after every step the queues, every in-flight request's
lengths, the tree's sizes and the free KV / state slots / rows must be equal, and every finished or
aborted request's cached length (see ``lifecycle_differential``). Pools are sized as SGLang sizes
them: ``max_running_requests <= state slots // ratio`` (ratio 3, or 3 + ping-pong size with
extra_buffer), so SGLang itself never stops on a missing state slot (``crashes`` stays empty)."""

from __future__ import annotations

import dataclasses
import sys
from array import array

import pytest

from budget import seeds
from lifecycle_differential import (
    CACHED,
    PREFILL_ABORTS,
    RETRACTIONS,
    Config,
    StreamShape,
    check_outcome,
    run_lockstep,
)
from mambaradix import MambaRadixCache
from upstream_sglang import UpstreamCache

LONG = StreamShape(requests=800, answer_len=(20, 240), first_token_finish=0.05, abort_decode=0.004)
LONG_WAIT = dataclasses.replace(LONG, abort_waiting=0.003)
TIGHT_KV = StreamShape(requests=1500, abort_decode=0.01)
BASE = StreamShape(requests=1500)
# Sessions whose histories fit in the KV pool, sending turns as soon as they can: multi-turn.
FEW_SESSIONS = dataclasses.replace(BASE, sessions=5, wait_for_sessions=True)

# (config, stream, what the run must contain). no_buffer at page 1; extra_buffer at pages 1,
# 16, 64. Prefill chunks (61, 37, 53; at pages 16 and 64 multiples of the page, as SGLang
# requires: 112, 208, 192) divide no prompt in general. 6 x 1500 + 3 x 800 = 11,400 requests.
CONFIGS: list[tuple[Config, StreamShape, tuple[str, ...]]] = [
    (Config("no_buffer p1 state pressure", state_slots=18), BASE, (CACHED, PREFILL_ABORTS)),
    (
        Config("no_buffer p1 KV pressure", state_slots=80, kv_tokens=1500),
        TIGHT_KV,
        (CACHED, PREFILL_ABORTS),
    ),
    (
        Config("no_buffer p1 unchunked", chunk_tokens=None, kv_tokens=6000, state_slots=40),
        FEW_SESSIONS,
        (CACHED,),
    ),
    (
        Config("no_buffer p1 decode pressure", kv_tokens=1600, state_slots=24, rows=8),
        LONG_WAIT,
        (CACHED, RETRACTIONS),
    ),
    (
        Config(
            "extra_buffer p1",
            strategy="extra_buffer",
            chunk=16,
            track_interval=16,
            chunk_tokens=37,
            state_slots=30,
        ),
        BASE,
        (CACHED, PREFILL_ABORTS),
    ),
    (
        Config(
            "extra_buffer p1 one track slot",
            strategy="extra_buffer",
            chunk=16,
            track_interval=32,
            chunk_tokens=53,
            state_slots=32,
            track_slots=1,
            kv_tokens=1600,
            rows=8,
        ),
        LONG_WAIT,
        (CACHED, RETRACTIONS),
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
        (CACHED, PREFILL_ABORTS),
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
            kv_tokens=1600,
            rows=8,
        ),
        LONG_WAIT,
        (CACHED, RETRACTIONS),
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
        (CACHED, PREFILL_ABORTS),
    ),
]
IDS = [c.name for c, _, _ in CONFIGS]


@pytest.mark.slow  # a lockstep run beside SGLang's code: 5-20 s each
@pytest.mark.parametrize(("cfg", "shape", "expects"), CONFIGS, ids=IDS)
def test_lifecycle_equals_sglang(cfg: Config, shape: StreamShape, expects: tuple[str, ...]) -> None:
    check_outcome(run_lockstep(cfg, shape, seed=9), shape, expects)


@pytest.mark.slow
@pytest.mark.parametrize("seed", seeds(100, ci=1, deep=4))
@pytest.mark.parametrize(("cfg", "shape", "expects"), CONFIGS, ids=IDS)
def test_lifecycle_equals_sglang_sweep(
    cfg: Config, shape: StreamShape, expects: tuple[str, ...], seed: int
) -> None:
    longer = dataclasses.replace(shape, requests=2 * shape.requests)
    check_outcome(run_lockstep(cfg, longer, seed=seed), longer, expects)


def test_upstream_match_with_a_limit_under_a_page_breaks_its_tree() -> None:
    """Why ``UpstreamLifecycle.match`` slices a key whose limit is shorter than a page (SGLang
    #28692): SGLang's own ``match_prefix`` with ``RadixKey(64 tokens, limit=63)`` at page 64
    (what its scheduler passes for a 64-token prompt) takes the first page for the child key
    although the limit excludes it, rounds the match down to 0 and splits the cached node
    there: an empty node, which the next eviction trips over. Our tree matches nothing."""
    upstream = UpstreamCache(page_size=64, chunk_size=64)
    key = array("q", range(64))
    upstream.insert(key, list(range(100, 164)), 5)
    radix_key = sys.modules["sglang.srt.mem_cache.radix_cache"].RadixKey
    params = sys.modules["sglang.srt.mem_cache.base_prefix_cache"].MatchPrefixParams
    got = upstream.inner.match_prefix(params(key=radix_key(key, None, limit=63)))
    assert len(got.device_indices) == 0
    (child,) = upstream.inner.root_node.children.values()
    assert len(child.key) == 0  # the split left an empty node under the root
    with pytest.raises(AssertionError, match="parent does not have child key"):
        upstream.evict(kv_tokens=64)

    ours = MambaRadixCache(page_size=64, chunk_size=64, compat="sglang-0.5.15.post1")
    ours.insert(key, array("q", range(100, 164)), 5)
    assert ours.match_prefix(key[:63]).prefix_len == 0
    assert ours.node_count() == 1
