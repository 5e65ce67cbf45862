"""`mambaradix plan`: the recommendation meets its target when replayed on its own, the
frontier is the brute-force set of non-dominated points, the memory range and the
footprint by hand, and bad input is one line naming the option (and the bound)."""

from __future__ import annotations

import itertools
import json
import math
import random
from array import array
from pathlib import Path
from typing import Any

import pytest

from mambaradix.cli import main
from mambaradix.geometry.profile import load_profile
from mambaradix.policies.tier_rules import auto_kv_share
from mambaradix.replay.bound import bound_token_hit_rate
from mambaradix.replay.plan import Goal, plan
from mambaradix.replay.plan.frontier import pareto
from mambaradix.replay.plan.search import geometric
from mambaradix.replay.plan.space import Setting, footprint, least_gb, settings
from mambaradix.replay.run import replay
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.trace import Trace, TraceRequest
from mambaradix.replay.workloads import load
from mambaradix.replay.workloads.jsonl import save_jsonl
from mambaradix.replay.workloads.synthetic import multi_turn

PROFILE = load_profile("nemotron-h-8b")
BASE = ServingConfig(memory_gb=1.0)
TARGET = 0.6  # between the hit rate at the least memory (~0.46) and the top (~0.84)
# ours on split pools: the tests of the state-share axis (ours draws on one byte budget,
# where no share applies: `test_one_budget_policies_take_one_setting`)
SPLIT = "mambaradix/without-shared-budget"


@pytest.fixture(scope="module")
def small() -> Trace:
    return multi_turn(sessions=4, seed=3)


@pytest.fixture(scope="module")
def planned(small: Trace) -> dict[str, Any]:
    return plan(
        small,
        PROFILE,
        Goal(hit_rate=TARGET),
        BASE,
        policies=["mambaradix", "sglang"],
        state_fractions=[0.5],
        grid_points=3,
        workers=1,
    )


def _costs(r: dict[str, Any]) -> tuple[float, float, float]:
    t = r["ttft_p95_s"]
    return (r["memory_gb"], -r["token_hit_rate"], math.inf if t is None else t)


def _brute_dominated(r: dict[str, Any], rows: list[dict[str, Any]]) -> bool:
    """Some other row at most as costly everywhere and cheaper somewhere."""
    c = _costs(r)
    return any(
        all(x <= y for x, y in zip(_costs(o), c, strict=True)) and _costs(o) != c for o in rows
    )


def config(memory_gb: float, state_fraction: float | None) -> ServingConfig:
    """A fresh config at a planned point (None: the setting has no state share)."""
    if state_fraction is None:
        return ServingConfig(memory_gb=memory_gb)
    return ServingConfig(memory_gb=memory_gb, state_fraction=state_fraction)


@pytest.mark.slow  # the planned fixture: ~10 replays, 3-6 s
def test_recommended_meets_target_replayed_alone(small: Trace, planned: dict[str, Any]) -> None:
    best = planned["recommended"]
    assert best is not None
    cfg = config(best["memory_gb"], best["state_fraction"])
    alone = replay(small, PROFILE, best["policy"], cfg)  # an independent call, fresh config
    assert alone["dropped"] == 0
    assert alone["token_hit_rate"] >= TARGET


@pytest.mark.slow  # the planned fixture: ~10 replays, 3-6 s
def test_bisection_stops_next_to_a_miss(small: Trace, planned: dict[str, Any]) -> None:
    """Unless the recommendation is its setting's least memory, a memory within the
    resolution (10%) below it misses the target, replayed on its own."""
    best = planned["recommended"]
    least = next(r["least_gb"] for r in planned["ranges"] if r["setting"] == best["setting"])
    if best["memory_gb"] == least:
        pytest.skip("the least memory meets the target: nothing below to miss")
    below = max(
        r["memory_gb"]
        for r in planned["points"]
        if r["setting"] == best["setting"] and r["memory_gb"] < best["memory_gb"]
    )
    assert below * 1.1 >= best["memory_gb"]
    cfg = config(below, best["state_fraction"])
    assert replay(small, PROFILE, best["policy"], cfg)["token_hit_rate"] < TARGET


@pytest.mark.slow  # the planned fixture: ~10 replays, 3-6 s
def test_frontier_is_the_brute_force_non_dominated_set(planned: dict[str, Any]) -> None:
    served = [r for r in planned["points"] if not r["dropped"]]
    want = [r for r in served if not _brute_dominated(r, served)]
    got = planned["frontier"]
    assert {(r["setting"], r["memory_gb"]) for r in got} == {
        (r["setting"], r["memory_gb"]) for r in want
    } or sorted(map(_costs, got)) == sorted(set(map(_costs, want)))  # ties: one of equals
    for r in got:
        assert not _brute_dominated(r, served)


