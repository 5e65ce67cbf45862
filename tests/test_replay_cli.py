"""Tests for `mambaradix replay` (`mambaradix.cli`): run in-process on a tiny
neutral JSONL trace whose hit rates are worked out by hand, and on the bundled
Mooncake trace; the JSON output, the plot, the options, and the errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mambaradix.cli import main
from mambaradix.geometry.profile import get_profile

# The hand-worked trace (token ids, one unit per token), 100 s apart so that
# nothing overlaps:
#   r0  session 0 turn 0: P1 (40 tokens), answer A1 (30 tokens)
#   r1  session 0 turn 1: P1 + A1 + 10 new tokens (80), answer 5 tokens
#   r2  session 1 turn 0: P1 again (a retry of r0's prompt), answer 5 tokens
P1 = list(range(1000, 1040))
A1 = list(range(5000, 5030))
U2 = list(range(7000, 7010))
RECORDS = [
    {"session_id": 0, "turn_id": 0, "ts": 0.0, "input_tokens": P1, "output_tokens": A1},
    {
        "session_id": 0,
        "turn_id": 1,
        "ts": 100.0,
        "input_tokens": P1 + A1 + U2,
        "output_tokens": list(range(8000, 8005)),
    },
    {
        "session_id": "retry",
        "turn_id": 0,
        "ts": 200.0,
        "input_tokens": P1,
        "output_tokens": list(range(6000, 6005)),
    },
]
PROMPT_TOKENS = 40 + 80 + 40
# r1 reuses turn 1's finished state at 40 + 30 - 1 = 69 (sglang and ours).
# r2 looks up 39 tokens: sglang's states are at 40 (prompt end) and deeper, so
# it hits 0; mambaradix checkpointed r0's last prompt token (39) and hits 39.
EXPECTED_HIT = {"sglang": 69 / PROMPT_TOKENS, "mambaradix": (69 + 39) / PROMPT_TOKENS}
# Bound: r1 shares all of r0's input + output (70 tokens), r2 its 39-token lookup.
EXPECTED_BOUND = (70 + 39) / PROMPT_TOKENS

RESULT_FIELDS = (
    "policy",
    "memory_gb",
    "token_hit_rate",
    "request_hit_rate",
    "flops_saved",
    "ttft_p50_s",
    "ttft_p95_s",
)
WALL_CLOCK = frozenset({"replay_s", "requests_per_s"})


@pytest.fixture
def tiny_trace(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path


def run_cli(tmp_path: Path, *args: str, tag: str = "run") -> tuple[int, dict[str, Any], Path]:
    out_json, out_png = tmp_path / f"{tag}.json", tmp_path / f"{tag}.png"
    rc = main(["replay", *args, "--no-progress", "--json", str(out_json), "--plot", str(out_png)])
    data = json.loads(out_json.read_text()) if out_json.exists() else {}
    return rc, data, out_png


def check_schema(data: dict[str, Any], policies: list[str], memories: list[float]) -> None:
    for key in ("name", "requests", "prompt_tokens"):
        assert key in data["trace"]
    for key in ("name", "kv_bytes_per_token", "state_bytes"):
        assert key in data["model"]
    assert 0.0 <= data["bound"]["token_hit_rate"] <= 1.0
    got = [(r["policy"], r["memory_gb"]) for r in data["results"]]
    assert got == [(p, m) for m in memories for p in policies]  # sorted by memory, then policy
    for r in data["results"]:
        for key in RESULT_FIELDS:
            assert key in r, key
        assert 0.0 <= r["request_hit_rate"] <= 1.0
        assert 0.0 <= r["token_hit_rate"] <= data["bound"]["token_hit_rate"] + 1e-12
        assert r["flops_saved"] >= 0
        assert 0.0 <= r["ttft_p50_s"] <= r["ttft_p95_s"]
        assert r["served"] + r["dropped"] == r["requests"] == data["trace"]["requests"]


def check_png(path: Path) -> None:
    assert path.is_file() and path.stat().st_size > 1000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_path_trace_hand_worked_results(
    tmp_path: Path, tiny_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, data, png = run_cli(
        tmp_path,
        "--trace",
        str(tiny_trace),
        "--model",
        "marconi-7b",
        "--memory",
        "1,2",
        "--policy",
        "sglang,mambaradix",
        "--workers",
        "1",
    )
    assert rc == 0
    check_schema(data, ["sglang", "mambaradix"], [1.0, 2.0])
    prof = get_profile("marconi-7b")
    assert data["trace"] == {
        "name": "tiny",
        "requests": 3,
        "prompt_tokens": PROMPT_TOKENS,
        "unit_tokens": 1,
        "source": f"neutral JSONL {tiny_trace}",
    }
    assert data["model"] == {
        "name": "marconi-7b",
        "kv_bytes_per_token": prof.kv_bytes_per_token,
        "state_bytes": prof.state_bytes,
    }
    assert data["bound"]["token_hit_rate"] == pytest.approx(EXPECTED_BOUND)
    for r in data["results"]:
        assert r["token_hit_rate"] == pytest.approx(EXPECTED_HIT[r["policy"]])
        assert r["share_of_bound"] == pytest.approx(EXPECTED_HIT[r["policy"]] / EXPECTED_BOUND)
        assert r["request_hit_rate"] == pytest.approx(
            {"sglang": 1 / 3, "mambaradix": 2 / 3}[r["policy"]]
        )
        assert r["dropped"] == 0 and r["states_evicted"] == 0  # 1 GB is plenty here
        assert r["config"]["sequential"] is False
    check_png(png)
    out = capsys.readouterr().out
    assert "trace tiny: 3 requests" in out and "model marconi-7b" in out
    assert f"plot: {png}" in out and "json:" in out


def test_sequential_flag(tmp_path: Path, tiny_trace: Path) -> None:
    rc, data, png = run_cli(
        tmp_path,
        "--trace",
        str(tiny_trace),
        "--model",
        "marconi-7b",
        "--memory",
        "1",
        "--policy",
        "marconi,mambaradix",
        "--workers",
        "1",
        "--sequential",
    )
    assert rc == 0
    check_schema(data, ["marconi", "mambaradix"], [1.0])
    by_policy = {r["policy"]: r for r in data["results"]}
    assert all(r["config"]["sequential"] is True for r in data["results"])
    # Marconi: r1 hits the finished state (69); r2 finds 39 tokens of KV but no
    # state there: 0 (it checkpoints the branch point for the next retry).
    assert by_policy["marconi"]["token_hit_rate"] == pytest.approx(69 / PROMPT_TOKENS)
    assert by_policy["mambaradix"]["token_hit_rate"] == pytest.approx(EXPECTED_HIT["mambaradix"])
    check_png(png)


def test_state_fraction_and_rate_reach_the_config(tmp_path: Path, tiny_trace: Path) -> None:
    rc, data, _ = run_cli(
        tmp_path,
        "--trace",
        str(tiny_trace),
        "--model",
        "marconi-7b",
        "--memory",
        "1",
        "--policy",
        "sglang",
        "--workers",
        "1",
        "--state-fraction",
        "0.25",
        "--rate",
        "1000",
    )
    assert rc == 0
    (r,) = data["results"]
    assert r["config"]["state_fraction"] == 0.25 and r["config"]["rate"] == 1000.0
    # A quarter of 1 GB for states: 0.25e9 // state_bytes slots.
    assert r["state_capacity"] == int(1e9 * 0.25) // get_profile("marconi-7b").state_bytes


def test_parallel_workers_give_the_same_results(tmp_path: Path, tiny_trace: Path) -> None:
    common = ["--trace", str(tiny_trace), "--model", "marconi-7b", "--memory", "1,2"]
    common += ["--policy", "sglang,vllm,mambaradix"]
    rc1, one, _ = run_cli(tmp_path, *common, "--workers", "1", tag="w1")
    rc2, two, _ = run_cli(tmp_path, *common, "--workers", "2", tag="w2")
    assert rc1 == rc2 == 0

    def strip(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in rows]

    assert strip(one["results"]) == strip(two["results"])
    assert one["bound"] == two["bound"]


@pytest.mark.slow  # the whole bundled trace: seconds
def test_bundled_mooncake(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, data, png = run_cli(
        tmp_path,
        "--trace",
        "mooncake",
        "--limit",
        "300",
        "--workers",
        "1",
        "--memory",
        "10,20",
        "--policy",
        "sglang,mambaradix",
    )
    assert rc == 0
    check_schema(data, ["sglang", "mambaradix"], [10.0, 20.0])
    assert data["trace"]["name"] == "mooncake"
    assert data["trace"]["requests"] == 300 and data["trace"]["unit_tokens"] == 512
    assert data["trace"]["prompt_tokens"] > 300 * 512  # long prompts
    assert data["model"]["name"] == "nemotron-h-8b"  # the default model
    assert 0 < data["bound"]["token_hit_rate"] < 1
    assert data["elapsed_s"] > 0
    by = {(r["policy"], r["memory_gb"]): r for r in data["results"]}
    for mem in (10.0, 20.0):
        assert by["mambaradix", mem]["token_hit_rate"] > 0
        assert by["mambaradix", mem]["token_hit_rate"] >= by["sglang", mem]["token_hit_rate"]
    check_png(png)
    assert "trace mooncake: 300 requests" in capsys.readouterr().out


# ------------------------------------------------------------------ errors


def test_unknown_policy(
    tmp_path: Path, tiny_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, data, png = run_cli(tmp_path, "--trace", str(tiny_trace), "--policy", "sglang,lru-magic")
    assert rc != 0 and not data and not png.exists()
    err = capsys.readouterr().err
    assert "unknown policy lru-magic" in err
    assert "mambaradix" in err and "marconi" in err  # lists the choices


def test_unknown_model(
    tmp_path: Path, tiny_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, data, _ = run_cli(tmp_path, "--trace", str(tiny_trace), "--model", "gpt-17")
    assert rc != 0 and not data
    err = capsys.readouterr().err
    assert "unknown model profile 'gpt-17'" in err and "nemotron-h-8b" in err


def test_missing_trace_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.jsonl"
    rc, data, _ = run_cli(tmp_path, "--trace", str(missing))
    assert rc != 0 and not data
    err = capsys.readouterr().err
    assert "nope.jsonl" in err and "neither a bundled workload" in err
    assert "mooncake" in err  # names what is bundled


def test_malformed_trace_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(RECORDS[0]) + "\n" + '{"session_id": 1, "turn_id": 0}\n')
    rc, data, _ = run_cli(tmp_path, "--trace", str(bad))
    assert rc != 0 and not data
    err = capsys.readouterr().err
    assert "bad.jsonl, line 2" in err and "missing field 'input_tokens'" in err


@pytest.mark.parametrize("memory", ["0", "-5", "ten"])
def test_bad_memory_is_a_usage_error(memory: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--memory", memory]) == 2
    assert "--memory" in capsys.readouterr().err


def test_console_script_exit_status(tmp_path: Path, tiny_trace: Path) -> None:
    exe = Path(sys.executable).parent / "mambaradix"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "mambaradix.cli"]
    bad = subprocess.run(
        [*cmd, "replay", "--trace", str(tiny_trace), "--policy", "nope", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert "unknown policy nope" in bad.stderr


@pytest.mark.parametrize("limit", ["0", "-3"])
def test_limit_must_be_positive(limit: str, capsys: pytest.CaptureFixture[str]) -> None:
    from mambaradix.cli import main

    code = main(
        [
            "replay",
            "--limit",
            limit,
            "--memory",
            "40",
            "--policy",
            "sglang",
            "--no-progress",
            "--workers",
            "1",
        ]
    )
    assert code != 0
    assert "--limit" in capsys.readouterr().err


@pytest.mark.slow
def test_state_fraction_sweep(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code = main(
        [
            "replay",
            "--trace",
            "synthetic-multi-turn",
            "--memory",
            "2,5",
            "--state-fraction",
            "0.3,0.6",
            "--policy",
            "sglang,mambaradix",
            "--no-progress",
            "--workers",
            "1",
            "--json",
            str(out),
            "--plot",
            str(tmp_path / "r.png"),
            "--prefill-tflops",
            "1000",
            "--tpot-ms",
            "10",
        ]
    )
    assert code == 0
    data = json.loads(out.read_text())
    points = {(r["policy"], r["memory_gb"], r["state_fraction"]) for r in data["results"]}
    assert len(points) == 8
    assert {r["config"]["prefill_flops_per_s"] for r in data["results"]} == {1e15}
    caps = {
        (r["memory_gb"], r["state_fraction"]): r["state_capacity"]
        for r in data["results"]
        if r["policy"] == "sglang"  # ours draws on one byte budget: no share applies
    }
    assert caps[(2.0, 0.6)] > caps[(2.0, 0.3)]  # the split really moves memory between pools


@pytest.mark.parametrize("form", ["new/dir/", "existing"])
def test_plot_directory_writes_where_it_says(
    tmp_path: Path, tiny_trace: Path, form: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "existing").mkdir()
    target = tmp_path / form
    args = ["replay", "--trace", str(tiny_trace), "--model", "marconi-7b", "--memory", "1"]
    args += ["--policy", "sglang", "--workers", "1", "--no-progress", "--plot", f"{target}"]
    args[-1] += "/" if form.endswith("/") else ""
    assert main(args) == 0
    written = target / "replay-tiny-marconi-7b.png"
    check_png(written)
    assert f"plot: {written}\n" in capsys.readouterr().out
    assert [p.name for p in written.parent.iterdir()] == [written.name]  # no temporaries left


def test_plot_format_follows_the_extension_and_json_dirs_are_made(
    tmp_path: Path, tiny_trace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["replay", "--trace", str(tiny_trace), "--model", "marconi-7b", "--memory", "1"]
    args += ["--policy", "sglang", "--workers", "1", "--no-progress"]
    assert main([*args, "--plot", "p.svg", "--json", "a/b/r.json"]) == 0
    assert (tmp_path / "p.svg").read_text().lstrip().startswith("<?xml")
    assert json.loads((tmp_path / "a/b/r.json").read_text())["results"][0]["policy"] == "sglang"
    assert main(args) == 0  # the default plot: out/replay-TRACE-MODEL.png in the working dir
    check_png(tmp_path / "out" / "replay-tiny-marconi-7b.png")
