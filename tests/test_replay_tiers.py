"""The replay's lower tiers (`replay.tiered`): hand-computed hits and load times on a
tiny trace, --host-gb 0 unchanged, bad input, and the invariants after every step of
randomized runs."""

from __future__ import annotations

import random
from array import array

import pytest

from mambaradix.geometry.profile import get_profile
from mambaradix.policies import DefaultPolicy, make_policy
from mambaradix.policies.tier_rules import DEEPEST, TierRules
from mambaradix.replay.run import replay
from mambaradix.replay.serving import Outcome, ServingConfig, ServingModel
from mambaradix.replay.tier_lru import ByteLRU
from mambaradix.replay.trace import Trace, TraceRequest

PROFILE = get_profile("nemotron-h-8b")
STATE, KV = PROFILE.state_bytes, PROFILE.kv_bytes_per_token  # 102,137,856 and 16,384


class Deepest(DefaultPolicy):
    """The engine's default checkpoints; tiers load the deepest hit (no cost choice)."""

    def tier_rules(self, profile: object) -> TierRules:
        return TierRules(choose=DEEPEST)


def req(i: int, ts: float, prompt: list[int], out: list[int]) -> TraceRequest:
    return TraceRequest(i, 0, ts, array("q", prompt), array("q", out), len(prompt), len(out))


A, B = list(range(100, 108)), list(range(200, 208))
# R0 caches A (8 tokens: its finish state at depth 8, the last output token has no KV);
# R1 (no shared prefix) takes the tree's one spare slot, so A's state is evicted with
# its leaf and demoted; R2 extends A: the device has nothing, the host A's state and KV.
HAND = Trace("hand", [req(0, 0.0, A, [1]), req(1, 1.0, B, [2]), req(2, 2.0, A + [1, 9, 9], [3])])


def hand_run(policy: object = None, **tiers: float) -> ServingModel:
    cfg = ServingConfig(
        memory_gb=1, sequential=True, open_loop=True, kv_units=64, state_slots=2, **tiers
    )
    m = ServingModel(HAND, PROFILE, policy or Deepest(), cfg)
    m.run()
    return m


def by_request(m: ServingModel) -> dict[int, Outcome]:
    return {o.request: o for o in m.outcomes}


def test_lru_evicts_least_recent_and_keeps_capacity() -> None:
    lru = ByteLRU(10)
    assert lru.put("a", 4) == [] and lru.put("b", 4) == []
    lru.touch("a")
    assert lru.put("c", 4) == [("b", 4)]  # b is the least recent
    assert lru.put("d", 11) == [("d", 11)]  # larger than the tier: passes through
    assert lru.used == 8 and list(lru.entries) == ["a", "c"]
    lru.check()


def test_without_a_tier_nothing_is_reused() -> None:
    hits = [o.hit_tokens for o in sorted(hand_run().outcomes, key=lambda o: o.request)]
    assert hits == [0, 0, 0]


def test_host_hit_by_hand() -> None:
    m = hand_run(host_gb=1.0)
    out = by_request(m)
    assert out[2].hit_tokens == 8 and out[2].host_hit_tokens == 8
    assert out[0].hit_tokens == out[1].hit_tokens == 0
    loaded = STATE + 8 * KV  # A's state and 8 tokens of KV
    assert m.tiered.tiers.stats.loaded_bytes == {"host": loaded, "store": 0}
    assert out[2].load_s == pytest.approx(10e-6 + loaded / 64e9)  # PCIe Gen5 defaults


def test_store_hit_by_hand() -> None:
    # 50 MB of host holds KV but no 102 MB state: the state passes on to the store
    m = hand_run(host_gb=0.05, store_gb=1.0)
    out = by_request(m)
    assert out[2].hit_tokens == 8 and out[2].store_hit_tokens == 8
    pcie = 10e-6 + (STATE + 8 * KV) / 64e9
    nvme = 100e-6 + STATE / 13e9
    assert out[2].load_s == pytest.approx(pcie + nvme)


def test_cost_rule_recomputes_a_short_prefix() -> None:
    # 8 tokens cost ~0.05 ms to prefill at 2.4 PFLOP/s; loading 102 MB takes ~1.6 ms
    assert PROFILE.prefill_flops(0, 8) / 2.4e15 < 10e-6 + (STATE + 8 * KV) / 64e9
    m = hand_run(DefaultPolicy(), host_gb=1.0)
    assert by_request(m)[2].hit_tokens == 0
    assert m.tiered.tiers.stats.recomputed == 1
    # a link fast enough makes the load cheaper: then it loads
    fast = hand_run(DefaultPolicy(), host_gb=1.0, host_gbps=1e5, host_latency_us=0)
    assert by_request(fast)[2].host_hit_tokens == 8


