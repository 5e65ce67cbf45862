"""The replay's `vllm` row against vLLM 0.33.0's own KV cache manager (tests/upstream_vllm.py),
on the same seeded request streams, request by request: the tokens each request hits.

Default arguments (retention interval 0): no difference at all, with or without memory
pressure, at any block, chunk, group count and checkpoint alignment. Interval retention
(`vllm@dense`, `vllm@N`): the one class of difference is a kept state the tree already holds
(a prefix decoded again; vLLM keeps a second copy of the block, we keep one state), counted
by the policy (`VLLM.duplicate_states`); a stream without such a state differs nowhere.
The default tier runs a share of each; `-m slow` runs over 10,000 requests of each kind.
"""

from __future__ import annotations

import random

import pytest

vd = pytest.importorskip("vllm_differential")

KINDS = (vd.shared_documents, vd.multi_turn, vd.mixed)


def random_setup(rng: random.Random, retention: str) -> object:
    block = rng.choice([8, 16, 32])
    chunk = max(block, rng.choice([16, 40, 64, 100, 1000]))
    alignment = rng.choice([1, 1, None, block])
    value = {"sparse": 0, "dense": None, "interval": block * rng.choice([1, 2, 3])}[retention]
    return vd.Setup(block, chunk, rng.choice([1, 2, 3]), value, alignment)


def run_stream(seed: int, retention: str, n: int) -> tuple[int, int, int]:
    """(requests, differing requests, duplicate states) of one seeded stream."""
    rng = random.Random(seed)
    setup = random_setup(rng, retention)
    stream = KINDS[seed % 3](rng, n, setup.block)  # type: ignore[operator]
    blocks = vd.pool_blocks(stream, setup, rng.choice([5, 10, 30, 1000]))
    theirs = vd.upstream_hits(stream, setup, blocks)
    model = vd.our_model(stream, setup, blocks)
    ours: list[int | None] = [None] * len(stream)
    for o in model.outcomes:
        ours[o.request] = o.cached_units
    assert None not in theirs and None not in ours, "every request fits alone"
    differing = sum(a != b for a, b in zip(theirs, ours, strict=True))
    return len(stream), differing, model.policy.duplicate_states


def test_defaults_by_hand() -> None:
    """Questions on one document: the first pays in full and keeps its replay boundary;
    the second finds the document's KV past its state hit (none), stops at the junction
    and keeps its state there; the third hits the junction. Block 16, chunk 64."""
    doc = list(range(1000, 1100))  # 100 tokens: the junction is 96
    stream = [(doc + [2000 + 100 * i + j for j in range(40)], [7, 8, 9]) for i in range(3)]
    setup = vd.Setup(block=16, chunk=64, groups=2)
    blocks = vd.pool_blocks(stream, setup, 1000)
    assert vd.upstream_hits(stream, setup, blocks) == [0, 0, 96]
    assert vd.our_hits(stream, setup, blocks) == [0, 0, 96]


@pytest.mark.parametrize("seed", range(3))  # one stream of each kind
def test_defaults_match_vllm(seed: int) -> None:
    requests, differing, _ = run_stream(seed, "sparse", 30)
    assert (requests, differing) == (30, 0)


def test_interval_retention_differs_only_by_duplicate_states() -> None:
    _, differing, duplicates = run_stream(1, "dense", 30)
    assert differing == 0 or duplicates > 0


@pytest.mark.slow
def test_defaults_match_vllm_over_10000_requests() -> None:
    total = 0
    for seed in range(100, 350):
        requests, differing, _ = run_stream(seed, "sparse", 40)
        assert differing == 0, f"seed {seed}"
        total += requests
    assert total >= 10_000


@pytest.mark.slow
def test_interval_retention_over_10000_requests() -> None:
    total = with_duplicates = differing_total = 0
    for seed in range(1000, 1250):
        requests, differing, duplicates = run_stream(seed, ("dense", "interval")[seed % 2], 40)
        assert differing == 0 or duplicates > 0, f"seed {seed}: a difference without its cause"
        total += requests
        with_duplicates += duplicates > 0
        differing_total += differing
    assert total >= 10_000
    assert differing_total <= total // 100  # measured: docs/vllm-baseline.md
