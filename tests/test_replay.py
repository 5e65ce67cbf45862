"""Tests for `mambaradix.replay`: the serving model (`serving.py`), the policies,
the bound, and `replay()` metrics.

Golden tests use tiny hand-built token traces and a hand-built model profile
with memory far larger than the traces, so nothing is ever evicted and every
hit can be worked out by hand (the arithmetic is in the comments).

Conventions of the serving model the arithmetic relies on (see `serving.py`):

* admission matches `input[:-1]` (one token is always computed for logits);
  the hit is the deepest matched node that holds a state, capped at input - 1;
* the finished sequence is inserted up to `committed = n_in + len(output) - 1`
  (the last decoded token is never fed back), with the final state there;
* an SGLang compat (policies sglang*) splits a partially matched edge on lookup,
  creating a stateless node.
"""

from __future__ import annotations

import random
from array import array
from dataclasses import replace

import pytest

from mambaradix.core.tree import MambaRadixCache
from mambaradix.geometry.profile import ModelProfile, get_profile
from mambaradix.policies import (
    ORACLE,
    POLICIES,
    TIER_ROWS,
    VLLM,
    Marconi,
    PolicyContext,
    make_policy,
)
from mambaradix.pools import StateSlotAllocator, TokenKVAllocator
from mambaradix.replay.bound import bound_hit_tokens, bound_token_hit_rate
from mambaradix.replay.run import replay
from mambaradix.replay.serving import ServingConfig, ServingModel
from mambaradix.replay.trace import Trace, TraceRequest
from mambaradix.replay.workloads import agent_loop, multi_turn, shared_prefix
from profiles import TINY

# one policy each (the oracle is a set of runs); the tiered rows are their device rows
# without a tier (tests/test_replay_tiers.py)
ALL = [p for p in POLICIES if p != ORACLE and p not in TIER_ROWS]


def quick(values: list[str], keep: str) -> list[object]:
    """`values` as parameters, all but `keep` in the slow tier (each is a replay of
    seconds; the default tier runs one, `-m slow` the rest)."""
    return [v if v == keep else pytest.param(v, marks=pytest.mark.slow) for v in values]


# 0.05 GB: 0.05e9 * (1 - 0.9/1.9) / 1000 = 26315 KV tokens and
# 0.05e9 * 0.9/1.9 / 20000 = 1184 states: far more than any golden trace needs.
BIG = 0.05
THROUGHPUT = ServingConfig(memory_gb=1).prefill_flops_per_s


