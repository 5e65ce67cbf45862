"""The engine and the replay run the same driver and the same policies: on the same
requests, pool sizes, chunk size, page size, strategy and policy (`Engine(policy=name)`,
and a fresh copy of it in the replay), the engine's cached tokens per request equal what
`mambaradix replay` predicts, to the token (the engine runs the real model; the replay
runs virtual time over the engine's own prompts and answers), and the engine's outputs
equal those of the same engine with the cache off (fp32: exact). Both models, both
strategies, the cost-aware policies (ours, Marconi) included, with memory pressure."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from mambaradix.compare import replay_prediction
from mambaradix.engine import Engine, build_model
from mambaradix.engine.workload import run_conversations

pytestmark = pytest.mark.slow  # engine runs: a real model, seconds each

CASES = [
    # (policy, engine keyword arguments)
    ("default", {"kv_tokens": 420, "state_slots": 10, "chunk_size": 32}),
    ("sglang", {"compat": "sglang", "kv_tokens": 420, "state_slots": 12, "chunk_size": 32}),
    # SGLang 0.5.23 (compat "sglang") keeps no 3 free slots per request: less KV than
    # for 0.5.15.post1 above, so that it evicts
    (
        "sglang-extra-buffer",
        {
            "compat": "sglang",
            "strategy": "extra_buffer",
            "kv_tokens": 480,
            "state_slots": 16,
            "chunk_size": 64,
            "track_interval": 32,
        },
    ),
    (
        "sglang-extra-buffer",
        {
            "compat": "sglang",
            "strategy": "extra_buffer",
            "page_size": 16,
            "kv_tokens": 480,
            "state_slots": 16,
            "chunk_size": 64,
            "track_interval": 16,
        },
    ),
    # a page that does not divide SGLang's 64-token mamba chunk: both round the
    # chunk up to whole pages (66); 0.5.23 tracks decode states on lcm(66, interval)
    (
        "sglang-extra-buffer",
        {
            "compat": "sglang",
            "strategy": "extra_buffer",
            "page_size": 3,
            "kv_tokens": 399,
            "state_slots": 16,
            "chunk_size": 63,
            "track_interval": 66,
        },
    ),
    ("mambaradix", {"kv_tokens": 420, "state_slots": 10, "chunk_size": 32}),
    # ours where every state slot is contended: admission compares with the
    # state it would displace, and eviction ranks by learned value
    ("mambaradix", {"kv_tokens": 360, "state_slots": 6, "chunk_size": 16}),
    # Marconi (alpha fixed at 0 in both: no tuner), and at another fixed alpha
    ("marconi", {"kv_tokens": 420, "state_slots": 10, "chunk_size": 32}),
    ("marconi@1.0", {"kv_tokens": 360, "state_slots": 6, "chunk_size": 16}),
    # the older release's rows (sglang-0.5.15.post1*): its 3 free slots per request evict
    (
        "sglang-0.5.15.post1",
        {"compat": "sglang-0.5.15.post1", "kv_tokens": 420, "state_slots": 12, "chunk_size": 32},
    ),
    (
        "sglang-0.5.15.post1-extra-buffer",
        {
            "compat": "sglang-0.5.15.post1",
            "strategy": "extra_buffer",
            "kv_tokens": 640,
            "state_slots": 16,
            "chunk_size": 64,
            "track_interval": 32,
        },
    ),
]


@pytest.fixture(scope="module", params=["nemotron-h-tiny", "qwen3-next-tiny"])
def net(request: pytest.FixtureRequest) -> Any:
    torch.set_num_threads(1)
    return build_model(request.param, seed=0)


def sessions(seed: int) -> list[list[list[int]]]:
    rng = random.Random(seed)
    system = [rng.randrange(1024) for _ in range(40)]
    return [
        [
            (system if t == 0 and s % 2 else [])
            + [rng.randrange(1024) for _ in range(rng.randrange(20, 60) if t == 0 else 15)]
            for t in range(3)
        ]
        for s in range(5)
    ]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_engine_cached_tokens_equal_the_replay_prediction(net: Any, case: int) -> None:
    policy, kw = CASES[case]
    model = net.config.model_type.replace("_", "-") + "-tiny"
    eng = Engine(model=model, net=net, policy=policy, **kw)
    run = run_conversations(eng, sessions(case), max_new_tokens=12)
    eng.check()
    cached = [r.cached_tokens for turns in run.results for r in turns]
    assert cached == replay_prediction(run, eng)  # a fresh copy of the same policy
    assert sum(cached) > 0 and eng.stats()["evictions"] > 0  # hits, under pressure
    off = Engine(model=model, net=net, prefix_cache=False, **kw)
    uncached = run_conversations(off, sessions(case), max_new_tokens=12)
    assert run.output_ids() == uncached.output_ids()  # fp32: exact
