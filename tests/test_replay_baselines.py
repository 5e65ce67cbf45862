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

from mambaradix.geometry.profile import get_profile
from mambaradix.lifecycle import Request
from mambaradix.policies import ORACLE, POLICIES, PolicyContext, VLLM020All, make_policy
from mambaradix.policies.constants import ORACLE_ALPHAS
from mambaradix.policies.vllm import VLLM
from mambaradix.replay.bound import bound_hit_tokens
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


def test_vllm_keeps_the_replay_boundary_and_the_junction() -> None:
    # vLLM 0.33.0 defaults (retention 0), block 32. The 1st computes P in one step whose
    # forward exports its replay boundary floor(99 / 32) * 32 = 96: kept (no other
    # state, none while decoding). The 2nd looks up 99 tokens of Q: KV is cached for the
    # 64 tokens Q shares with P in whole blocks, but no state lies below 64: hit 0, and
    # 64 is a junction, where its prefill stops and keeps the state, as it keeps its own
    # replay boundary 96. The 3rd (Q again) hits 96.
    assert hits(LONG, "vllm") == [0, 0, 96]


def test_vllm_020_all_caches_every_block_boundary() -> None:
    # all: states at 32, 64, 96 of P. The 2nd reaches P's state at 64 (<= 70)
    # and caches Q's boundary 96 (the next after 64). The 3rd hits 96.
    assert hits(LONG, "vllm-0.20-all") == [0, 64, 96]


def test_vllm_keeps_no_chunk_end_unless_dense() -> None:
    # 40-token chunks: vLLM floors each step to 32 tokens while it ends before the
    # prefill end (steps end at 32, 64, then 100, whose forward exports 96). By
    # default only 96 is kept: the 2nd finds P's KV to 64 and no state (hit 0, a
    # junction at 64). Dense retention keeps 32 and 64 too: the 2nd hits 64.
    assert hits(LONG, "vllm", chunk=40) == [0, 0, 96]
    assert hits(LONG, "vllm@dense", chunk=40) == [0, 64, 96]


def test_vllm_keeps_decode_boundaries_only_when_dense() -> None:
    # A 20-token prompt (no boundary before it) and a 50-token answer: decoding passes
    # 32 and 64. By default no decode state is kept; the next turn (prompt + answer +
    # 10 tokens, 79 looked up) finds the turn's KV to 64 (its output blocks are
    # cached) and no state: hit 0, a junction at 64. Dense keeps 32 and 64: hit 64.
    first, answer = toks(1, 20), toks(500, 50)
    turns = [
        req(0, 0, 0.0, first, answer),
        req(0, 1, 100.0, first + answer + toks(900, 10), toks(950, 3)),
    ]
    assert hits(turns, "vllm") == [0, 0]
    assert hits(turns, "vllm@dense") == [0, 64]
    assert hits(turns, "vllm@64") == [0, 64]  # interval 64: 64 kept, 32 not
    assert hits(turns, "vllm-0.20-all") == [0, 64]


def test_vllm_stops_follow_the_aligned_split() -> None:
    # vLLM's _mamba_block_aligned_split, by hand, with a 1,040-token block and an
    # 8,192-token budget (floored to 7 blocks = 7,280): a 10,000-token prompt from 0 runs
    # 7,280, then to the end, its forward exporting the replay boundary 9,360 (Mamba2),
    # where our scheduler stops to keep it. From a 1,040-token hit: 1,040 + 7,280 = 8,320.
    prof = get_profile("nemotron-h-8b")
    assert prof.vllm_block_tokens == 1040
    trace = Trace("t", [req(0, 0, 0.0, toks(0, 10_000), toks(50_000, 2))])
    model = ServingModel(trace, prof, make_policy("vllm"), ServingConfig(40))
    pol = model.policy
    r = Request(array("q", range(10_000)))
    assert pol.stops(r) == [7280, 9360]
    r.prefix_len = r.computed = 1040
    assert pol.stops(r) == [8320, 9360]
    r.prefix_len = r.computed = 9360
    assert pol.stops(r) == []


def test_vllm_020_all_falls_back_to_align_where_vllm_did() -> None:
    # vLLM 0.20.0 runs "all" mode for NemotronH (block 1,152: the Mamba chunk
    # grid) but not for Qwen3-Next, which falls back to "align" (block 576).
    nemo, qwen = get_profile("nemotron-h-8b"), get_profile("qwen3-next-80b-a3b")
    a, b = VLLM020All(), VLLM020All()
    a.attach(PolicyContext(nemo, 1, 8192, nemo.kv_bytes_per_token))
    b.attach(PolicyContext(qwen, 1, 8192, qwen.kv_bytes_per_token))
    assert (a.all_mode, a.block_units) == (True, 1152)
    assert (b.all_mode, b.block_units) == (False, 576)
    r = Request(array("q", range(3000)))
    assert a.stops(r) == [1152, 2304]
    assert b.stops(r) == [2880]  # align: one step, stopped at 3000 - 3000 % 576


def test_vllm_020_states_cost_a_padded_page_per_layer() -> None:
    # 0.05 GB x 0.9/1.9 for states: 23,684,210 bytes // 32,000 = 740 slots
    # (SGLang's 20,000-byte state would give 1,184).
    cfg = ServingConfig(BIG)
    sim = ServingModel(Trace("t", LONG[:1], 1), TINY, make_policy("vllm-0.20-all"), cfg)
    assert TINY.vllm_state_bytes == 32_000
    assert sim.cache.slots.capacity == int(BIG * 1e9 * 0.9 / 1.9) // 32_000 == 740


def test_vllm_draws_kv_and_states_from_one_block_pool() -> None:
    # vLLM 0.33.0: 0.05 GB of 32-token blocks of 32,000 bytes (32 x 1,000 B of KV) is
    # 1,562 blocks, one of them the null block; a state (32,000 bytes padded) is one
    # block, a block of KV is one block, and both count against the same 1,561.
    sim = ServingModel(Trace("t", LONG[:1], 1), TINY, make_policy("vllm"), ServingConfig(BIG))
    pol = sim.policy
    assert isinstance(pol, VLLM) and pol.pool is not None and pol.slots is not None
    assert (pol.pool.capacity, pol.slots.groups, sim.cache.page_size) == (1561, 1, 32)
    assert sim.cache.kv.available_size() == 1561 * 32
    assert sim.cache.slots.available_size() == 1561


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
