"""`mambaradix explain` on tiered runs (`--host-gb`, `--store-gb`, `replay.tiered`).

Hand-built traces whose loads and losses the test works out from how the trace and the
tiers are sized (a 102 MB state, a host tier that holds one or none of them), and the
property on seeded traces with host and store tiers at several sizes and both link
speeds, for every policy: per request, the categories add up to the bound
(`replay.bound`'s) minus the hit an independent `replay()` served, the tokens loaded
from below are part of that hit, a row that always loads the deepest hit never
"chooses to recompute", and a tier category holds tokens only when the run did what it
names (a failed load, bytes fallen out of the last tier).
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from mambaradix.cli import main
from mambaradix.policies import SINGLE_RUN, TIER_ROWS
from mambaradix.replay.cluster import ClusterSpec, cluster_replay
from mambaradix.replay.explain import Explanation, explain
from mambaradix.replay.run import replay
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.trace import Trace
from mambaradix.replay.workloads import load, multi_turn
from test_explain import (
    PROFILE,
    SLOTS_4,
    TIER_CATEGORIES,
    Ids,
    check_exact,
    only,
    request,
    state_evicted_trace,
)

STATE, KV = PROFILE.state_bytes, PROFILE.kv_bytes_per_token  # 102,137,856 and 16,384
OLD_SGLANG = "sglang-0.5.15.post1"  # `state_evicted_trace`'s policy: default tier rules


def tiered(host_gb: float, store_gb: float = 0.0) -> ServingConfig:
    return replace(SLOTS_4, host_gb=host_gb, store_gb=store_gb)


def fast(cfg: ServingConfig) -> ServingConfig:
    """Links fast enough that any load beats recomputing (the cost rule then loads)."""
    return replace(cfg, host_gbps=1e5, host_latency_us=0.0, store_gbps=1e5, store_latency_us=0.0)


# ------------------------------------------------------------------ by hand
# `state_evicted_trace`: request 0 keeps states at 40 (its prompt's end) and 49; the
# unrelated request 1's admission evicts the state at 40 and keeps its KV (a tombstone);
# request 2 shares the 40-token prompt. Without a tier: {"state_evicted": 40}
# (test_explain). With one, the evicted state goes down to the host, and request 2's
# lookup finds it there with its KV still on the device.


def test_a_host_load_is_a_hit() -> None:
    cfg = fast(tiered(host_gb=1.0))
    e = explain(state_evicted_trace(), PROFILE, OLD_SGLANG, cfg)
    r = e.requests[2]
    assert (r.bound_tokens, r.hit_tokens, r.host_hit_tokens, r.store_hit_tokens) == (40, 40, 40, 0)
    assert only(e, 2) == {}  # no gap: the loaded tokens are hit
    assert e.tiers is not None and (e.tiers["host_loads"], e.tiers["store_loads"]) == (1, 0)
    ran = replay(state_evicted_trace(), PROFILE, OLD_SGLANG, cfg)
    assert ran["host_hit_tokens"] == 40 and ran["cached_tokens"] == e.hit_tokens == 40


def test_a_store_load_is_a_hit() -> None:
    # 50 MB of host cannot hold the 102 MB state: it passes on to the store
    assert STATE > 0.05e9
    cfg = fast(tiered(host_gb=0.05, store_gb=1.0))
    e = explain(state_evicted_trace(), PROFILE, OLD_SGLANG, cfg)
    r = e.requests[2]
    assert (r.hit_tokens, r.host_hit_tokens, r.store_hit_tokens) == (40, 0, 40)
    assert only(e, 2) == {}


def test_the_cost_rule_recomputing_is_its_own_category() -> None:
    # default links: loading the state (PCIe Gen5, 10 us + 102 MB at 64 GB/s) is slower
    # than prefilling its 40 tokens at 2.4 PFLOP/s, so the cost rule recomputes them
    assert PROFILE.prefill_flops(0, 40) / 2.4e15 < 10e-6 + STATE / 64e9
    e = explain(state_evicted_trace(), PROFILE, OLD_SGLANG, tiered(host_gb=1.0))
    assert e.requests[2].hit_tokens == 0 and only(e, 2) == {"recompute_chosen": 40}
    assert e.tiers is not None and e.tiers["loads_recomputed"] == 1


def test_a_state_too_large_for_every_tier_was_never_below() -> None:
    """50 MB of host and no store: the state falls through; the tokens stay
    `state_evicted`, as without a tier."""
    e = explain(state_evicted_trace(), PROFILE, OLD_SGLANG, fast(tiered(host_gb=0.05)))
    assert only(e, 2) == {"state_evicted": 40}
    assert e.tiers is not None and e.tiers["dropped_bytes"] >= STATE


def lost_trace(unrelated: int = 30) -> Trace:
    """`state_evicted_trace` with a second unrelated request before the third (each
    `unrelated` tokens): its admission evicts another state, demoted after the one
    at 40."""
    ids = Ids()
    p0 = ids(40)
    return Trace(
        "t",
        [
            request(0, 0, 0.0, p0, ids(10)),
            request(1, 0, 5.0, ids(unrelated), ids(5)),
            request(2, 0, 7.5, ids(unrelated), ids(5)),
            request(3, 0, 10.0, p0 + ids(10), ids(5)),
        ],
    )


@pytest.mark.parametrize("policy", [OLD_SGLANG, "sglang-hicache"])
def test_a_state_that_fell_out_of_the_last_tier(policy: str) -> None:
    """0.15 GB of host holds one state, not two: the state at 40, demoted first, is
    the least recent when the second comes down, and with no store it is gone.
    With a store it is loaded from there instead."""
    assert STATE < 0.15e9 < 2 * STATE
    e = explain(lost_trace(), PROFILE, policy, fast(tiered(host_gb=0.15)))
    assert e.requests[3].hit_tokens == 0 and only(e, 3) == {"tier_dropped": 40}
    e = explain(lost_trace(), PROFILE, policy, fast(tiered(host_gb=0.15, store_gb=1.0)))
    r = e.requests[3]
    assert (r.hit_tokens, r.host_hit_tokens, r.store_hit_tokens) == (40, 0, 40)
    assert only(e, 3) == {}


def test_a_state_below_whose_kv_fell_out() -> None:
    """`sglang-hicache` splits the host like the device pools' bytes: 5,000 KV units
    (16,384 bytes each) and 8 states give KV 9.1% of 0.5 GB, 2,780 units, and 4
    states. The 4,000-token request 2 evicts, oldest first, request 0's path (its
    40 prompt tokens and 9 of its answer, the state at 40 already below) and request
    1's 4,004 units: 4,053 units down, the first 1,273 out of the host. The state at
    40 stays (4 fit), the KV before it is gone: `tier_kv_dropped`."""
    kv_share = 5000 * KV / (5000 * KV + 8 * STATE)
    host_units = int(int(0.5e9 * kv_share) / KV)
    assert host_units == 2780 and int(0.5e9 * (1 - kv_share)) // STATE == 4
    cfg = fast(replace(SLOTS_4, kv_units=5000, state_slots=8, host_gb=0.5, tier_write="back"))
    e = explain(lost_trace(4000), PROFILE, "sglang-hicache", cfg)  # by hand: write-back
    assert e.requests[3].hit_tokens == 0 and only(e, 3) == {"tier_kv_dropped": 40}
    assert e.tiers is not None and e.tiers["dropped_bytes"] == (49 + 4004 - host_units) * KV


def test_a_failed_load_is_load_failed() -> None:
    """A point where the replay counts one failed load (`TierStats.failed`), request
    3's: its usable state below is `load_failed`."""
    cfg = fast(replace(SLOTS_4, kv_units=5000, host_gb=0.25, tier_write="back"))
    ran = replay(lost_trace(2000), PROFILE, "sglang-hicache", cfg)  # write-back, as counted
    assert ran["loads_failed"] == 1 and ran["host_loads"] == 0
    e = explain(lost_trace(2000), PROFILE, "sglang-hicache", cfg)
    assert e.requests[3].hit_tokens == 0 and only(e, 3) == {"load_failed": 40}


