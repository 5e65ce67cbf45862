"""Requests that never fit: known before the run (`replay.fit`, checked here
against the serving model itself so the two cannot drift), dropped by the
serving model, counted as misses in every rate, shown in the table, the plot
and on stderr; a run that serves nothing fails."""

from __future__ import annotations

import json
import signal
from array import array
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from mambaradix.cli import main
from mambaradix.geometry.profile import ModelProfile, get_profile
from mambaradix.policies import SINGLE_RUN, make_policy
from mambaradix.replay.checks import (
    policy_own_memory,
    policy_shared_budget,
    policy_state_bytes,
    policy_strategy,
)
from mambaradix.replay.fit import TRACK_SLOTS, check_memory, fit, policy_fit, pools_for
from mambaradix.replay.results import ReplayResult
from mambaradix.replay.run import replay, replay_checked
from mambaradix.replay.serving import ServingConfig, ServingModel
from mambaradix.replay.sweep import sweep, table
from mambaradix.replay.trace import Trace, TraceRequest
from mambaradix.replay.workloads import multi_turn

# One byte per KV token and per state: a budget of 2,000 bytes split half and
# half holds exactly 1,000 KV tokens and 1,000 states.
BYTE = ModelProfile("byte", "test", 1, 1, 1, 1)
HALF = ServingConfig(memory_gb=2000.5e-9, state_fraction=0.5)

P1, A1, U2 = list(range(1000, 1040)), list(range(5000, 5030)), list(range(7000, 7010))
BIG = list(range(20_000, 22_000))  # 2,000 prompt tokens: never below a 1,000-token pool


def req(session: int, turn: int, ts: float, inp: list[int], out: list[int]) -> TraceRequest:
    return TraceRequest(session, turn, ts, array("q", inp), array("q", out), len(inp), len(out))


def trace() -> Trace:
    # r0 P1 -> A1; BIG arrives second and never fits; r1 extends r0; r2 retries P1.
    return Trace(
        "dropped",
        [
            req(0, 0, 0.0, P1, A1),
            req(9, 0, 50.0, BIG, list(range(9000, 9005))),
            req(0, 1, 100.0, P1 + A1 + U2, list(range(8000, 8005))),
            req(1, 0, 200.0, P1, list(range(6000, 6005))),
        ],
    )


def one(n_in: int, n_out: int) -> Trace:
    return Trace("one", [req(0, 0, 0.0, list(range(n_in)), list(range(10**6, 10**6 + n_out)))])


def dropped_indices(model: ServingModel) -> list[int]:
    index = {id(r): i for i, r in enumerate(model.trace.requests)}
    return sorted(index[id(r)] for r in model.dropped)


def served(tr: Trace, policy: str, cfg: ServingConfig) -> bool:
    """Whether the one request was served; if not, it must be counted as
    dropped (not lost, even when the scheduler aborts it mid-decode)."""
    model = ServingModel(tr, BYTE, make_policy(policy), cfg)
    model.run()
    assert len(model.outcomes) + len(model.dropped) == 1
    return len(model.outcomes) == 1


@pytest.mark.parametrize(
    ("prof", "gb", "fraction", "page"),
    [
        (BYTE, 2000.5e-9, 0.5, 1),
        (BYTE, 12345.5e-9, 0.3, 16),
        (get_profile("nemotron-h-8b"), 40.0, 0.9 / 1.9, 1),
        (get_profile("marconi-7b"), 3.3, 0.3, 64),
        (get_profile("qwen3-next-80b-a3b"), 7.77, 0.61, 16),
    ],
)
@pytest.mark.parametrize("sequential", [False, True])
def test_pools_are_the_serving_models(
    prof: ModelProfile, gb: float, fraction: float, page: int, sequential: bool
) -> None:
    if sequential:
        page = 1  # the shared budget allocates KV a token at a time
    cfg = ServingConfig(gb, fraction, sequential=sequential, page_size=page, track_interval=256)
    model = ServingModel(trace(), prof, make_policy("sglang-extra-buffer"), cfg)
    p = pools_for(prof, 1, cfg)
    assert (p.kv_units, p.states) == (model.cache.kv.capacity, model.cache.slots.capacity)