def test_write_policies_by_hand() -> None:
    """Write-through: A's units go to the host when R0 caches them, R1's eviction only
    drops the device copies, R2 loads A as under write-back. Selective: A is never hit a
    second time, so R1 evicts it unbacked and R2 finds nothing below; every unit the
    device let go of is counted gone: A's and B's 8 KV tokens and 2 states each (input - 1
    at 7 and the finish at 8)."""
    through = hand_run(host_gb=1.0, tier_write="through")
    assert [by_request(through)[i].hit_tokens for i in range(3)] == [0, 0, 8]
    assert through.tiered.tiers.stats.unbacked_bytes == 0
    selective = hand_run(host_gb=1.0, tier_write="through-selective")
    assert [by_request(selective)[i].hit_tokens for i in range(3)] == [0, 0, 0]
    stats = selective.tiered.tiers.stats
    assert stats.unbacked_bytes == 4 * STATE + 16 * KV and stats.demoted_bytes["host"] == 0


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("write", ["through", "through-selective"])
@pytest.mark.parametrize("policy", ["sglang-hicache", "mambaradix"])
def test_invariants_after_every_step_in_write_through_modes(
    seed: int, write: str, policy: str
) -> None:
    trace = random_trace(random.Random(seed), 40)
    cfg = ServingConfig(memory_gb=0.8, host_gb=1.0, store_gb=2.0, host_gbps=1e4,
                        host_latency_us=0, tier_write=write)  # fmt: skip
    m = ServingModel(trace, PROFILE, make_policy(policy), cfg)
    run_checked(m)
    assert len(m.outcomes) + len(m.dropped) == len(trace)
    stats = m.tiered.tiers.stats  # copied down or counted gone: the tiers were exercised
    assert stats.demoted_bytes["host"] + stats.unbacked_bytes > 0


def test_ttft_includes_the_load() -> None:
    base, tiered = by_request(hand_run()), by_request(hand_run(host_gb=1.0))
    assert tiered[2].ttft_s < base[2].ttft_s + tiered[2].load_s  # the hit saves prefill
    assert tiered[2].load_s > 0


@pytest.mark.parametrize("policy", ["sglang", "mambaradix", "vllm"])
def test_no_tier_is_todays_run(policy: str) -> None:
    """0 GB: no tier object, no tier metrics; the peers' tiered rows are their device rows."""
    trace = random_trace(random.Random(3), 30)
    cfg = ServingConfig(memory_gb=2)
    a = replay(trace, PROFILE, policy, cfg)
    assert "host_hit_tokens" not in a
    peer = {"sglang": "sglang-hicache", "vllm": "vllm-offload"}.get(policy)
    if peer is not None:
        b = replay(trace, PROFILE, peer, cfg)
        for k in ("cached_tokens", "ttft_p50_s", "ttft_p95_s", "kv_tokens_evicted", "dropped"):
            assert a[k] == b[k], k


@pytest.mark.parametrize(
    "field, value",
    [
        ("host_gb", -1),
        ("store_gb", -0.5),
        ("host_gbps", 0),
        ("store_latency_us", -1),
        ("tier_write", "always"),
    ],  # fmt: skip
)
def test_bad_tier_input_names_the_parameter(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        ServingConfig(memory_gb=1, **{field: value})


def random_trace(rng: random.Random, n: int) -> Trace:
    """Requests sharing prefixes with earlier ones (multi-turn and common heads)."""
    reqs, seqs = [], [[rng.randrange(1000) for _ in range(rng.randrange(10, 60))]]
    for i in range(n):
        base = rng.choice(seqs)
        prompt = base[: rng.randrange(1, len(base) + 1)] + [rng.randrange(1000)] * rng.randrange(
            1, 40
        )
        out = [rng.randrange(1000) for _ in range(rng.randrange(1, 8))]
        seqs.append(prompt + out)
        reqs.append(req(i, i * 0.05, prompt, out))
    return Trace("random", reqs)


def run_checked(m: ServingModel) -> None:
    """`ServingModel.run` with the tiers' invariants checked after every step."""
    arrivals = m.releases()
    m.on_done = arrivals.done
    while arrivals.pending or m.scheduler.busy:
        nxt = arrivals.peek()
        if nxt is not None and m.wakes_for(nxt[0]):
            m.clock.wait_for(nxt[0])
        while nxt is not None and nxt[0] <= m.clock.now:
            m.submit(nxt[1], arrivals.pop()[0])
            nxt = arrivals.peek()
        if m.scheduler.busy:
            m.step()
            m.tiered.check()
    m.settle()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("policy", ["sglang-hicache", "mambaradix", "vllm-offload"])
def test_invariants_after_every_step(seed: int, policy: str) -> None:
    rng = random.Random(seed)
    trace = random_trace(rng, 40)
    loads = []
    cfg = ServingConfig(memory_gb=0.8, host_gb=1.0, store_gb=2.0, host_gbps=1e4, host_latency_us=0)
    m = ServingModel(trace, PROFILE, make_policy(policy), cfg)
    tiered = m.tiered
    original = tiered.usable

    def usable(key: object, depth: int, kv_on_device: int) -> bool:
        ok = original(key, depth, kv_on_device)
        loads.append(ok)
        return ok

    tiered.usable = usable  # type: ignore[method-assign]
    run_checked(m)
    assert len(m.outcomes) + len(m.dropped) == len(trace)
    assert sum(tiered.tiers.stats.loads.values()) <= loads.count(True)
    if policy != "vllm-offload":  # its 1,040-token blocks: no hit on these short prompts
        assert sum(tiered.tiers.stats.loads.values()) > 0  # the tiers were exercised
    for o in m.outcomes:  # a lower-tier hit is part of the hit
        assert 0 <= o.host_hit_tokens + o.store_hit_tokens <= o.hit_tokens


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["vllm", "vllm-offload"])
def test_vllm_rows_give_every_loaded_block_back(policy: str) -> None:
    """Blocks a load puts in the tree join vLLM's books: after the run the block pool
    holds none (a leak showed as 2,875 held blocks and dropped requests)."""
    from mambaradix.replay.workloads import load

    trace = load("mooncake")
    trace = Trace(trace.name, trace.requests[:1500], trace.unit_tokens)
    p = make_policy(policy)
    m = ServingModel(trace, PROFILE, p, ServingConfig(memory_gb=80, host_gb=1000))
    m.run()
    assert sum(m.tiered.tiers.stats.loads.values()) > 100  # the tiers served
    assert not p.pool.held and not m.dropped
    p.pool.check()