def test_the_peer_rows_load_whatever_it_costs() -> None:
    """`sglang-hicache` always loads the deepest hit: on the default links, where the
    cost rule recomputes (above), it loads the state from the host."""
    e = explain(lost_trace(), PROFILE, "sglang-hicache", tiered(host_gb=1.0))
    r = e.requests[3]
    assert (r.hit_tokens, r.host_hit_tokens) == (40, 40) and only(e, 3) == {}


# ---------------------------------------------------------------- the property


def check_tiered(trace: Trace, policy: str, cfg: ServingConfig) -> Explanation:
    """Per request against an independent replay of the same point (`check_exact`),
    and what the tiers add: loads within the hit, the replay's loaded tokens, no
    recompute for the rows that always load, a failed load or a loss behind the
    categories that name them."""
    ran = replay(trace, PROFILE, policy, cfg, per_request=True)
    e = explain(trace, PROFILE, policy, cfg)
    check_exact(e, trace, ran["request_hits"])
    for r in e.requests:
        assert 0 <= r.host_hit_tokens + r.store_hit_tokens <= r.hit_tokens, r
    assert sum(r.host_hit_tokens for r in e.requests) == ran["host_hit_tokens"]
    assert sum(r.store_hit_tokens for r in e.requests) == ran["store_hit_tokens"]
    totals, tiers = e.totals(), e.tiers
    assert tiers is not None
    assert tiers["loads_failed"] == ran["loads_failed"]
    if policy in TIER_ROWS:  # they load the deepest hit, always
        assert totals["recompute_chosen"] == 0 and tiers["loads_recomputed"] == 0
    if not tiers["loads_failed"]:
        assert totals["load_failed"] == 0
    assert totals["lower_tier"] == 0  # the safety net: a usable load is loaded or told why
    if not tiers["dropped_bytes"]:
        assert totals["tier_dropped"] == totals["tier_kv_dropped"] == 0
    return e