def test_pareto_random_rows_against_brute_force() -> None:
    rng = random.Random(7)
    for _ in range(200):
        rows = [
            {
                "memory_gb": rng.choice([1, 2, 3, 4]),
                "token_hit_rate": rng.choice([0.1, 0.2, 0.3]),
                "ttft_p95_s": rng.choice([None, 0.5, 1.0, 2.0]),
                "dropped": rng.random() < 0.1,
            }
            for _ in range(rng.randint(1, 12))
        ]
        served = [r for r in rows if not r["dropped"]]
        want = {_costs(r) for r in served if not _brute_dominated(r, served)}
        got = [_costs(r) for r in pareto(rows, "ttft_p95_s")]
        assert sorted(got) == sorted(want)  # each non-dominated cost once


@pytest.mark.slow  # the planned fixture: ~10 replays, 3-6 s
def test_ranges_run_from_the_largest_request_to_the_footprint(
    planned: dict[str, Any], small: Trace
) -> None:
    for r in planned["ranges"]:
        replayed = [p for p in planned["points"] if p["setting"] == r["setting"]]
        assert min(p["memory_gb"] for p in replayed) == r["least_gb"]
        assert max(p["memory_gb"] for p in replayed) <= r["top_gb"]
        largest = Trace("largest", [max(small.requests, key=_size)], 1)
        at_least = replay(largest, PROFILE, r["policy"], config(r["least_gb"], r["state_fraction"]))
        assert at_least["dropped"] == 0
        below = config(r["least_gb"] - 0.01, r["state_fraction"])
        if r["state_fraction"] is None:
            _reused_state_needs_least(largest.requests[0], r["policy"], r["least_gb"], below)
            continue
        # just below the least memory the largest request no longer fits alone
        with pytest.raises(ValueError):
            replay(largest, PROFILE, r["policy"], below)
    assert planned["bound"]["token_hit_rate"] == pytest.approx(bound_token_hit_rate(small))


def _reused_state_needs_least(big: TraceRequest, policy: str, least: float, below: Any) -> None:
    """One byte budget: the least memory is the one where `big` runs alone holding a state it
    reuses as well as its running copy (`fit.gb_needed`). Served after a request that ends
    where its prompt's last token starts, it hits that state at the least memory and is
    dropped just below it (the budget holds it alone, not beside the state it would reuse)."""
    cut = len(big.input_units) - 1
    first = TraceRequest(0, 0, 0.0, big.input_units[:cut], big.input_units[cut:], cut, 1)
    second = TraceRequest(0, 1, 1e6, big.input_units, big.output_units, *_tokens(big))
    pair = Trace("reuse", [first, second], 1)
    at_least = replay(pair, PROFILE, policy, config(least, None))
    assert at_least["dropped"] == 0 and at_least["cached_tokens"] >= cut
    assert replay(pair, PROFILE, policy, below)["dropped"] == 1


def _tokens(r: TraceRequest) -> tuple[int, int]:
    return r.input_tokens, r.output_tokens


def test_recommended_meets_target_on_given_memories(small: Trace) -> None:
    """The default tier's version: two given memory points, one setting, no bisection
    (a resolution of 10: 2.0 GB is within it of 0.5 GB)."""
    data = plan(small, PROFILE, Goal(hit_rate=TARGET), BASE, policies=["mambaradix"],
                state_fractions=[0.5], memories=[0.5, 2.0], resolution=10, workers=1)  # fmt: skip
    best = data["recommended"]
    assert best["memory_gb"] == 2.0 and data["replays"] == 2 + 2  # + SGLang's, vLLM's
    alone = replay(small, PROFILE, "mambaradix", ServingConfig(2.0, state_fraction=0.5))
    assert alone["token_hit_rate"] >= TARGET and alone["dropped"] == 0
    low = replay(small, PROFILE, "mambaradix", ServingConfig(0.5, state_fraction=0.5))
    assert low["token_hit_rate"] < TARGET  # so 2.0 is the cheaper of the two that meets it
    assert data["defaults"]["sglang"]["memory_gb"] == 2.0
    assert data["defaults"]["vllm"]["policy"] == "vllm"


def _size(r: TraceRequest) -> int:
    return len(r.input_units) + len(r.output_units)


