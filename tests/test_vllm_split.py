"""Our copy-free equivalents of vLLM 0.33.0's prefill split and checkpoint helpers
(`mambaradix.policies.vllm_split`) against vLLM's own functions, loaded from its
wheel (tests/upstream_vllm.py) and called directly on the same inputs."""

from __future__ import annotations

import random

import pytest

from mambaradix.policies.vllm_split import (
    aligned_split,
    checkpoint_position,
    exports_checkpoint,
    prefill_steps,
)

upstream_vllm = pytest.importorskip("upstream_vllm")


def _cases(seed: int, n: int) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        block = rng.choice([1, 4, 16, 48, 64])
        chunk = rng.choice([1, 3, block, 2 * block + 5, 7 * block, 100])
        prompt = rng.randint(1, 12 * block)
        tokens = prompt + rng.choice([0, 0, 1, rng.randint(1, 3 * block)])
        start = rng.randint(0, tokens)
        any_position = rng.randint(0, tokens)
        junction = rng.choice([0, 0, any_position // block * block, any_position])
        alignment = rng.choice([None, 1, 1, 2, block])
        new = rng.randint(1, max(1, tokens - start))
        out.append((start, new, prompt, tokens, block, chunk, junction, alignment))
    return out


def test_aligned_split_is_vllms() -> None:
    for case in _cases(0, 1000):
        start, new, prompt, tokens, block, chunk, junction, alignment = case
        ours = aligned_split(start, new, prompt, tokens, block, chunk, junction, alignment)
        # at admission vLLM's start is computed (0) + hit; while running, computed
        at_admission = upstream_vllm.vllm_split(
            block, chunk, alignment, prompt, tokens, 0, new, hit=start, junction=junction
        )
        running = upstream_vllm.vllm_split(
            block, chunk, alignment, prompt, tokens, start, new, junction=junction
        )
        assert ours == at_admission == running, case


def test_checkpoint_helpers_are_vllms() -> None:
    up = upstream_vllm.load_upstream().kv_cache_interface
    rng = random.Random(1)
    for _ in range(2000):
        block = rng.choice([1, 4, 16, 48])
        tokens = rng.randint(0, 20 * block)
        assert checkpoint_position(tokens, block) == up.get_mamba_prefill_checkpoint_position(
            tokens, block, False
        )
        start, end = sorted(rng.randint(0, 20 * block) for _ in range(2))
        ckpt = rng.choice([checkpoint_position(end, block), rng.randint(0, 20 * block)])
        alignment = rng.choice([None, 1, 2, block])
        theirs = up.is_mamba_prefill_checkpoint_valid(start, end, ckpt, block, block, alignment)
        assert exports_checkpoint(start, end, ckpt, block, alignment) == theirs


def test_prefill_steps_by_hand() -> None:
    # block 16, chunk 40 (floored to 32 while the step ends before the prefill end):
    # 0 -> 32 -> 64 -> 100; with a junction at 48 the second step stops there.
    assert prefill_steps(0, 100, 100, 16, 40, 0, 1) == [32, 64, 100]
    assert prefill_steps(0, 100, 100, 16, 40, 48, 1) == [32, 48, 80, 100]
    # no exported checkpoint: the last step stops at the replay boundary 96 first
    assert prefill_steps(64, 100, 100, 16, 40, 0, None) == [96, 100]
    assert prefill_steps(64, 100, 100, 16, 40, 0, 1) == [100]