@pytest.mark.parametrize(
    ("policy", "n_in", "n_out", "page", "too_small", "enough"),
    [
        # Admission wants prompt + output + one page strictly below the pool:
        ("sglang", 40, 5, 1, 46, 47),  # 40 + 5 + 1 = 46 < 47
        ("mambaradix", 40, 5, 1, 46, 47),
        ("sglang-extra-buffer", 40, 5, 16, 48, 64),  # 40 + 5 + 16 = 61 < 64 (whole pages)
        # Past the 4,096-token output clip, decoding alone binds: 10 + 5,000 - 1
        # tokens must be held at the end (the serving model aborts it mid-decode).
        ("sglang", 10, 5000, 1, 5008, 5009),
        ("sglang-extra-buffer", 10, 5000, 1, 5008, 5009),
    ],
)
def test_the_least_pool_by_hand(
    policy: str, n_in: int, n_out: int, page: int, too_small: int, enough: int
) -> None:
    tr = one(n_in, n_out)
    for kv, fits in ((too_small, False), (enough, True)):
        cfg = ServingConfig(1.0, kv_units=kv, state_slots=4, page_size=page, track_interval=256)
        track = TRACK_SLOTS[policy_strategy(policy)]
        assert served(tr, policy, cfg) is fits
        assert fit(tr, BYTE, cfg, track).never_fit == ([] if fits else [0])


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize(
    "gb",
    [0.12, pytest.param(0.3, marks=pytest.mark.slow), pytest.param(0.5, marks=pytest.mark.slow)],
)
def test_never_fit_is_what_the_serving_model_drops(page: int, gb: float) -> None:
    tr, prof = multi_turn(sessions=16, seed=0), get_profile("marconi-7b")
    cfg = ServingConfig(gb, page_size=page, track_interval=256)
    for policy in SINGLE_RUN:
        strategy = policy_strategy(policy)
        if (page > 1 and strategy == "no_buffer") or policy_own_memory(policy):
            continue  # vllm's block pool: test_vllm_drops_what_its_block_pool_never_holds
        state_bytes = policy_state_bytes(policy, prof)  # vLLM's: padded to a page
        shared = policy_shared_budget(policy)  # ours: one byte budget
        if pools_for(prof, 1, cfg, state_bytes, shared).states < 2:  # pools the model cannot build
            with pytest.raises(ValueError, match="too small"):
                ServingModel(tr, prof, make_policy(policy), cfg)
            with pytest.raises(ValueError, match="states for a request that reuses one"):
                check_memory(tr, prof, cfg, {policy: strategy})
            continue
        model = ServingModel(tr, prof, make_policy(policy), cfg)
        model.run()
        fitted = fit(tr, prof, cfg, TRACK_SLOTS[strategy], state_bytes, shared)
        predicted = fitted.never_fit
        assert len(predicted) < len(tr)
        # some request never fits, but at 0.5 GB, and on ours' one budget from the memory
        # that serves the largest request alone (0.3 GB here: nothing kept for states idle)
        assert predicted or gb == 0.5 or (shared and fitted.gb_for_largest <= gb), policy
        if shared:  # one byte budget, as in the sequential discipline: never-fit is dropped
            assert set(predicted) <= set(dropped_indices(model)), policy
            assert model.outcomes, policy
        elif model.cache.slots.capacity >= 2 + TRACK_SLOTS[strategy]:
            assert dropped_indices(model) == predicted, policy
            check_memory(tr, prof, cfg, {policy: strategy})
        else:  # too few states for a request that reuses one: it is dropped too
            assert len(model.dropped) > len(predicted), policy
            with pytest.raises(ValueError, match="needs 4 states for a request that reuses one"):
                check_memory(tr, prof, cfg, {policy: strategy})


@pytest.mark.parametrize("policy", ["sglang", "sglang-extra-buffer"])
def test_sequential_refuses_only_what_serves_nothing(policy: str) -> None:
    # Marconi's shared budget: requests the check calls never-fit are always
    # dropped; a point where it finds none that fits serves nothing.
    tr, prof = multi_turn(sessions=16, seed=0), get_profile("marconi-7b")
    strategy = policy_strategy(policy)
    for gb in (0.05, 0.1, 0.2):
        cfg = ServingConfig(gb, sequential=True)
        model = ServingModel(tr, prof, make_policy(policy), cfg)
        model.run()
        predicted = fit(tr, prof, cfg, TRACK_SLOTS[strategy]).never_fit
        assert set(predicted) <= set(dropped_indices(model))
        if len(predicted) == len(tr):
            assert not model.outcomes
            with pytest.raises(ValueError, match="no request fits"):
                check_memory(tr, prof, cfg, {policy: strategy})
        else:
            assert model.outcomes


def two_sizes() -> Trace:
    """Request 0: 20 prompt + 2 new tokens; request 1: 179 + 4."""
    small = req(0, 0, 0.0, list(range(20)), [1, 2])
    return Trace("t", [small, req(1, 0, 1.0, list(range(100, 279)), [5] * 4)])