def vllm_block_units(profile: ModelProfile, unit_tokens: int) -> int:
    """vLLM's block in units, as `VLLM.attach` derives it from the profile."""
    tokens = -(-profile.state_bytes // profile.kv_bytes_per_token)  # ceil
    tokens = -(-tokens // 16) * 16  # up to a multiple of 16
    return max(1, -(-tokens // unit_tokens))


BLOCK = vllm_block_units(TINY, 1)


def toks(start: int, n: int) -> array[int]:
    return array("q", range(start, start + n))


def req(session: int | str, turn: int, ts: float, inp: array[int], out: array[int]) -> TraceRequest:
    return TraceRequest(session, turn, ts, inp, out, len(inp), len(out))


def simulate(
    requests: list[TraceRequest],
    policy: str,
    *,
    chunk: int = 8192,
    sequential: bool = False,
    memory_gb: float = BIG,
    profile: ModelProfile = TINY,
    unit_tokens: int = 1,
) -> ServingModel:
    trace = Trace("golden", list(requests), unit_tokens)
    cfg = ServingConfig(memory_gb=memory_gb, chunk_tokens=chunk, sequential=sequential)
    sim = ServingModel(trace, profile, make_policy(policy), cfg)
    sim.run()
    sim.cache.tree.check_invariants()
    if not sequential:
        sim.cache.check_conservation()
    return sim


def hits(requests: list[TraceRequest], policy: str, **kw: object) -> list[int]:
    sim = simulate(requests, policy, **kw)  # type: ignore[arg-type]
    assert not sim.dropped and sim.cache.evictions == {"kv_tokens": 0, "states": 0}
    return [o.hit_tokens for o in sorted(sim.outcomes, key=lambda o: o.request)]


# ------------------------------------------------------------------ golden

# (a) A retried request: the same 40-token prompt three times, 30-token output,
# 100 s apart (each finishes long before the next arrives).
PROMPT, ANSWER = toks(1000, 40), toks(5000, 30)
RETRY = [req(i, 0, 100.0 * i, PROMPT, ANSWER) for i in range(3)]
RETRY_HITS = {
    # sglang: checkpoints at the prompt end (40) and the finish (40 + 30 - 1 = 69);
    # a retry looks up input[:-1] = 39 tokens, which ends inside the 40-token
    # edge (split, stateless) -> cut back to the root: 0. Never better later.
    "sglang": [0, 0, 0],
    "sglang-0.5.15.post1": [0, 0, 0],  # the same checkpoints
    "sglang-0.5.15.post1-extra-buffer": [0, 0, 0],  # as sglang-extra-buffer below
    # sglang-extra-buffer tracks a prefill state only at chunk-aligned positions
    # (mamba chunk 64) of an extend of >= 64 tokens, and while decoding at
    # lengths that are multiples of 256: a 40-token prompt and a 69-token
    # sequence never get a state, so nothing is ever cached (#22935).
    "sglang-extra-buffer": [0, 0, 0],
    # vllm (0.33.0 defaults): block 32. The one prefill step exports the replay
    # boundary floor(39 / 32) * 32 = 32, which is kept (nothing while decoding, nothing
    # at finish). The 39-token lookup reaches it.
    "vllm": [0, BLOCK, BLOCK],
    # vllm-0.20-all: a state at every block boundary: 32 in prefill (range(32, 40,
    # 32)), 64 while decoding. The same hits here.
    "vllm-0.20-all": [0, BLOCK, BLOCK],
    # marconi: 1st has no branch point (empty tree), finish at 69. 2nd matches
    # 39 tokens of KV but no state (0), and checkpoints its branch point at 39
    # (kv_hit_len 39 < n_in 40). 3rd hits 39.
    "marconi": [0, 0, 39],
    # mambaradix: the 1st already checkpoints its last prompt token (n_in - 1 =
    # 39), so the 2nd (and 3rd) hit 39 = input - 1, the most possible.
    "mambaradix": [0, 39, 39],
    # default (the engine's): a stop at input - 1 = 39 (the prompt end 40 is not
    # kept), finish at 69: the 2nd and 3rd hit 39.
    "default": [0, 39, 39],
}

# (b) A two-turn session: turn 2's prompt = turn 1's prompt (40) + answer (30) +
# a new message (10): 80 tokens.
TURN2 = PROMPT + ANSWER + toks(7000, 10)
SESSION = [req(0, 0, 0.0, PROMPT, ANSWER), req(0, 1, 100.0, TURN2, toks(8000, 5))]
# Turn 1's finished state sits at committed = 40 + 30 - 1 = 69; turn 2 looks up
# 79 tokens, all of which extend that path: a hit of 69 for every policy that
# inserts the finished sequence. vllm-0.20-all keeps block multiples (32 in prefill,
# 64 while decoding): 69 // 32 * 32. vllm (0.33.0) keeps only turn 1's replay
# boundary 32: it hits 32 (and turn 2 stops at the junction 64, where turn 1's KV ends).
SESSION_HITS = {
    "sglang": [0, 69],
    "sglang-extra-buffer": [0, 0],  # no tracked state below 64 / 256 (see RETRY_HITS)
    "sglang-0.5.15.post1": [0, 69],
    "sglang-0.5.15.post1-extra-buffer": [0, 0],
    "vllm": [0, BLOCK],
    "vllm-0.20-all": [0, 69 // BLOCK * BLOCK],
    "marconi": [0, 69],
    "mambaradix": [0, 69],
    "default": [0, 69],
}

# (c) Four single-turn requests sharing a 50-token system prompt, each with its
# own 10-token question (n_in = 60) and 5-token answer, with 20-token prefill
# chunks.
SYSTEM = toks(1000, 50)
SHARED = [
    req(i, 0, 100.0 * i, SYSTEM + toks(2000 + 100 * i, 10), toks(9000 + 100 * i, 5))
    for i in range(4)
]
CHUNK = 20
SHARED_HITS = {
    # sglang: the 1st checkpoints every chunk end, range(20, 60, 20) = 20, 40,
    # and the prompt end 60 (and finishes at 64). Later requests diverge at 50,
    # inside the 40..60 edge: the deepest state is at floor(50 / 20) * 20 = 40.
    # The 2nd computes from 40: no chunk end before 60, so no state at 50 ever.
    "sglang": [0, 40, 40, 40],
    "sglang-0.5.15.post1": [0, 40, 40, 40],
    "sglang-0.5.15.post1-extra-buffer": [0, 0, 0, 0],
    "sglang-extra-buffer": [0, 0, 0, 0],  # 20-token extends: never >= the 64 chunk
    # vllm: 20-token steps under a 32-token block advance sub-block and re-align:
    # they end at 20, 32, 52, 60; the replay boundary floor(59 / 32) * 32 = 32 is
    # kept. Later requests share 50 tokens: KV to 32 and the state there: hit 32.
    "vllm": [0] + [50 // BLOCK * BLOCK] * 3,
    # vllm-0.20-all: every boundary below 60: only 32 (and 64 while decoding).
    "vllm-0.20-all": [0] + [50 // BLOCK * BLOCK] * 3,
    # marconi: the 2nd finds 50 tokens of KV but no state there: hit 0, and it
    # checkpoints the branch point 50. Pays off from the 3rd occurrence.
    "marconi": [0, 0, 50, 50],
    # mambaradix: with free slots it also keeps chunk ends (20, 40) besides
    # input - 1 (59) and the finish (64): the 2nd reaches 40, checkpoints its
    # branch point 50, and the 3rd and 4th hit 50.
    "mambaradix": [0, 40, 50, 50],
    # default: chunk ends 20, 40, input - 1 (59), finish (64); the 2nd reaches 40 and
    # stops at its branch point 50 (where its prompt leaves the cached KV): 50 after.
    "default": [0, 40, 50, 50],
}


def test_tiny_profile_vllm_block_is_32_tokens() -> None:
    assert BLOCK == 32
    pol = make_policy("vllm")
    ServingModel(Trace("t", [RETRY[0]], 1), TINY, pol, ServingConfig(memory_gb=BIG))
    assert isinstance(pol, VLLM) and pol.block == BLOCK


@pytest.mark.parametrize("sequential", [False, True])
@pytest.mark.parametrize("policy", ALL)
def test_golden_retry(policy: str, sequential: bool) -> None:
    assert hits(RETRY, policy, sequential=sequential) == RETRY_HITS[policy]


@pytest.mark.parametrize("policy", ["sglang", "sglang-0.5.15.post1"])
def test_golden_retry_sglang_hits_only_chunk_ends(policy: str) -> None:
    # With 16-token chunks the 1st checkpoints 16, 32 (chunk ends) and 40: a
    # 39-token retry lookup reaches the chunk-end state at floor(39 / 16) * 16.
    assert hits(RETRY, policy, chunk=16) == [0, 32, 32]


@pytest.mark.parametrize("sequential", [False, True])
@pytest.mark.parametrize("policy", ALL)
def test_golden_two_turn_session(policy: str, sequential: bool) -> None:
    assert hits(SESSION, policy, sequential=sequential) == SESSION_HITS[policy]


@pytest.mark.parametrize("sequential", [False, True])
@pytest.mark.parametrize("policy", ALL)
def test_golden_shared_system_prompt(policy: str, sequential: bool) -> None:
    assert hits(SHARED, policy, chunk=CHUNK, sequential=sequential) == SHARED_HITS[policy]


@pytest.mark.parametrize("policy", ["marconi", "mambaradix"])
def test_golden_shared_prefix_with_default_chunk(policy: str) -> None:
    # The branch-point checkpoint does not depend on the chunk size.
    assert hits(SHARED, policy) == [0, 0, 50, 50]


def test_golden_extra_buffer_long_prompts() -> None:
    # A 200-token prompt: the extend tracks the state at 3 * 64 = 192, cached at
    # the prompt end (cache_unfinished_req with mamba_last_track_seqlen 192); a
    # retry looks up 199 tokens and reuses 192.
    prompt = toks(1000, 200)
    retry = [req(i, 0, 100.0 * i, prompt, toks(5000, 30)) for i in range(3)]
    assert hits(retry, "sglang-extra-buffer") == [0, 192, 192]
    # A shared 150-token prefix with 60 distinct tokens each (n_in 210): the 1st
    # caches 192 (past the divergence); the 2nd matches 150 tokens of KV but no
    # state, its branching point is floor(150 / 64) * 64 = 128, which lies on
    # the chunk grid inside its extend [0, 210): the state at 128 is tracked
    # instead of 192 and cached. From the 3rd on: 128.
    system = toks(1000, 150)
    shared = [
        req(i, 0, 100.0 * i, system + toks(2000 + 100 * i, 60), toks(9000 + 100 * i, 5))
        for i in range(4)
    ]
    assert hits(shared, "sglang-extra-buffer") == [0, 0, 128, 128]


def test_golden_sglang_without_chunk_ends_never_hits_a_shared_input_prefix() -> None:
    # 8192-token chunks: no chunk end inside a 60-token prompt; the states are at
    # 60 and 64, past the divergence point 50.
    assert hits(SHARED, "sglang") == [0, 0, 0, 0]


def test_golden_block_trace_units_and_partial_last_block() -> None:
    # unit_tokens = 4: a 5-unit prompt of 18 tokens (the last block holds 2).
    # mambaradix checkpoints the last prompt unit (unit 4 = 16 tokens); a retry
    # hits min(4 * 4, 18 - 1) = 16 tokens.
    inp, out = toks(1, 5), toks(100, 3)
    r = [TraceRequest(i, 0, 100.0 * i, inp, out, 18, 12) for i in range(2)]
    sim = simulate(r, "mambaradix", unit_tokens=4)
    assert [o.hit_tokens for o in sim.outcomes] == [0, 16]
    assert [o.input_tokens for o in sim.outcomes] == [18, 18]
    assert bound_hit_tokens(Trace("b", list(r), 4)) == [0, 16]


def test_golden_ttft_and_flops() -> None:
    # Spaced requests never queue: TTFT is exactly the prefill of the uncached
    # tokens at the configured throughput; FLOPs saved = F(hit).
    sim = simulate(SESSION, "mambaradix")
    first, second = sim.outcomes
    assert first.ttft_s == pytest.approx(TINY.prefill_flops(0, 40) / THROUGHPUT)
    assert second.ttft_s == pytest.approx(TINY.prefill_flops(69, 80 - 69) / THROUGHPUT)
    assert first.flops_saved == 0
    assert second.flops_saved == TINY.flops_saved(69, 80)


def test_golden_ttft_includes_queueing() -> None:
    # Two unrelated prompts arriving together. With an 8192-token chunk both
    # join one prefill batch (continuous batching): both first tokens come
    # after the whole batch. With a 300-token chunk the first fills the batch
    # and the second waits for it, then runs its own.
    a = req(0, 0, 0.0, toks(1, 300), toks(10_000, 4))
    b = req(1, 0, 0.0, toks(20_000, 200), toks(30_000, 4))
    fa, fb = TINY.prefill_flops(0, 300) / THROUGHPUT, TINY.prefill_flops(0, 200) / THROUGHPUT
    batched = simulate([a, b], "sglang")
    assert [o.ttft_s for o in batched.outcomes] == pytest.approx([fa + fb, fa + fb])
    queued = simulate([a, b], "sglang", chunk=300)
    assert [o.ttft_s for o in queued.outcomes] == pytest.approx([fa, fa + fb])


def test_replay_metrics_aggregate_the_outcomes() -> None:
    m = replay(Trace("s", list(SESSION), 1), TINY, "mambaradix", ServingConfig(memory_gb=BIG))
    assert m["policy"] == "mambaradix" and m["memory_gb"] == BIG
    assert m["requests"] == m["served"] == 2 and m["dropped"] == 0
    assert m["prompt_tokens"] == 40 + 80
    assert m["cached_tokens"] == 69
    assert m["token_hit_rate"] == pytest.approx(69 / 120)
    assert m["request_hit_rate"] == 0.5 and "state_hits" not in m  # one metric, not two
    assert m["flops_saved"] == TINY.flops_saved(69, 80)
    assert m["kv_tokens_evicted"] == 0 and m["states_evicted"] == 0
    assert m["ttft_p50_s"] <= m["ttft_p95_s"]
    assert m["config"]["memory_gb"] == BIG and m["config"]["sequential"] is False
    assert "alpha" not in m
    assert "alpha" in replay(Trace("s", list(SESSION), 1), TINY, "marconi", ServingConfig(BIG))


# ------------------------------------------------------------------- bound


def lcp(a: array[int], b: array[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def brute_force_bound(trace: Trace) -> list[int]:
    """For each request, the longest common prefix of input[:-1] with any earlier
    request's input + output, in tokens, capped at input_tokens - 1."""
    out = []
    for i, r in enumerate(trace.requests):
        query = r.input_units[:-1]
        best = max(
            (lcp(query, e.input_units + e.output_units) for e in trace.requests[:i]), default=0
        )
        out.append(min(best * trace.unit_tokens, r.input_tokens - 1) if best else 0)
    return out


def random_trace(seed: int, unit_tokens: int = 1, n: int = 40) -> Trace:
    """Small random trace over a 3-letter alphabet (many shared prefixes), with
    some requests continuing an earlier request's input + output."""
    rng = random.Random(seed)
    requests: list[TraceRequest] = []
    for i in range(n):
        if requests and rng.random() < 0.4:
            prev = rng.choice(requests)
            base = prev.input_units + prev.output_units
            inp = base[: rng.randint(1, len(base))] + array(
                "q", rng.choices(range(3), k=rng.randint(0, 4))
            )
        else:
            inp = array("q", rng.choices(range(3), k=rng.randint(1, 12)))
        out = array("q", rng.choices(range(3), k=rng.randint(0, 5)))
        if unit_tokens == 1:
            in_tok, out_tok = len(inp), len(out)
        else:  # the last input block may be partial, even down to 1 token per unit
            in_tok = rng.randint(len(inp), len(inp) * unit_tokens)
            out_tok = len(out) * unit_tokens
        requests.append(TraceRequest(i, 0, rng.uniform(0, 100), inp, out, in_tok, out_tok))
    return Trace(f"random-{seed}", requests, unit_tokens)


@pytest.mark.parametrize("seed", range(8))
def test_bound_equals_brute_force(seed: int) -> None:
    trace = random_trace(seed)
    expected = brute_force_bound(trace)
    assert bound_hit_tokens(trace) == expected
    assert any(expected)  # not vacuous
    assert bound_token_hit_rate(trace) == pytest.approx(sum(expected) / trace.prompt_tokens)


@pytest.mark.parametrize("seed", range(4))
def test_bound_equals_brute_force_on_block_trace(seed: int) -> None:
    trace = random_trace(100 + seed, unit_tokens=4)
    expected = brute_force_bound(trace)
    assert bound_hit_tokens(trace) == expected
    assert any(expected)


def test_bound_hand_examples() -> None:
    # Retry: input[:-1] = 39 tokens all shared -> 39 (= input - 1).
    assert bound_hit_tokens(Trace("r", list(RETRY), 1)) == [0, 39, 39]
    # Two turns: turn 1's input + output is 70 tokens, all a prefix of turn 2.
    assert bound_hit_tokens(Trace("s", list(SESSION), 1)) == [0, 70]
    assert bound_hit_tokens(Trace("c", list(SHARED), 1)) == [0, 50, 50, 50]
    one = req(0, 0, 0.0, toks(1, 1), toks(2, 1))  # a one-token prompt never hits
    assert bound_hit_tokens(Trace("o", [one, one], 1)) == [0, 0]


@pytest.mark.parametrize("policy", ALL)
@pytest.mark.parametrize("seed", range(3))
def test_no_policy_beats_the_bound(policy: str, seed: int) -> None:
    trace = random_trace(200 + seed, n=60)
    bound = bound_hit_tokens(trace)
    sim = simulate(trace.requests, policy, chunk=4)
    assert len(sim.outcomes) == len(trace)
    by_request = sorted(sim.outcomes, key=lambda o: o.request)  # outcomes come in finish order
    for o, r, b in zip(by_request, trace.requests, bound, strict=True):
        assert o.input_tokens == r.input_tokens
        assert 0 <= o.hit_tokens <= b


# ----------------------------------------------------------------- marconi


def states_gained_per_request(
    trace: Trace, policy_name: str, chunk: int = 8192
) -> tuple[list[int], ServingModel]:
    """Run sequentially (one request at a time) without eviction and record how
    many states the tree gains with each request."""
    policy = make_policy(policy_name)
    cfg = ServingConfig(memory_gb=0.5, chunk_tokens=chunk, sequential=True)
    sim = ServingModel(trace, TINY, policy, cfg)
    counts = [0]
    done = policy.on_request_done

    def record() -> None:
        done()
        counts.append(sim.cache.tree.total_size()[1])

    policy.on_request_done = record  # type: ignore[method-assign]
    sim.run()
    assert sim.cache.evictions == {"kv_tokens": 0, "states": 0} and not sim.dropped
    assert len(counts) == len(trace) + 1
    return [b - a for a, b in zip(counts, counts[1:], strict=False)], sim


def test_marconi_admits_at_most_two_checkpoints_per_sequence() -> None:
    trace = agent_loop(sessions=4, steps=(4, 8), system_tokens=(200, 400), seed=3)
    gained, sim = states_gained_per_request(trace, "marconi")
    assert max(gained) == 2  # the branch point and the last decoded token
    assert min(gained) >= 0
    assert sum(gained) == sim.cache.tree.total_size()[1]
    # The measurement can see more: sglang checkpoints every 64-token chunk end.
    sglang_gained, _ = states_gained_per_request(trace, "sglang", chunk=64)
    assert max(sglang_gained) > 2


def marconi_with_ctx(tree: MambaRadixCache, alpha: float, state_capacity: int = 10) -> Marconi:
    pol = Marconi(alpha=alpha)
    ctx = PolicyContext(TINY, 1, 8192, TINY.kv_bytes_per_token, 100, state_capacity, tree=tree)
    pol.attach(ctx)
    return pol


def build_tree() -> tuple[MambaRadixCache, dict[str, object]]:
    """A tree with five states (slot = insertion order):

        root ─ Y [1,2,3] s1 ─┬─ X [4,5,6] s0
               (2 children)  └─ Z [7,8]   s2
             └ W [20,21] s3 ── V [22]     s4

    X was inserted first, then Y split it. A final lookup of X refreshes its
    state, so the state LRU (oldest first) is Y, Z, W, V, X."""
    tree = MambaRadixCache(page_size=1, chunk_size=1)
    seqs = [[1, 2, 3, 4, 5, 6], [1, 2, 3], [1, 2, 3, 7, 8], [20, 21], [20, 21, 22]]
    kv = 0
    for slot, s in enumerate(seqs):
        tree.insert(s, range(kv, kv + len(s)), slot)
        kv += len(s)
    assert tree.match_prefix([1, 2, 3, 4, 5, 6]).node.state == 0
    nodes = {name: tree.peek(s) for name, s in zip("XYZWV", seqs, strict=True)}
    assert [n.state for n in tree.evictable_states()] == [1, 2, 3, 4, 0]  # type: ignore[union-attr]
    return tree, nodes


def test_marconi_alpha_zero_ranks_by_recency() -> None:
    tree, n = build_tree()
    pol = marconi_with_ctx(tree, alpha=0.0)
    # Y has two children: not a candidate. The rest in LRU order.
    assert pol.ranked(tree, leaves_only=False) == [n["Z"], n["W"], n["V"], n["X"]]
    assert pol.ranked(tree, leaves_only=True) == [n["Z"], n["V"], n["X"]]


def test_marconi_large_alpha_ranks_by_flop_efficiency() -> None:
    tree, _ = build_tree()
    pol = marconi_with_ctx(tree, alpha=1e9)
    ranked = pol.ranked(tree, leaves_only=False)
    eff = [pol.flop_efficiency(node) for node in ranked]
    assert eff == sorted(eff) and len(set(eff)) == len(eff)
    assert ranked != marconi_with_ctx(tree, alpha=0.0).ranked(tree, leaves_only=False)


def test_marconi_alpha_zero_evicts_in_lru_order_among_nodes_with_at_most_one_child() -> None:
    tree, _ = build_tree()
    pol = marconi_with_ctx(tree, alpha=0.0)  # state_capacity 10: one state per eviction call
    victims, kv_freed = [], []
    for _ in range(5):
        r = pol.evict(tree, 0, 1)
        victims += r.freed_states
        kv_freed.append(len(r.freed_kv))
        tree.check_invariants()
    # Z (leaf, oldest candidate; deleted with its 2 tokens) -> Y, which now has
    # one child and is the oldest (tombstoned, KV stays) -> W (tombstoned: it
    # keeps child V) -> V (deleted, 1 token, with tombstone W, 2 tokens) -> X
    # (deleted, 3 tokens, with tombstone Y, 3 tokens).
    assert victims == [2, 1, 3, 4, 0]
    assert kv_freed == [2, 0, 0, 3, 6]
    assert tree.total_size() == (0, 0)


def test_marconi_tunes_alpha_once_after_the_first_eviction() -> None:
    trace = multi_turn(sessions=12, seed=1)
    policy = Marconi()
    calls: list[float] = []
    score = {0.0: 1.0, 0.5: 3.0, 1.0: 7.0, 2.0: 2.0, 4.0: 5.0}

    def tuner(alpha: float) -> float:
        calls.append(alpha)
        return score[alpha]

    policy.tuner = tuner
    sim = ServingModel(trace, get_profile("jamba-1.5-mini"), policy, ServingConfig(memory_gb=0.3))
    sim.run()
    assert sim.cache.evictions["states"] > 0
    assert policy.first_eviction_at is not None
    assert policy.requests_seen >= policy.first_eviction_at * 6  # bootstrap multiplier 5
    assert sorted(calls) == sorted(Marconi.alphas)  # each alpha replayed once
    assert policy.alpha == 1.0 and policy.tune is False


@pytest.mark.parametrize("policy", ["marconi", "mambaradix"])
def test_purely_input_shared_prefix_pays_off_from_third_occurrence(policy: str) -> None:
    # Five single-turn requests with a 64-token system prompt and distinct
    # questions: the 1st caches its own path, the 2nd finds the shared KV but no
    # state and checkpoints the branch point at 64, the 3rd onwards hit 64.
    system = toks(500, 64)
    reqs = [
        req(i, 0, 50.0 * i, system + toks(10_000 * (i + 1), 20), toks(90_000 + 100 * i, 8))
        for i in range(5)
    ]
    assert hits(reqs, policy) == [0, 0, 64, 64, 64]


# ----------------------------------------------------------- determinism


def small_multi_turn(seed: int) -> Trace:
    return multi_turn(sessions=12, seed=seed)


WALL_CLOCK = frozenset({"replay_s", "requests_per_s"})  # timings of the replay itself


def simulated(m: dict[str, object]) -> dict[str, object]:
    """The metrics of the simulated serving, without the replay's own wall-clock
    timings (which differ from run to run by nature)."""
    return {k: v for k, v in m.items() if k not in WALL_CLOCK}


@pytest.mark.parametrize("policy", quick(ALL, "mambaradix"))
def test_same_seed_same_metrics(policy: str) -> None:
    prof, cfg = get_profile("nemotron-h-8b"), ServingConfig(memory_gb=2)
    a = simulated(replay(small_multi_turn(7), prof, policy, cfg))
    b = simulated(replay(small_multi_turn(7), prof, policy, cfg))
    assert a == b
    c = simulated(replay(small_multi_turn(8), prof, policy, cfg))
    assert c != a
    assert c["prompt_tokens"] != a["prompt_tokens"]


@pytest.mark.slow
def test_same_trace_replayed_twice_is_identical_under_pressure() -> None:
    trace = shared_prefix(requests=80, seed=2)
    prof, cfg = get_profile("marconi-7b"), ServingConfig(memory_gb=0.5)
    a = simulated(replay(trace, prof, "marconi", cfg))
    assert a["states_evicted"] > 0
    assert simulated(replay(trace, prof, "marconi", cfg)) == a


# -------------------------------------------------------- memory pressure


def committed_units(r: TraceRequest) -> int:
    return len(r.input_units) + max(len(r.output_units) - 1, 0)


@pytest.mark.parametrize("rate", [None, pytest.param(100.0, marks=pytest.mark.slow)])
@pytest.mark.parametrize("policy", quick(ALL, "sglang-extra-buffer"))
def test_memory_pressure_accounts_every_request(policy: str, rate: float | None) -> None:
    trace = multi_turn(sessions=16, seed=0)
    cfg = ServingConfig(memory_gb=0.3, rate=rate)
    sim = ServingModel(trace, get_profile("jamba-1.5-mini"), make_policy(policy), cfg)
    sim.run()
    assert len(sim.outcomes) + len(sim.dropped) == len(trace)
    assert sim.cache.evictions["states"] > 0 and sim.cache.evictions["kv_tokens"] > 0
    assert not sim.cache.active
    sim.cache.tree.check_invariants()
    sim.cache.check_conservation()
    assert sim.peak_kv <= sim.cache.kv.capacity and sim.peak_states <= sim.cache.slots.capacity
    m = replay(trace, get_profile("jamba-1.5-mini"), policy, cfg)
    assert m["served"] + m["dropped"] == m["requests"] == len(trace)
    assert m["states_evicted"] + m["kv_tokens_evicted"] > 0
    assert 0 <= m["token_hit_rate"] <= bound_token_hit_rate(trace)


SPLIT_POOLS = [p for p in ALL if p not in ("vllm", "mambaradix")]
SPLIT_POOLS.append("mambaradix/without-shared-budget")


@pytest.mark.parametrize("policy", quick(SPLIT_POOLS, "sglang"))
def test_requests_that_can_never_fit_are_dropped(policy: str) -> None:
    # marconi-7b at 0.3 GB: 0.3e9 * (1 - 0.9/1.9) // 65536 = 2409 KV tokens. A
    # request is dropped exactly when its committed sequence exceeds the pool. (Split pools:
    # vLLM's one block pool and ours' one byte budget are another layout.)
    trace = multi_turn(sessions=16, seed=0)
    sim = ServingModel(trace, get_profile("marconi-7b"), make_policy(policy), ServingConfig(0.3))
    sim.run()
    cap = sim.cache.kv.capacity
    assert cap == 2409
    too_big = [r for r in trace.requests if committed_units(r) > cap]
    assert too_big and len(sim.dropped) == len(too_big)
    assert len(sim.outcomes) + len(sim.dropped) == len(trace)
    admitted = {id(r) for r in sim.admitted}
    assert not any(id(r) in admitted for r in too_big)
    assert len(admitted) == len(trace) - len(too_big)
    sim.cache.tree.check_invariants()
    sim.cache.check_conservation()


def test_vllm_drops_what_its_block_pool_never_holds() -> None:
    # vLLM's one pool at 0.2 GB: marconi-7b's 80-token blocks of 80 x 65,536 B: 38 blocks,
    # one the null block. Every request `vllm_fit` says never runs alone (its KV blocks,
    # states and the admission reserve above the pool) is dropped. So is a request that
    # runs alone but not with what it hits: vLLM holds the hit's blocks beside its
    # running and kept states (admission counts them: `kv_cache_manager.py:531-545`,
    # `single_type_kv_cache_manager.py:1792-1795`), and would leave it waiting.
    from mambaradix.replay.fit import policy_fit
    from mambaradix.replay.vllm_fit import runs_alone

    trace, prof, cfg = (
        multi_turn(sessions=16, seed=0),
        get_profile("marconi-7b"),
        ServingConfig(0.2),
    )
    sim = ServingModel(trace, prof, make_policy("vllm"), cfg)
    sim.run()
    assert sim.cache.kv.capacity == 37 * 80
    never = policy_fit(trace, prof, cfg, "vllm").never_fit
    index = {id(r): i for i, r in enumerate(trace.requests)}
    dropped = sorted(index[id(r)] for r in sim.dropped)
    assert never and set(never) <= set(dropped)
    for i in set(dropped) - set(never):
        assert runs_alone(trace.requests[i], 1, prof, cfg, "vllm")
    assert len(sim.outcomes) + len(sim.dropped) == len(trace)
    sim.cache.tree.check_invariants()
    sim.cache.check_conservation()


def run_sequential_under_pressure(policy: str) -> ServingModel:
    trace = shared_prefix(requests=100, seed=0)
    sim = ServingModel(trace, TINY, make_policy(policy), ServingConfig(0.01, sequential=True))
    sim.run()
    return sim


def test_vllm_block_pool_under_pressure_holds_what_the_tree_holds() -> None:
    # vllm: its own block pool (not the shared byte budget). Under pressure every KV
    # page and state the tree holds is still in the pool (cached, or held by a running
    # request), the pool's counts add up, and nothing leaks when the run ends.
    sim = run_sequential_under_pressure("vllm")
    pol = sim.policy
    assert isinstance(pol, VLLM) and pol.pool is not None and pol.slots is not None
    assert len(sim.outcomes) + len(sim.dropped) == len(sim.trace)
    assert sim.cache.evictions["states"] > 0 and sim.cache.evictions["kv_tokens"] > 0
    assert pol.pool.popped > 0 and not pol.pool.held and not pol.blocks.runs
    pol.pool.check()
    sim.cache.tree.check_invariants()
    sim.cache.check_conservation()
    tree = sim.cache.tree
    books = pol.blocks
    for page in {int(i) // pol.block for i in tree.all_kv_indices()}:
        # its own copy is in the pool, or another copy of its block hash is
        assert pol.pool.holds(("kv", page)) or books.tree_copy_hash[page] in books.hash_pages
    for slot in tree.all_states():
        assert all(pol.pool.holds(k) for k in pol.slots.keys(slot))


@pytest.mark.parametrize("policy", quick([p for p in ALL if p != "vllm"], "mambaradix"))
def test_sequential_shared_budget_under_pressure(policy: str) -> None:
    sim = run_sequential_under_pressure(policy)
    trace_len = len(sim.trace)
    assert len(sim.outcomes) + len(sim.dropped) == trace_len
    assert sim.cache.evictions["states"] > 0 and sim.cache.evictions["kv_tokens"] > 0
    sim.cache.tree.check_invariants()
    # Ownership by the free lists (not the budget-capped available_size):
    # every index / slot is free or in the tree, exactly once.
    kv, slots, tree = sim.cache.kv, sim.cache.slots, sim.cache.tree
    tree_kv, tree_states = list(tree.all_kv_indices()), tree.all_states()
    assert len(set(tree_kv)) == len(tree_kv) and len(set(tree_states)) == len(tree_states)
    assert not any(kv.is_free(i) for i in tree_kv)
    assert not any(slots.is_free(s) for s in tree_states)
    assert TokenKVAllocator.available_size(kv) + len(tree_kv) == kv.capacity
    assert StateSlotAllocator.available_size(slots) + len(tree_states) == slots.capacity
    # The shared byte budget counts exactly what the tree holds, within budget.
    shared = kv.shared  # type: ignore[attr-defined]
    assert shared is slots.shared  # type: ignore[attr-defined]
    assert (shared.kv_used, shared.states_used) == (len(tree_kv), len(tree_states))
    assert shared.free_bytes() >= 0
    assert shared.budget == int(0.01 * 1e9)


def test_sequential_run_passes_the_conservation_check() -> None:
    """FAILS (src bug): `CacheManager.check_conservation()` counts free entries
    with `available_size()`, which `_BudgetedKV` / `_BudgetedSlots` cap by the
    shared byte budget, so any sequential run that keeps a state in the tree
    fails the check although nothing leaks (see the test above)."""
    one = req(0, 0, 0.0, toks(1, 4), toks(100, 2))
    sim = ServingModel(
        Trace("one", [one], 1), TINY, make_policy("sglang"), ServingConfig(0.001, sequential=True)
    )
    sim.run()
    assert sim.cache.tree.total_size() == (5, 2)  # prompt end 4 and finish 5
    sim.cache.check_conservation()


def test_pool_too_small_for_two_states_is_rejected() -> None:
    with pytest.raises(ValueError, match="too small"):
        ServingModel(
            Trace("r", list(RETRY), 1),
            get_profile("nemotron-h-8b"),
            make_policy("sglang"),
            ServingConfig(memory_gb=0.2),
        )
    with pytest.raises(ValueError):
        ServingConfig(memory_gb=0)
    with pytest.raises(ValueError):
        ServingConfig(memory_gb=1, state_fraction=1.0)


# --------------------------------------------------- policy comparisons


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mambaradix_beats_sglang_on_multi_turn_at_moderate_memory(seed: int) -> None:
    trace = multi_turn(sessions=16, seed=seed)
    prof, cfg = get_profile("nemotron-h-8b"), ServingConfig(memory_gb=4)
    ours = replay(trace, prof, "mambaradix", cfg)
    bound = bound_token_hit_rate(trace)
    for baseline in ("sglang", "sglang-0.5.15.post1"):
        theirs = replay(trace, prof, baseline, cfg)
        assert theirs["states_evicted"] > 0  # a memory point with real pressure
        assert ours["token_hit_rate"] >= theirs["token_hit_rate"]
        assert ours["flops_saved"] >= theirs["flops_saved"]
    assert ours["token_hit_rate"] <= bound


@pytest.mark.slow
def test_more_memory_never_hurts_mambaradix_here() -> None:
    trace = multi_turn(sessions=16, seed=0)
    prof = get_profile("nemotron-h-8b")
    rates = [
        replay(trace, prof, "mambaradix", replace(ServingConfig(1), memory_gb=m))["token_hit_rate"]
        for m in (1, 4, 32)
    ]
    assert rates == sorted(rates) and rates[-1] > rates[0]
