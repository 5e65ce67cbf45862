"""The engine and the replay run the same driver: on the same requests, pool
sizes, chunk size, page size, strategy and policy, the engine's cached tokens
per request equal what `mambaradix replay` predicts, to the token (the engine
runs the real model; the replay runs virtual time over the engine's own
prompts and answers). Both models, both strategies, with memory pressure."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from mambaradix.compare import replay_prediction, unit_profile
from mambaradix.engine import Engine, build_model
from mambaradix.engine.workload import run_conversations
from mambaradix.replay.policies import (
    DefaultPolicy,
    MambaRadix,
    PolicyContext,
    SGLang,
    SGLang0515,
    SGLang0515ExtraBuffer,
    SGLangExtraBuffer,
)

pytestmark = pytest.mark.slow  # engine runs: a real model, seconds each

CASES = [
    # (policy, engine keyword arguments)
    (DefaultPolicy, {"kv_tokens": 420, "state_slots": 10, "chunk_size": 32}),
    (SGLang, {"compat": "sglang", "kv_tokens": 420, "state_slots": 12, "chunk_size": 32}),
    # SGLang 0.5.23 (compat "sglang") keeps no 3 free slots per request: less KV than
    # for 0.5.15.post1 above, so that it evicts
    (
        SGLangExtraBuffer,
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
        SGLangExtraBuffer,
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
        SGLangExtraBuffer,
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
    (MambaRadix, {"kv_tokens": 420, "state_slots": 10, "chunk_size": 32}),
    # ours where every state slot is contended: admission compares with the
    # state it would displace, and eviction ranks by learned value
    (MambaRadix, {"kv_tokens": 360, "state_slots": 6, "chunk_size": 16}),
    # the older release's rows (sglang-0.5.15.post1*): its 3 free slots per request evict
    (
        SGLang0515,
        {"compat": "sglang-0.5.15.post1", "kv_tokens": 420, "state_slots": 12, "chunk_size": 32},
    ),
    (
        SGLang0515ExtraBuffer,
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


def attach(policy: Any, eng: Engine) -> None:
    """The engine's policy sees what the replay's will: the unit profile,
    1-token units, the engine's own pools."""
    mgr = eng.mgr
    ctx = PolicyContext(
        unit_profile(),
        1,
        32,
        1,
        mgr.kv.capacity,
        mgr.slots.capacity,
        mgr.slots.available_size,
        tree=mgr.tree,
    )
    policy.attach(ctx)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_engine_cached_tokens_equal_the_replay_prediction(net: Any, case: int) -> None:
    policy_cls, kw = CASES[case]
    model = net.config.model_type.replace("_", "-") + "-tiny"
    policy = policy_cls()
    eng = Engine(model=model, net=net, checkpoints=policy, evictor=policy.evict, **kw)
    attach(policy, eng)
    run = run_conversations(eng, sessions(case), max_new_tokens=12)
    eng.check()
    cached = [r.cached_tokens for turns in run.results for r in turns]
    predicted = replay_prediction(run, eng, policy_cls())
    assert cached == predicted
    assert sum(cached) > 0 and eng.stats()["evictions"] > 0  # hits, under pressure