@pytest.mark.parametrize("policy", ["vllm", "vllm-0.20-all"])
def test_sequential_drops_what_its_state_leaves_too_little_room_for(policy: str) -> None:
    # marconi-7b: 65,536 B per KV token; vLLM's state S padded to its page (31.5 MB). A
    # shared budget of 42 MB. Request 0 (20 prompt + 2 new) holds 21 tokens and a state:
    # served. Request 1 (179 + 4) holds 182 tokens and a state, more than the budget: its
    # prompt alone is admitted, but its prefill can never finish beside its state. It is
    # dropped, as `fit` says (the run was admitting and preempting it forever).
    prof = get_profile("marconi-7b")
    s = policy_state_bytes(policy, prof)
    assert 21 * 65_536 + s <= 42e6 < 182 * 65_536 + s
    tr = two_sizes()
    cfg = ServingConfig(0.042, sequential=True)
    if policy_own_memory(policy):  # vllm: vLLM's block pool, `vllm_fit`
        assert policy_fit(tr, prof, cfg, policy).never_fit == [1]
    else:
        assert fit(tr, prof, cfg, 0, s).never_fit == [1]

    def hung(signum: int, frame: object) -> None:
        raise TimeoutError("the replay did not end")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        r = replay(tr, prof, policy, cfg)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert (r["served"], r["dropped_requests"]) == (1, [1])


def test_dropped_warning_prices_vllm_states_as_vllm_holds_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The trace above at 42 MB, vllm: request 1 is dropped. vLLM 0.33.0 serves it alone
    # from one pool of 80-token blocks of 80 x 65,536 = 5,242,880 B: its prefill step
    # holds 3 blocks of KV and two states of 6 blocks each (the running state and the
    # replay boundary 160 its forward exports), with vLLM's null block 16 blocks:
    # 83,886,080 B, so about 0.09 GB (vLLM's padded states; the profile's 26.8 MB ones
    # would say less), and that much serves both requests.
    from mambaradix.replay.workloads import save_jsonl

    save_jsonl(two_sizes(), tmp_path / "t.jsonl")
    args = ["replay", "--trace", str(tmp_path / "t.jsonl"), "--model", "marconi-7b"]
    args += ["--sequential", "--policy", "vllm", "--no-progress", "--plot", str(tmp_path / "r.png")]
    assert main([*args, "--memory", "0.042"]) == 0
    assert capsys.readouterr().err.strip().endswith("serving every request needs about 0.09 GB")
    cfg = ServingConfig(0.09, sequential=True)
    assert replay(two_sizes(), get_profile("marconi-7b"), "vllm", cfg)["dropped"] == 0


def test_hit_rates_count_the_dropped_request_as_a_miss() -> None:
    # By hand: prompts 40 + 2,000 + 80 + 40 = 2,160 tokens over 4 requests.
    # sglang hits r1 at 69 (r0's finished state at 40 + 30 - 1); mambaradix
    # also r2 at 39 (r0's last prompt token). BIG: dropped, a miss.
    assert pools_for(BYTE, 1, HALF)[:2] == (1000, 1000)
    for policy, hits, hit_requests in (("sglang", 69, 1), ("mambaradix", 69 + 39, 2)):
        m = replay(trace(), BYTE, policy, HALF)
        assert (m["requests"], m["served"], m["dropped"]) == (4, 3, 1)
        assert m["dropped_requests"] == [1] and m["dropped_prompt_tokens"] == 2000
        assert m["prompt_tokens"] == 2160 and m["cached_tokens"] == hits
        assert m["token_hit_rate"] == pytest.approx(hits / 2160)
        assert m["request_hit_rate"] == pytest.approx(hit_requests / 4)


def test_sweep_table_shows_the_dropped_column() -> None:
    data = sweep(trace(), BYTE, ["sglang"], [2000.5e-9], HALF, workers=1, progress=False)
    (r,) = data["results"]
    assert r["dropped"] == 1
    text = table(data)
    head, row = text.splitlines()[1], text.splitlines()[-1]
    assert head.split()[8] == "dropped"  # memory policy tok hit of bound req hit dropped
    assert row.split()[5] == "1"
    assert f"{69 / 2160:.1%}" in row


def test_plot_marks_points_with_dropped_requests() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mambaradix.replay.sweep import _mark_dropped

    rows = [
        {"memory_gb": 1.0, "token_hit_rate": 0.1, "dropped": 3},
        {"memory_gb": 2.0, "token_hit_rate": 0.2, "dropped": 0},
        {"memory_gb": 4.0, "token_hit_rate": 0.3, "dropped": 1},
    ]
    fig, ax = plt.subplots()
    _mark_dropped(ax, rows)
    (marks,) = ax.collections
    assert marks.get_offsets().tolist() == [[1.0, 0.1], [4.0, 0.3]]
    assert marks.get_label() == "requests dropped (counted as misses)"
    plt.close(fig)