def long_turns(seed: int) -> Trace:
    """Sessions on shared system prompts long enough for vLLM's 1,040-token blocks."""
    return multi_turn(
        sessions=5,
        turns=(2, 4),
        system_tokens=(1200, 2600),
        user_tokens=(30, 300),
        output_tokens=(10, 120),
        session_rate=2.0,
        think_time_s=1.0,
        seed=seed,
    )


SIZES = ((0.15, 0.0), (0.0, 0.3), (0.3, 1.0), (2.0, 0.0))  # (host GB, store GB)


def random_point(rng: random.Random) -> ServingConfig:
    host, store = rng.choice(SIZES)
    cfg = ServingConfig(
        1.0,
        kv_units=rng.choice((3000, 6000)),
        state_slots=rng.choice((4, 8)),
        host_gb=host,
        store_gb=store,
        open_loop=rng.random() < 0.3,
    )
    return fast(cfg) if rng.random() < 0.5 else cfg


@pytest.mark.parametrize("policy", ["mambaradix", "sglang-hicache", "vllm-offload"])
def test_categories_add_up_on_a_tiered_run(policy: str) -> None:
    """Two of the slow test's points (seed 2): 0.15 GB of host on fast links, then
    0.3 GB of host and 1 GB of store on the default links, every row writing back (the
    peers' own default, write-through, runs in the slow test); the tiers serve loads and
    leave a tier category holding tokens (vllm-offload, the slowest: the first only)."""
    rng = random.Random(2)
    points = 1 if policy == "vllm-offload" else 2
    cfgs = [replace(random_point(rng), tier_write="back") for _ in range(points)]
    runs = [check_tiered(long_turns(2), policy, cfg) for cfg in cfgs]
    assert sum(e.tiers["host_loads"] + e.tiers["store_loads"] for e in runs if e.tiers) > 0
    assert sum(e.totals()[k] for e in runs for k in TIER_CATEGORIES) > 0