def _req(ts: float, units: list[int]) -> TraceRequest:
    return TraceRequest(int(ts), 0, ts, array("q", units), array("q", [99]), len(units), 1)


def test_one_budget_policies_take_one_setting() -> None:
    """Ours draws KV and states on one byte budget: no state share applies, so it gets
    one setting, as vLLM's own pool does; SGLang's split pools one per share. The least
    memory by hand (Nemotron-H: 16,384 B of KV per token, 102,137,856 B per state), one
    request of 20,000 tokens and 1 more, page 1, no_buffer: 20,003 KV units (20,000 +
    1 + the page, strictly below: + 1) and 2 states (its running state and a reused
    one). One budget: 327,729,152 + 204,275,712 = 532,004,864 B -> 0.54 GB. Split at
    half: the larger half, KV's, 2 x 327,729,152 = 655,458,304 B -> 0.66 GB."""
    assert settings(["mambaradix", "sglang", "vllm"], [0.3, 0.5], False) == [
        Setting("mambaradix", None),
        Setting("sglang", 0.3),
        Setting("sglang", 0.5),
        Setting("vllm", None),
    ]
    trace = Trace("one", [_req(0, list(range(20_000)))], 1)
    assert least_gb(trace, PROFILE, BASE, Setting("mambaradix", None)) == 0.54
    assert least_gb(trace, PROFILE, BASE, Setting(SPLIT, 0.5)) == 0.66


def test_footprint_by_hand() -> None:
    # r1 reuses [1, 2, 3] of r0; r2 reuses [1, 2]; r3 reuses nothing: 3 KV units (1, 2, 3),
    # two positions where a state is needed (after 2 and after 3)
    trace = Trace("hand", [_req(0, [1, 2, 3, 4]), _req(1, [1, 2, 3, 5, 6]), _req(2, [1, 2, 7]),
                           _req(3, [8, 9])], 1)  # fmt: skip
    hits = [0, 3, 2, 0]
    assert footprint(trace, hits) == (3, 2)


def test_geometric_keeps_both_ends() -> None:
    got = geometric(0.5, 50.0, 3)
    assert got == [0.5, 5.0, 50.0]
    assert geometric(1.0, 1.0, 4) == [1.0]
    assert all(b > a for a, b in itertools.pairwise(geometric(0.31, 17.2, 6)))


def test_goal_met_needs_every_request_served() -> None:
    row = {"dropped": 1, "token_hit_rate": 0.9, "ttft_mean_s": 0.1, "ttft_p95_s": 0.1}
    assert not Goal(hit_rate=0.5).met(row)
    row["dropped"] = 0
    assert Goal(hit_rate=0.5, ttft_p95_s=0.2).met(row)
    assert not Goal(hit_rate=0.5, ttft_mean_s=0.05).met(row)


# ---------------------------------------------------------------- the command line


def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = main(["plan", *args, "--no-progress", "--no-plot"])
    return rc, capsys.readouterr().err


@pytest.fixture
def tiny_file(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    save_jsonl(multi_turn(sessions=3, seed=1), path)
    return path


def test_target_above_bound_names_the_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_file: Path
) -> None:
    bound = bound_token_hit_rate(load(str(tiny_file)))
    rc, err = cli(tmp_path, capsys, "--trace", str(tiny_file), "--target-hit-rate", "0.99")
    assert rc == 2
    assert err.count("\n") == 1
    assert "--target-hit-rate 99.0%" in err and f"bound {bound:.1%}" in err


def test_unknown_policy_empty_trace_no_goal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_file: Path
) -> None:
    rc, err = cli(tmp_path, capsys, "--trace", str(tiny_file), "--target-hit-rate", "0.3",
                  "--policy", "sglangg")  # fmt: skip
    assert rc == 2 and "--policy: unknown policy sglangg" in err and err.count("\n") == 1
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    rc, err = cli(tmp_path, capsys, "--trace", str(empty), "--target-hit-rate", "0.3")
    assert rc == 2 and err.startswith("mambaradix plan: error: --trace") and err.count("\n") == 1
    rc, err = cli(tmp_path, capsys, "--trace", str(tiny_file))
    assert rc == 2 and "--target-hit-rate" in err and "--budget-gb" in err
    rc, err = cli(tmp_path, capsys, "--trace", str(tiny_file), "--budget-gb", "0.01")
    assert rc == 2 and err.startswith("mambaradix plan: error: --budget-gb 0.01 GB is below")