@pytest.fixture
def dropped_trace(tmp_path: Path) -> Path:
    path = tmp_path / "dropped.jsonl"
    lines = [
        {
            "session_id": r.session_id,
            "turn_id": r.turn_id,
            "ts": r.ts,
            "input_tokens": list(r.input_units),
            "output_tokens": list(r.output_units),
        }
        for r in trace().requests
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def cli(dropped_trace: Path, tmp_path: Path, memory: str, policy: str) -> list[str]:
    args = ["replay", "--trace", str(dropped_trace), "--model", "marconi-7b"]
    args += ["--memory", memory, "--policy", policy, "--workers", "1", "--no-progress"]
    return args + ["--json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.png")]


SPLIT_PAIR = "sglang,marconi"
"""Two policies on split pools (ours runs on one byte budget, in which BIG fits 0.2 GB)."""


@pytest.mark.slow
def test_cli_warns_and_records_the_dropped(
    tmp_path: Path, dropped_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # marconi-7b, 0.2 GB, default split: int(0.2e9 x 10/19) // 65,536 = 1,606
    # KV tokens: BIG (2,000 + 5 + 1 must stay below the pool) never fits.
    assert main(cli(dropped_trace, tmp_path, "0.2", SPLIT_PAIR)) == 0
    err = capsys.readouterr().err.strip().splitlines()
    # BIG needs a pool of 2,007 tokens x 65,536 B / (10/19) = 0.2499 GB, up to 0.01 GB.
    assert err == [
        "warning: 1 of 4 requests did not fit in 0.2 GB and were dropped "
        "(sglang, marconi); they count as misses; "
        "serving every request needs about 0.25 GB"
    ]
    data = json.loads((tmp_path / "r.json").read_text())
    for r in data["results"]:
        assert (r["dropped"], r["dropped_requests"], r["served"]) == (1, [1], 3)
    hits = {r["policy"]: r["token_hit_rate"] for r in data["results"]}
    assert hits["sglang"] == pytest.approx(69 / 2160)


def test_cli_cluster_shows_and_warns_the_dropped_once(
    tmp_path: Path, dropped_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # As above, BIG never fits 0.2 GB, so no instance serves it, whatever the router.
    args = cli(dropped_trace, tmp_path, "0.2", SPLIT_PAIR)[:-2]  # no --plot
    assert main([*args, "--instances", "2", "--router", "hybrid,round-robin"]) == 0
    out, err = capsys.readouterr()
    assert err.strip().splitlines() == [
        "warning: 1 of 4 requests did not fit in 0.2 GB and were dropped "
        "(sglang, marconi); they count as misses; "
        "serving every request needs about 0.25 GB"
    ]
    head, _, *rows = out.splitlines()[1:7]
    end = head.index(" dropped") + len(" dropped")  # the column is right-aligned
    assert len(rows) == 4 and all(row[:end].split()[-1] == "1" for row in rows)


def test_dropped_warning_blames_sequential_only_when_sequential(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # one(100, 5) fits alone in 1 GB either way (32,768 KV tokens split; a shared
    # budget of ~1e9 B), so a drop there is not for lack of memory alone: with the
    # shared budget it is the states cached by then (--sequential); with split pools
    # the scheduler aborted it mid-decode, out of KV beside the requests in flight
    # (SGLang's retract_decode with one request left), nothing to do with --sequential.
    from mambaradix.cli.replay import warn_dropped

    row = {"policy": "vllm", "memory_gb": 1.0, "state_fraction": 0.9 / 1.9, "dropped": 1}
    for sequential in (False, True):
        cfg = ServingConfig(1.0, sequential=sequential)
        warn_dropped({"results": [row]}, one(100, 5), get_profile("nemotron-h-8b"), cfg)
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("warning: 1 of 1 requests did not fit in 1 GB and were dropped")
        assert ("--sequential" in line) == sequential
        assert ("beside the requests in flight" in line) != sequential


def test_cli_run_that_serves_nothing_fails(
    tmp_path: Path,
    dropped_trace: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The fit check guarantees some request fits alone; a serving model that
    # still serves nothing (stand-in below) must not look like a result.
    import mambaradix.replay.cells as cells_module  # where the sweep runs a cell

    def serves_nothing(*args: Any) -> ReplayResult:
        r = replay_checked(*args)
        return replace(r, served=0, dropped=r.requests, token_hit_rate=0.0)

    monkeypatch.setattr(cells_module, "replay_checked", serves_nothing)
    assert main(cli(dropped_trace, tmp_path, "1", "sglang")) == 1
    err = capsys.readouterr().err
    assert "mambaradix replay: error: nothing was served (sglang at 1 GB)" in err
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "r.png").exists()