@pytest.mark.parametrize(
    "args, named",
    [
        (["--host-gb", "-1"], "argument --host-gb: must be >= 0"),
        (["--store-gb", "lots"], "argument --store-gb: expected a number"),
        (["--host-gbps", "0"], "argument --host-gbps: must be > 0"),
        (["--host-tier", "2"], "unrecognized arguments: --host-tier 2"),
        (["--tier-write", "always"], "argument --tier-write: invalid choice: 'always'"),
    ],
)
def test_cli_bad_tier_option_is_one_line(
    args: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from mambaradix.cli import main

    try:
        code = main(["replay", "--no-plot", "--limit", "5", *args])
    except SystemExit as e:
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert named in err[-1]


@pytest.mark.parametrize("running", [2, 256])
def test_hicache_auto_sizes_the_host_state_pool(running: int) -> None:
    """`sglang-hicache-auto`: the host state pool holds tokens / chunk + 4 x running
    states (sglang #39436), the KV pool the rest; checked after every step. With 256
    running the 1,024 states outweigh the 1 GB host: no host KV, as SGLang's users found
    (0/8 host hits until resized)."""
    trace = random_trace(random.Random(5), 30)
    cfg = ServingConfig(memory_gb=0.8, host_gb=1.0, max_running=running, chunk_tokens=64)
    m = ServingModel(trace, PROFILE, make_policy("sglang-hicache-auto"), cfg)
    host = m.tiered.tiers.host
    sb, kv_tok = m.state_bytes, m.kv_unit_bytes / m.units.unit
    tokens = max(0.0, (1e9 - 4 * running * sb) / (kv_tok + sb / 64))  # solved here
    assert host.lrus["kv"].capacity == int(1e9 * (tokens * kv_tok / 1e9))
    assert host.lrus["st"].capacity == int(1e9) - host.lrus["kv"].capacity
    run_checked(m)
    assert len(m.outcomes) + len(m.dropped) == len(trace)
    if running == 256:
        assert host.lrus["kv"].capacity == 0 and host.lrus["kv"].peak == 0


@pytest.mark.parametrize(
    ("policy", "write", "copied"),
    [
        ("sglang-hicache", None, True),  # SGLang 0.5.23's default: write_through
        ("sglang-hicache-auto", None, True),
        ("vllm-offload", None, True),  # vLLM 0.33.0's offload stores what a step computes
        ("mambaradix", None, False),  # ours writes back
        ("sglang-hicache", "back", False),  # --tier-write sets every row's
        ("mambaradix", "through", True),
    ],
)
def test_each_row_writes_down_as_its_upstream_does_by_default(
    policy: str, write: str | None, copied: bool
) -> None:
    """With device memory for the whole trace nothing is evicted: a row that writes back
    copies nothing down, one that writes through copies what it caches at once. The
    prompts share a head of several of vLLM's 1,040-token blocks, so every row caches."""
    head = list(range(1, 2201))
    trace = Trace("long", [req(i, float(i), head + [3000 + i] * 900, [7]) for i in range(3)])
    cfg = ServingConfig(memory_gb=40.0, host_gb=100.0, tier_write=write)
    m = ServingModel(trace, PROFILE, make_policy(policy), cfg)
    run_checked(m)
    assert m.cache.evictions == {"kv_tokens": 0, "states": 0}
    assert (m.tiered.tiers.stats.demoted_bytes["host"] > 0) is copied