def test_cli_json_to_stdout_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_file: Path
) -> None:
    """A budget alone: the highest hit rate within it, the JSON on stdout."""
    rc = main(["plan", "--trace", str(tiny_file), "--budget-gb", "2", "--policy", "mambaradix",
               "--state-fraction", "0.5", "--grid-points", "2", "--workers", "1", "--json", "-",
               "--no-plot", "--no-progress"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    data = json.loads(out)
    best = data["recommended"]
    within = [r for r in data["points"] if r["memory_gb"] <= 2 and not r["dropped"]]
    assert best["token_hit_rate"] == max(r["token_hit_rate"] for r in within)
    # ours on one budget: the range ends at the bound's footprint, KV and states together
    # (Nemotron-H: 16,384 B of KV per token, 102,137,856 B per state), below the budget
    (r,), fp = data["ranges"], data["footprint"]
    one_budget = fp["kv_units"] * 16_384 + fp["positions"] * 102_137_856
    assert r["state_fraction"] is None
    assert r["top_gb"] == math.ceil(one_budget / 1e7) / 100 + r["least_gb"]
    assert max(p["memory_gb"] for p in data["points"]) == r["top_gb"] < 2


def test_unmet_target_exits_1_and_still_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_file: Path
) -> None:
    """A TTFT no configuration reaches (a tenth of a millisecond: below one decode step):
    exit 1, the JSON written with no recommendation, the closest points said."""
    out = tmp_path / "p.json"
    rc = main(["plan", "--trace", str(tiny_file), "--target-ttft-p95", "0.0001", "--policy",
               "mambaradix", "--state-fraction", "0.5", "--grid-points", "2", "--workers", "1",
               "--json", str(out), "--no-plot", "--no-progress"])  # fmt: skip
    captured = capsys.readouterr()
    assert rc == 1
    assert json.loads(out.read_text())["recommended"] is None
    assert "no configuration searched meets the goal" in captured.out
    assert "least TTFT" in captured.out


# ---------------------------------------------------------------- the host axis

HOSTS = [0.0, 2.0]


@pytest.fixture(scope="module")
def tiny() -> Trace:
    return multi_turn(sessions=3, seed=1)


@pytest.fixture(scope="module")
def host_planned(tiny: Trace) -> dict[str, Any]:
    """Two device memories x two host memories, one setting: 4 replays + 3 peers' rows
    (about 2 s)."""
    return plan(tiny, PROFILE, Goal(hit_rate=TARGET), BASE, policies=[SPLIT],
                state_fractions=[0.5], memories=[0.5, 2.0], resolution=10, workers=1,
                host_gbs=HOSTS, host_cost=0.05)  # fmt: skip


def _cost_triple(r: dict[str, Any]) -> tuple[float, float, float]:
    """(device GB + 0.05 x host GB, -hit rate, p95 TTFT), computed here from the row's
    device and host memory, not from the planner's `cost_gb`."""
    t = r["ttft_p95_s"]
    cost = r["memory_gb"] + 0.05 * r["host_gb"]
    return (cost, -r["token_hit_rate"], math.inf if t is None else t)


def test_host_recommendation_meets_target_replayed_alone(
    tiny: Trace, host_planned: dict[str, Any]
) -> None:
    best = host_planned["recommended"]
    assert best["host_gb"] == 2.0 and best["memory_gb"] == 0.5  # the host tier is cheaper
    cfg = ServingConfig(0.5, state_fraction=0.5, host_gb=2.0)  # an independent call
    alone = replay(tiny, PROFILE, SPLIT, cfg)
    assert alone["dropped"] == 0 and alone["token_hit_rate"] >= TARGET
    # without the host the same device memory misses; with none, 2 GB is needed: cost 2 > 0.6
    bare = replay(tiny, PROFILE, SPLIT, ServingConfig(0.5, state_fraction=0.5))
    assert bare["token_hit_rate"] < TARGET
    # the peers' tiered rows ran at the same device and host memory
    defaults = host_planned["defaults"]
    assert set(defaults) == {"sglang-hicache", "sglang-hicache-auto", "vllm-offload"}
    for d in defaults.values():
        assert (d["memory_gb"], d["host_gb"]) == (0.5, 2.0)


def test_host_frontier_is_non_dominated_by_brute_force(host_planned: dict[str, Any]) -> None:
    served = [r for r in host_planned["points"] if not r["dropped"]]
    assert {r["host_gb"] for r in served} == set(HOSTS)

    def dominated(r: dict[str, Any]) -> bool:
        c = _cost_triple(r)
        return any(
            all(x <= y for x, y in zip(_cost_triple(o), c, strict=True)) and _cost_triple(o) != c
            for o in served
        )

    want = {_cost_triple(r) for r in served if not dominated(r)}
    got = [_cost_triple(r) for r in host_planned["frontier"]]
    assert sorted(got) == sorted(want)


def _beaten(t: tuple[float, ...], others: list[tuple[float, ...]]) -> bool:
    return any(all(x <= y for x, y in zip(o, t, strict=True)) and o != t for o in others)


def test_pareto_weighs_host_by_its_cost() -> None:
    """Random rows over (device, host): the frontier over device + c x host, brute force,
    for two prices."""
    rng = random.Random(11)
    for c in (0.0, 0.3):
        for _ in range(100):
            rows = []
            for _ in range(rng.randint(1, 10)):
                m, h = rng.choice([1, 2, 3]), rng.choice([0, 2, 5])
                rows.append({"memory_gb": m, "host_gb": h, "cost_gb": m + c * h,
                             "token_hit_rate": rng.choice([0.1, 0.2, 0.3]),
                             "ttft_p95_s": rng.choice([0.5, 1.0]), "dropped": False})  # fmt: skip
            trip = [(r["memory_gb"] + c * r["host_gb"], -r["token_hit_rate"], r["ttft_p95_s"])
                    for r in rows]  # fmt: skip
            want = {t for t in trip if not _beaten(t, trip)}
            got = [(r["cost_gb"], -r["token_hit_rate"], r["ttft_p95_s"])
                   for r in pareto(rows, "ttft_p95_s")]  # fmt: skip
            assert sorted(got) == sorted(want)


def test_host_axis_at_zero_is_the_device_only_plan(tiny: Trace) -> None:
    """host_gbs=[0]: the same replays, frontier and recommendation as no host axis (the
    recommendation is the hand-checked one of `test_recommended_meets_target_on_given_
    memories`: 2.0 GB), every cost its device memory, the device-only defaults."""
    args = (tiny, PROFILE, Goal(hit_rate=TARGET), BASE)
    kw: dict[str, Any] = {"policies": [SPLIT], "state_fractions": [0.5],
                          "memories": [0.5, 2.0], "resolution": 10, "workers": 1}  # fmt: skip
    plain, zero = plan(*args, **kw), plan(*args, **kw, host_gbs=[0.0], host_cost=7.0)

    def strip(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(r["setting"], r["memory_gb"], r["token_hit_rate"], r["ttft_p95_s"]) for r in rows]

    assert strip(zero["points"]) == strip(plain["points"])
    assert strip(zero["frontier"]) == strip(plain["frontier"])
    assert zero["recommended"]["memory_gb"] == plain["recommended"]["memory_gb"] == 2.0
    assert all(r["cost_gb"] == r["memory_gb"] and r["host_gb"] == 0 for r in zero["points"])
    assert set(zero["defaults"]) == {"sglang", "vllm"}


def test_auto_host_state_pool_by_hand() -> None:
    """SGLang's proposed rule (sglang #39436): slots = tokens / chunk + 4 x running.
    10 GB host, 1000 B of KV per token, 1 MB states, chunk 1000, 2 running: tokens =
    (1e10 - 8e6) / (1000 + 1000) = 4,996,000; slots = 4,996 + 8 = 5,004 (5.004 GB);
    KV 4.996 GB: a share of 0.4996. A host below 4 x running states holds states only."""
    assert auto_kv_share(10**10, 1000, 10**6, 1000, 2) == pytest.approx(0.4996)
    assert auto_kv_share(7 * 10**6, 1000, 10**6, 1000, 2) == 0.0


def test_host_bad_input_names_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_file: Path, tiny: Trace
) -> None:
    for flag, value in (("--host-gb", "-1"), ("--host-gb", "0,0"), ("--host-cost", "-0.1"),
                        ("--host-gb", "x")):  # fmt: skip
        rc, err = cli(tmp_path, capsys, "--trace", str(tiny_file), "--target-hit-rate", "0.3",
                      f"{flag}={value}")  # fmt: skip
        assert rc == 2 and flag in err and err.count("\n") == 1, (flag, value, err)
    with pytest.raises(ValueError, match="host_gbs"):
        plan(tiny, PROFILE, Goal(hit_rate=TARGET), BASE, host_gbs=[-1.0])
    with pytest.raises(ValueError, match="host_cost"):
        plan(tiny, PROFILE, Goal(hit_rate=TARGET), BASE, host_cost=-1.0)
    with pytest.raises(TypeError, match="host_gbs"):
        plan(tiny, PROFILE, Goal(hit_rate=TARGET), BASE, host_gbs=[])
