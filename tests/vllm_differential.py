"""The replay's `vllm` policy against vLLM 0.33.0's own KV cache manager, on the same request
streams: each request served alone, start to finish, in arrival order (vLLM:
``upstream_vllm.UpstreamVllm.serve``; ours: the serving model with ``sequential=True``),
both with the same block, pool, chunk and retention. ``compare`` returns the tokens each
request hit on both sides.

Streams (seeded): shared documents with questions (the junction's case), multi-turn chats
(each turn extends the previous prompt and answer), and both mixed; prompts span many
blocks, so chunked prefill splits them. ``pool_blocks`` sizes a pool in which every request
fits alone with `slack` blocks to spare: small slack puts the cache under pressure.
"""

from __future__ import annotations

import random
from array import array
from dataclasses import dataclass

from mambaradix.geometry.profile import ModelProfile
from mambaradix.replay.serving import ServingConfig, ServingModel
from mambaradix.replay.trace import Trace, TraceRequest
from upstream_vllm import UpstreamVllm

KV_BYTES_PER_TOKEN = 100


@dataclass(frozen=True)
class Setup:
    block: int = 16
    chunk: int = 64
    groups: int = 2  # Mamba groups: blocks per state
    retention: int | None = 0
    alignment: int | None = 1  # the Mamba layers' checkpoint alignment (None: none)

    def profile(self) -> ModelProfile:
        b = self.block
        return ModelProfile(
            name="differential",
            source="tests/vllm_differential.py",
            kv_bytes_per_token=KV_BYTES_PER_TOKEN,
            state_bytes=self.groups * b * KV_BYTES_PER_TOKEN,
            linear_flops_per_token=1,
            attn_flops_per_pair=1,
            vllm_block_tokens=b,
            vllm_state_bytes=self.groups * b * KV_BYTES_PER_TOKEN,
        )


Stream = list[tuple[list[int], list[int]]]  # (prompt, outputs) in arrival order


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, 50_000) for _ in range(n)]


def shared_documents(rng: random.Random, n: int, block: int) -> Stream:
    """Questions on a few documents (some sharing a preamble), some asked twice."""
    preamble = _tokens(rng, rng.randint(0, 3 * block))
    docs = [preamble + _tokens(rng, rng.randint(1, 10 * block)) for _ in range(rng.randint(1, 4))]
    asked: Stream = []
    out: Stream = []
    for _ in range(n):
        if asked and rng.random() < 0.15:
            prompt, _ = rng.choice(asked)
        else:
            prompt = rng.choice(docs) + _tokens(rng, rng.randint(1, 4 * block))
            asked.append((prompt, []))
        out.append((prompt, _tokens(rng, rng.randint(1, 3 * block))))
    return out


def multi_turn(rng: random.Random, n: int, block: int) -> Stream:
    """Conversations that interleave: each turn is the previous prompt + answer + a new
    message; now and then a turn is sent again with another message (a regenerate)."""
    system = _tokens(rng, rng.randint(0, 2 * block))
    chats: list[list[int]] = []
    out: Stream = []
    for _ in range(n):
        if not chats or rng.random() < 0.25:
            chats.append(system + _tokens(rng, rng.randint(1, 3 * block)))
        i = rng.randrange(len(chats))
        prompt = chats[i]
        answer = _tokens(rng, rng.randint(1, 3 * block))
        out.append((prompt, answer))
        if rng.random() < 0.85:  # the next turn continues this one
            chats[i] = prompt + answer + _tokens(rng, rng.randint(1, 2 * block))
        if len(prompt) > 40 * block:
            chats.pop(i)
    return out


def mixed(rng: random.Random, n: int, block: int) -> Stream:
    a, b = shared_documents(rng, n // 2, block), multi_turn(rng, n - n // 2, block)
    out = a + b
    rng.shuffle(out)
    return out


def blocks_alone(prompt: int, outputs: int, setup: Setup) -> int:
    """Blocks a request needs alone, counted generously for both sides: its KV (prompt
    and output), three states' worth of Mamba blocks (running, hit, checkpoint), and our
    scheduler's admission reserve of the output."""
    b = setup.block
    kv = -(-(prompt + outputs + 1) // b) + 1
    return kv + 3 * setup.groups + 2


def pool_blocks(stream: Stream, setup: Setup, slack: int) -> int:
    """A pool (vLLM's ``num_blocks``, its null block included) in which the largest request
    fits alone with `slack` blocks to spare."""
    return max(blocks_alone(len(p), len(o), setup) for p, o in stream) + slack + 1


def upstream_hits(stream: Stream, setup: Setup, num_blocks: int) -> list[int | None]:
    vllm = UpstreamVllm(
        setup.block,
        num_blocks,
        setup.chunk,
        mamba_groups=setup.groups,
        retention=setup.retention,
        checkpoint_alignment=setup.alignment,
    )
    return [vllm.serve(p, o) for p, o in stream]


def our_model(stream: Stream, setup: Setup, num_blocks: int) -> ServingModel:
    from mambaradix.policies import VLLM

    reqs = [
        TraceRequest(i, 0, float(i), array("q", p), array("q", o), len(p), len(o))
        for i, (p, o) in enumerate(stream)
    ]
    block_bytes = setup.block * KV_BYTES_PER_TOKEN
    cfg = ServingConfig(
        memory_gb=(num_blocks * block_bytes + 0.5) / 1e9,
        sequential=True,
        chunk_tokens=setup.chunk,
    )
    policy = VLLM(setup.retention, checkpoint_alignment=setup.alignment)
    model = ServingModel(Trace("differential", reqs), setup.profile(), policy, cfg)
    model.run()
    return model


def our_hits(stream: Stream, setup: Setup, num_blocks: int) -> list[int | None]:
    model = our_model(stream, setup, num_blocks)
    hits: list[int | None] = [None] * len(stream)
    for o in model.outcomes:
        hits[o.request] = o.cached_units
    return hits


def compare(stream: Stream, setup: Setup, num_blocks: int) -> tuple[list[int | None], ...]:
    return upstream_hits(stream, setup, num_blocks), our_hits(stream, setup, num_blocks)
