"""Cached == uncached in bfloat16, by construction (`deterministic=True`).

With every prefill cut on one grid of positions and states cached only there,
a cached run performs the very chunk computations an uncached run performs,
so the logits that choose each prompt's first token are BITWISE equal with
the cache on and off (`torch.equal`, not a tolerance), for both presets, on a
workload where the cache hits (shared system prompt, multi-turn). Without the
grid the same workload gives different bits: the check is sensitive.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from mambaradix.engine import Engine, Result, build_model
from mambaradix.engine.workload import run_conversations

pytestmark = pytest.mark.slow  # engine runs: a real model, seconds each

GRID = 16


@pytest.fixture(scope="module", params=["nemotron-h-tiny", "qwen3-next-tiny"])
def net(request: pytest.FixtureRequest) -> Any:
    torch.set_num_threads(1)
    return build_model(request.param, seed=0, dtype=torch.bfloat16)


def _sessions() -> list[list[list[int]]]:
    rng = random.Random(1)
    system = [rng.randrange(1024) for _ in range(45)]
    return [
        [
            (system if t == 0 else [])
            + [rng.randrange(1024) for _ in range(rng.randrange(5, 40) if t == 0 else 11)]
            for t in range(3)
        ]
        for _ in range(4)
    ]


def _serve(net: Any, cache: bool, deterministic: bool) -> tuple[Engine, list[Result]]:
    eng = Engine(
        model="x",
        net=net,
        dtype=torch.bfloat16,
        prefix_cache=cache,
        chunk_size=GRID,
        deterministic=deterministic,
    )
    run = run_conversations(eng, _sessions(), max_new_tokens=6)
    eng.check()
    return eng, [r for turns in run.results for r in turns]


def test_first_token_logits_are_bitwise_equal_with_the_cache_on_and_off(net: Any) -> None:
    eng, on = _serve(net, True, deterministic=True)
    _, off = _serve(net, False, deterministic=True)
    assert eng.stats()["hit_rate"] > 0.5 and all(r.cached_tokens % GRID == 0 for r in on)
    for a, b in zip(on, off, strict=True):
        assert torch.equal(a.logits[0], b.logits[0])
        assert a.output_ids[0] == b.output_ids[0]


def test_without_the_grid_the_bits_differ(net: Any) -> None:
    _, on = _serve(net, True, deterministic=False)
    _, off = _serve(net, False, deterministic=False)
    assert any(r.cached_tokens % GRID for r in on)  # matches off the grid
    assert not all(torch.equal(a.logits[0], b.logits[0]) for a, b in zip(on, off, strict=True))


def test_grid_states_only_at_grid_positions_reached_by_prefill(net: Any) -> None:
    eng, results = _serve(net, True, deterministic=True)
    depths = []
    stack = [(eng.mgr.tree.root, 0)]
    while stack:
        node, depth = stack.pop()
        if node.state is not None:
            depths.append(depth)
        stack.extend((c, depth + len(c.key)) for c in node.children.values())
    assert depths and all(d % GRID == 0 for d in depths)
