"""The baselines' admission rules on small hand-computed traces, vLLM's state
bytes and modes, `marconi-oracle` against each of its runs, and the bound
under memory pressure for every policy.

The hand-built TINY profile (`test_replay`) has vLLM's block at 32 tokens in
both modes (16 * ceil(20,000 / (16 * 1,000))) and a vLLM state of 32 blocks'
worth of KV bytes, 32,000 bytes. Memory 0.05 GB holds far more than these
traces, so nothing is evicted and every hit is worked out in the comments.
"""

from __future__ import annotations

import random
from array import array

import pytest

from mambaradix.lifecycle import Request
from mambaradix.replay.bound import bound_hit_tokens
from mambaradix.replay.models import get_profile
from mambaradix.replay.policies import ORACLE, POLICIES, VLLM, PolicyContext, VLLMAll, make_policy
from mambaradix.replay.policies.constants import ORACLE_ALPHAS
from mambaradix.replay.run import oracle_runs, replay
from mambaradix.replay.serving import ServingConfig, ServingModel
from mambaradix.replay.sweep import sweep
from mambaradix.replay.trace import Trace, TraceRequest
from mambaradix.replay.workloads import multi_turn
from test_replay import BIG, TINY, hits, req, toks

# A 100-token prompt P, then two requests that share P's first 70 tokens and
# then differ from P (the second and third are identical). 4-token answers.
P = toks(1000, 100)
Q = P[:70] + toks(5000, 30)
LONG = [
    req(0, 0, 0.0, P, toks(9000, 4)),
    req(1, 0, 100.0, Q, toks(9100, 4)),
    req(2, 0, 200.0, Q, toks(9200, 4)),
]


def test_vllm_align_caches_the_last_boundary_of_a_one_chunk_prefill() -> None:
    # align: n = 100, last boundary 100 - 100 % 32 = 96. The one step of 100
    # tokens would cross 96: it stops there (a state at 96) and the 4 tokens
    # left follow; decoding ends at 103 < 128: no decode state; nothing at
    # finish. The 2nd looks up 99 tokens of Q: its path leaves P at 70, below
    # which no state lies: 0; it caches 96 of Q. The 3rd hits Q's 96.
    assert hits(LONG, "vllm") == [0, 0, 96]


def test_vllm_all_caches_every_block_boundary() -> None:
    # all: states at 32, 64, 96 of P. The 2nd reaches P's state at 64 (<= 70)
    # and caches Q's boundary 96 (the next after 64). The 3rd hits 96.
    assert hits(LONG, "vllm-all") == [0, 64, 96]


def test_vllm_align_floors_each_chunk_to_whole_blocks() -> None:
    # 40-token chunks: vLLM floors each step to 32 tokens while it ends before
    # 96 (steps end at 32, 64), and the step that reaches 96 ends there: the
    # states are at 32, 64, 96, as in "all" mode. The 2nd reaches 64.
    assert hits(LONG, "vllm", chunk=40) == [0, 64, 96]


def test_vllm_caches_block_boundaries_reached_while_decoding() -> None:
    # A 20-token prompt (no boundary in prefill) and a 50-token answer:
    # decoding computes positions 20..68 and passes 32 and 64: states there,
    # none at finish (69 is mid-block). The next turn (prompt + answer + 10
    # tokens) looks up 79 tokens and reaches 64.
    first, answer = toks(1, 20), toks(500, 50)
    turns = [
        req(0, 0, 0.0, first, answer),
        req(0, 1, 100.0, first + answer + toks(900, 10), toks(950, 3)),
    ]
    assert hits(turns, "vllm") == [0, 64]
    assert hits(turns, "vllm-all") == [0, 64]


def test_vllm_stops_follow_the_aligned_split() -> None:
    # vLLM's _mamba_block_aligned_split, by hand, with a 1,040-token block and
    # an 8,192-token budget (floored to 7 blocks = 7,280): a 10,000-token
    # prompt from 0 runs 7,280, then stops at the last boundary 9,360, then
    # the rest. From a 1,040-token hit: 1,040 + 7,280 = 8,320, then 9,360.
    pol = VLLM()
    prof = get_profile("nemotron-h-8b")
    assert prof.vllm_block_tokens == 1040
    pol.attach(PolicyContext(prof, 1, 8192, prof.kv_bytes_per_token))
    r = Request(array("q", range(10_000)))
    assert pol.stops(r) == [7280, 9360]
    r.computed = 1040
    assert pol.stops(r) == [8320, 9360]
    r.computed = 9360
    assert pol.stops(r) == []