@pytest.mark.slow
@pytest.mark.parametrize("policy", SINGLE_RUN)
def test_categories_add_up_on_random_tiered_runs(policy: str) -> None:
    """Seeded traces and points (tier sizes, link speeds, pools, open or closed loop);
    over them every tier category is met (the slow test's own check that it tests)."""
    seen = dict.fromkeys(TIER_CATEGORIES, 0)
    for seed in range(4):
        rng = random.Random(seed)
        for _ in range(3):
            e = check_tiered(long_turns(seed), policy, random_point(rng))
            for k in seen:
                seen[k] += e.totals()[k]
    assert seen["tier_dropped"] > 0, seen


@pytest.mark.slow
@pytest.mark.parametrize("policy", SINGLE_RUN)
def test_categories_add_up_on_a_bundled_trace_with_tiers(policy: str) -> None:
    trace = load("synthetic-multi-turn")
    for host, store in ((2.0, 0.0), (0.3, 2.0)):
        check_tiered(trace, policy, ServingConfig(1.0, host_gb=host, store_gb=store))


@pytest.mark.slow
def test_categories_add_up_tiered_at_page_16_and_on_instances() -> None:
    trace = long_turns(1)
    c = ServingConfig(1.0, kv_units=6000, state_slots=8, host_gb=0.3, store_gb=1.0)
    paged = replace(c, page_size=16, track_interval=64, chunk_tokens=64)
    check_tiered(trace, "sglang-extra-buffer", fast(paged))
    spec = ClusterSpec(instances=2)
    for policy in ("mambaradix", "sglang-hicache", "vllm-offload"):
        e = explain(trace, PROFILE, policy, fast(c), router="round-robin", spec=spec)
        ran = cluster_replay(trace, PROFILE, policy, fast(c), "round-robin", spec)
        assert e.hit_tokens == ran["cached_tokens"]
        assert sum(r.host_hit_tokens for r in e.requests) == ran["host_hit_tokens"]
        check_exact(e, trace, [r.hit_tokens for r in e.requests])  # sums, bounds


LOADED = ("host_hit_tokens", "store_hit_tokens")


def test_cli_on_a_tiered_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`explain --host-gb --store-gb`: the table names the tiers and their counts, the
    JSON and the lines carry the loaded tokens, as the replay counts them."""
    monkeypatch.chdir(tmp_path)
    words = "--trace synthetic-multi-turn --limit 40 --memory 1 --host-gb 1 --store-gb 4"
    args = [*words.split(), "--policy", "sglang", "--json", "e.json", "--jsonl", "e.jsonl"]
    assert main(["explain", *args, "--workers", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "1 GB + host 1 GB + store 4 GB sglang: hit" in out and "  lower tiers: " in out
    (row,) = json.loads((tmp_path / "e.json").read_text())["results"]
    lines = [json.loads(x) for x in (tmp_path / "e.jsonl").read_text().splitlines()]
    trace = load("synthetic-multi-turn")
    trace.requests = trace.requests[:40]
    ran = replay(trace, PROFILE, "sglang", ServingConfig(1.0, host_gb=1.0, store_gb=4.0))
    replayed = {"hit_tokens": ran["cached_tokens"], **{k: ran[k] for k in LOADED}}
    for key in ("hit_tokens", *LOADED):
        assert row[key] == sum(x[key] for x in lines) == replayed[key]
    assert row["host_hit_tokens"] > 0 and row["store_hit_tokens"] > 0
    assert row["tiers"]["loads_failed"] == ran["loads_failed"]
    for x in lines:
        assert sum(x["categories"].values()) == x["gap_tokens"]
