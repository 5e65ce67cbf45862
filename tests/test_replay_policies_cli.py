"""`mambaradix replay --policy vllm,vllm-0.20-all,marconi,marconi-oracle,mambaradix`
on every bundled workload (its first requests) and on a trace file by path, in
both disciplines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mambaradix.cli import main
from mambaradix.replay.workloads import BUNDLED

POLICIES = ["vllm", "vllm-0.20-all", "marconi", "marconi-oracle", "mambaradix"]
DISCIPLINES = {"serving": [], "sequential": ["--sequential", "--model", "marconi-7b"]}
MEMORY = {"mooncake": "20"}  # GB; 2 GB for the others


def run(tmp_path: Path, trace: str, extra: list[str], memory: str) -> dict[str, Any]:
    out = tmp_path / "r.json"
    args = ["replay", "--trace", trace, "--policy", ",".join(POLICIES), "--memory", memory]
    args += [*extra, "--no-progress", "--workers", "1"]
    assert main([*args, "--json", str(out), "--plot", str(tmp_path / "r.png")]) == 0
    data: dict[str, Any] = json.loads(out.read_text())
    return data


@pytest.mark.slow  # each loads (and some tokenize) a bundled trace: seconds to a minute
@pytest.mark.parametrize("trace", sorted(BUNDLED))
def test_every_bundled_trace_in_both_disciplines(
    trace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for extra in DISCIPLINES.values():
        data = run(tmp_path, trace, [*extra, "--limit", "40"], MEMORY.get(trace, "2"))
        assert [r["policy"] for r in data["results"]] == POLICIES
        bound = data["bound"]["token_hit_rate"]
        for r in data["results"]:
            assert r["requests"] == (12 if trace == "sample" else 40)  # the sample has 12
            assert 0.0 <= r["token_hit_rate"] <= bound + 1e-12
        oracle = data["results"][POLICIES.index("marconi-oracle")]
        assert oracle["token_hit_rate"] == max(oracle["oracle_grid"].values())
    assert "marconi-oracle" in capsys.readouterr().out


# A trace file: r0 = prompt P (40 tokens) + answer A (30); r1 = P + A + 10
# tokens; r2 = P again (a retry), 100 s apart, unlimited memory (20 GB).
P, A = list(range(1000, 1040)), list(range(5000, 5030))
RECORDS = [
    {"session_id": 0, "turn_id": 0, "ts": 0.0, "input_tokens": P, "output_tokens": A},
    {
        "session_id": 0,
        "turn_id": 1,
        "ts": 100.0,
        "input_tokens": P + A + list(range(7000, 7010)),
        "output_tokens": [1, 2, 3],
    },
    {"session_id": 1, "turn_id": 0, "ts": 200.0, "input_tokens": P, "output_tokens": [4, 5]},
]
PROMPT = 40 + 80 + 40
# vllm / vllm-0.20-all: blocks of 1,040 / 1,152 tokens (Nemotron-H-8B) and 80
# (marconi-7b, align in both: no "all" mode for it) lie beyond every prompt:
# 0. marconi (every alpha): r1 reuses r0's finished state at 40 + 30 - 1 =
# 69; r2's 39-token lookup finds KV but no state (it checkpoints its branch
# point there): 0. mambaradix: also r0's input - 1 = 39, which r2 hits.
HITS = {"vllm": 0, "vllm-0.20-all": 0, "marconi": 69, "marconi-oracle": 69, "mambaradix": 69 + 39}


@pytest.mark.parametrize("discipline", list(DISCIPLINES))
def test_a_trace_file_by_path(discipline: str, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    data = run(tmp_path, str(path), DISCIPLINES[discipline], "20")
    got = {r["policy"]: r["cached_tokens"] for r in data["results"]}
    assert got == HITS
    assert all(r["token_hit_rate"] == HITS[r["policy"]] / PROMPT for r in data["results"])