def test_vllm_all_falls_back_to_align_where_vllm_does() -> None:
    # vLLM 0.20.0 runs "all" mode for NemotronH (block 1,152: the Mamba chunk
    # grid) but not for Qwen3-Next, which falls back to "align" (block 576).
    nemo, qwen = get_profile("nemotron-h-8b"), get_profile("qwen3-next-80b-a3b")
    a, b = VLLMAll(), VLLMAll()
    a.attach(PolicyContext(nemo, 1, 8192, nemo.kv_bytes_per_token))
    b.attach(PolicyContext(qwen, 1, 8192, qwen.kv_bytes_per_token))
    assert (a.all_mode, a.block_units) == (True, 1152)
    assert (b.all_mode, b.block_units) == (False, 576)
    r = Request(array("q", range(3000)))
    assert a.stops(r) == [1152, 2304]
    assert b.stops(r) == [2880]  # align: one step, stopped at 3000 - 3000 % 576


@pytest.mark.parametrize("policy", ["vllm", "vllm-all"])
def test_vllm_states_cost_a_padded_page_per_layer(policy: str) -> None:
    # 0.05 GB x 0.9/1.9 for states: 23,684,210 bytes // 32,000 = 740 slots
    # (SGLang's 20,000-byte state would give 1,184).
    sim = ServingModel(Trace("t", LONG[:1], 1), TINY, make_policy(policy), ServingConfig(BIG))
    assert TINY.vllm_state_bytes == 32_000
    assert sim.cache.slots.capacity == int(BIG * 1e9 * 0.9 / 1.9) // 32_000 == 740


# ---------------------------------------------------------------- oracle


@pytest.mark.slow  # a replay per alpha of the oracle's grid
def test_marconi_oracle_is_the_best_of_its_runs() -> None:
    trace = multi_turn(sessions=12, seed=3)
    prof, cfg = get_profile("jamba-1.5-mini"), ServingConfig(memory_gb=0.3)
    each = {a: replay(trace, prof, f"marconi@{a:g}", cfg) for a in ORACLE_ALPHAS}
    assert all(r["alpha"] == a and r["states_evicted"] > 0 for a, r in each.items())
    rates = {a: r["token_hit_rate"] for a, r in each.items()}
    assert len(set(rates.values())) > 1  # the grid matters here
    best = max(rates.values())
    first_best = next(a for a in ORACLE_ALPHAS if rates[a] == best)
    oracle = replay(trace, prof, ORACLE, cfg)
    assert oracle["policy"] == ORACLE
    assert oracle["token_hit_rate"] == best and oracle["alpha"] == first_best
    assert oracle["oracle_grid"] == {str(a): rates[a] for a in ORACLE_ALPHAS}
    # the sweep runs the same alphas in parallel and folds them the same way
    swept = sweep(trace, prof, [ORACLE], [0.3], cfg, workers=2, progress=False)
    (row,) = swept["results"]
    assert (row["policy"], row["token_hit_rate"], row["alpha"]) == (ORACLE, best, first_best)
    assert oracle_runs() == [f"marconi@{a:g}" for a in ORACLE_ALPHAS]


def test_marconi_oracle_is_not_one_policy() -> None:
    with pytest.raises(ValueError, match="set of runs"):
        make_policy(ORACLE)


# ------------------------------------------------- the bound under pressure


def pressure_trace(seed: int, n: int = 80) -> Trace:
    """Random requests over a 3-letter alphabet (many shared prefixes), 40-120
    tokens long (so vLLM's 32-token blocks and extra_buffer's 64-token chunks
    matter), 40% of them continuing an earlier request's input + output."""
    rng = random.Random(seed)
    requests: list[TraceRequest] = []
    for i in range(n):
        inp = array("q", rng.choices(range(3), k=rng.randint(40, 120)))
        if requests and rng.random() < 0.4:
            prev = rng.choice(requests)
            base = prev.input_units + prev.output_units
            inp = base[: rng.randint(1, len(base))] + inp[: rng.randint(0, 40)]
        out = array("q", rng.choices(range(3), k=rng.randint(1, 30)))
        requests.append(TraceRequest(i, 0, rng.uniform(0, 100), inp, out, len(inp), len(out)))
    return Trace(f"pressure-{seed}", requests)


@pytest.mark.parametrize("sequential", [False, True])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_bound_caps_every_policy_under_memory_pressure(policy: str, sequential: bool) -> None:
    # 1 MB: 526 KV tokens and 23 states (14 of vLLM's) split, or one shared
    # budget: every policy evicts (the trace's sequences hold 7,350
    # tokens), and no request may reuse more than the ideal bound allows it.
    trace = pressure_trace(7)
    bound = bound_hit_tokens(trace)
    cfg = ServingConfig(memory_gb=1e-3, chunk_tokens=64, sequential=sequential)
    r = replay(trace, TINY, policy, cfg, per_request=True)
    assert r["states_evicted"] + r["kv_tokens_evicted"] > 0
    assert r["served"] + r["dropped"] == len(trace)
    assert sum(r["request_hits"]) > 0
    assert all(0 <= h <= b for h, b in zip(r["request_hits"], bound, strict=True))
