"""The neutral JSONL schema (version 2), its bundled sample, and `mambaradix trace`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mambaradix.cli import main
from mambaradix.replay.workloads import (
    SAMPLE_FILE,
    TraceFormatError,
    data_file,
    load,
    load_jsonl,
    multi_turn,
    save_jsonl,
)

HEADER = {"schema": "mambaradix-trace", "version": 2}
A0 = {"session_id": "a", "turn_id": 0, "ts": 0.0, "input_tokens": [1, 2, 3], "output_tokens": [4]}
A1 = {"session_id": "a", "turn_id": 1, "ts": 2.5, "input_tokens": [1, 2, 3, 4, 5],
      "output_tokens": []}  # fmt: skip
B0 = {"session_id": 7, "turn_id": 0, "ts": 1, "input_tokens": [9], "output_tokens": [8, 8]}


def write(path: Path, *records: object) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_the_sample_is_a_v2_trace_of_real_conversations() -> None:
    trace = load("sample")
    assert (trace.name, len(trace), trace.meta["version"]) == ("sample", 12, 2)
    header = json.loads(data_file(*SAMPLE_FILE).read_text().splitlines()[0])
    assert header["schema"] == "mambaradix-trace" and "Apache-2.0" in header["license"]
    for name in ("LICENSE", "ATTRIBUTION.md"):
        assert data_file("sample", name).stat().st_size > 500
    by_turn = {(r.session_id, r.turn_id): r for r in trace.requests}
    assert sorted({s for s, _ in by_turn}) == [101, 102, 103, 104, 105, 106]
    for s in range(101, 107):  # turn 1's prompt is turn 0's prompt and answer, then more
        first, second = by_turn[s, 0], by_turn[s, 1]
        history = first.input_units + first.output_units
        assert second.input_units[: len(history)] == history
        assert len(second.input_units) > len(history)
        assert second.think_s is not None and second.ts > first.ts + second.think_s


def test_a_v1_file_reads_as_before(tmp_path: Path) -> None:
    t = load_jsonl(write(tmp_path / "v1.jsonl", A0, A1, B0))
    assert t.meta["version"] == 1 and [r.think_s for r in t.requests] == [None, None, None]
    assert [(r.session_id, r.turn_id, r.ts) for r in t.requests] == [
        ("a", 0, 0.0),
        (7, 0, 1.0),
        ("a", 1, 2.5),
    ]


def test_v2_think_and_duration_fields(tmp_path: Path) -> None:
    # a0 took 1.75 s: a1's think time is its 2.5 s gap minus that
    t = load_jsonl(write(tmp_path / "d.jsonl", HEADER, {**A0, "duration_s": 1.75}, A1, B0))
    assert [r.think_s for r in t.requests] == [None, None, 2.5 - 1.75]
    t = load_jsonl(write(tmp_path / "t.jsonl", HEADER, A0, {**A1, "think_s": 0.5}))
    assert t.requests[1].think_s == 0.5
    t = load_jsonl(write(tmp_path / "e.jsonl", HEADER, {**A0, "duration_s": 9.0}, A1))
    assert t.requests[1].think_s == 0.0  # answered after the next turn: no negative think


def test_save_jsonl_writes_the_header_and_think_times(tmp_path: Path) -> None:
    trace = multi_turn(sessions=3, seed=2)
    path = tmp_path / "m.jsonl"
    save_jsonl(trace, path)
    assert json.loads(path.read_text().splitlines()[0])["version"] == 2
    back = load_jsonl(path)
    assert [r.think_s for r in back.requests] == [r.think_s for r in trace.requests]
    assert sum(r.think_s is not None for r in back.requests) == len(trace) - 3


@pytest.mark.parametrize(
    ("records", "says"),
    [
        ([{**HEADER, "version": 3}, A0], r"line 1: 'version' 3 is newer than this mambaradix"),
        ([{**HEADER, "schema": "other"}, A0], r"line 1: 'schema' must be 'mambaradix-trace'"),
        ([HEADER, A0, {**A1, "think_s": -1}], r"line 3: 'think_s' must be a finite number >= 0"),
        ([HEADER, {**A0, "duration_s": "1"}], r"line 2: 'duration_s' must be a finite number"),
        ([HEADER], r"line 1: file has no records"),
    ],
)
def test_schema_errors_name_the_line_and_field(
    tmp_path: Path, records: list[object], says: str
) -> None:
    with pytest.raises(TraceFormatError, match=says):
        load_jsonl(write(tmp_path / "bad.jsonl", *records))


def test_trace_check_summarises_by_hand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "t.jsonl", HEADER, A0, A1, B0)
    assert main(["trace", "check", str(path), "--json", str(tmp_path / "s.json")]) == 0
    out = capsys.readouterr().out
    assert "requests 3 in 2 sessions" in out and "over 2.5 s" in out
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["prompt_tokens"] == {"total": 9, "min": 1, "p50": 3, "mean": 3.0, "p95": 5, "max": 5}
    assert s["later_turns"] == 1 and s["extending_turns"] == 1
    # a1 reuses a0's prompt and answer (4 tokens) of its 5 (one is always computed)
    assert s["bound"] == {"hit_tokens": 4, "token_hit_rate": 4 / 9}


@pytest.mark.parametrize(
    ("records", "says"),
    [
        ([A0, A1, {**A1, "ts": 3}], r"t.jsonl, line 3: session 'a' turn 1 repeats line 2"),
        ([A0, {**A1, "ts": 0}, {**A0, "ts": 1}], r"line 3: session 'a' turn 0 repeats line 1"),
        ([{**A0, "ts": 5}, A1], r"line 2: 'ts' 2.5 of session 'a' turn 1 is earlier than"),
        ([A0, {**A1, "input_tokens": []}], r"line 2: 'input_tokens' must not be empty"),
    ],
)
def test_trace_check_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], records: list[object], says: str
) -> None:
    path = write(tmp_path / "t.jsonl", *records)
    assert main(["trace", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mambaradix trace: error: ")
    assert re.search(says, err), err


def test_trace_sample_writes_the_bundled_file(tmp_path: Path) -> None:
    out = tmp_path / "my_trace.jsonl"
    assert main(["trace", "sample", "--out", str(out)]) == 0
    assert out.read_bytes() == data_file(*SAMPLE_FILE).read_bytes()


@pytest.mark.slow  # a whole replay with its plot: about 4-10 s
def test_the_readme_own_trace_command_runs_on_the_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["trace", "sample", "--out", "my_trace.jsonl"]) == 0
    args = ["replay", "--trace", "my_trace.jsonl", "--policy", "sglang,mambaradix"]
    args += ["--json", "out/r.json", "--plot", "out/r.png", "--memory", "20"]
    assert main([*args, "--workers", "1", "--no-progress"]) == 0
    data = json.loads(Path("out/r.json").read_text())
    assert data["trace"]["requests"] == 12 and Path("out/r.png").stat().st_size > 0
