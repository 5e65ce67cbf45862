"""bench/evaluate.py (12-19 minutes) says how far it is, and ends with its workers on
Ctrl-C, SIGTERM or SIGHUP."""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path
from types import ModuleType

import pytest

from bench_scripts import load_bench
from mambaradix.cli.signals import Terminated

BENCH = Path(__file__).resolve().parents[1] / "bench" / "evaluate.py"


@pytest.fixture(scope="module")
def evaluate() -> ModuleType:
    return load_bench("evaluate")


LINE = re.compile(r"^  (\d+)/(\d+) runs, \d+ s, about \d+ s left$")


def test_a_line_per_interval_and_one_at_the_end(
    evaluate: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = iter([0.0, 1.0, 12.0, 13.0, 30.0, 31.0])  # start, then one reading per run
    monkeypatch.setattr(evaluate.time, "monotonic", lambda: next(clock))
    progress = evaluate.Progress(5, every=10.0)
    for _ in range(5):
        progress()
    lines = capsys.readouterr().err.splitlines()
    done = [LINE.match(x) for x in lines]
    assert all(done), lines
    # at 12 s (10 s after the start's line: 2 runs), at 30 s, and at the end (5 of 5)
    assert [(m.group(1), m.group(2)) for m in done if m] == [("2", "5"), ("4", "5"), ("5", "5")]
    assert lines[0] == "  2/5 runs, 12 s, about 18 s left"  # 6 s a run so far, 3 to go


def test_the_runs_go_through_workers_that_die_with_it(
    evaluate: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []

    def forked(run: object, items: list[object], workers: int, done: object) -> list[object]:
        seen.append(workers)
        return []

    monkeypatch.setattr(evaluate, "run_forked", forked)
    assert evaluate.run_all([], 2) == [] and seen == [2]


@pytest.mark.parametrize(
    ("stop", "code"), [(KeyboardInterrupt(), 130), (Terminated(signal.SIGTERM), 143)]
)
def test_interrupted_it_exits_with_the_signals_code(
    evaluate: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stop: BaseException,
    code: int,
) -> None:
    def main() -> None:
        raise stop

    monkeypatch.setattr(evaluate, "main", main)
    monkeypatch.setattr(sys, "argv", ["evaluate.py"])
    assert evaluate.interruptible() == code
    assert "nothing written" in capsys.readouterr().err


def test_an_unknown_discipline_is_refused_before_any_work() -> None:
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(BENCH.parents[1] / "src")}
    argv = [sys.executable, str(BENCH), "--disciplines", "sequential,bogus"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2
    assert "--disciplines: unknown bogus" in done.stderr
    assert "runs on" not in done.stderr  # no material loaded, no job listed


def _cell(rate: float, parts: list[float]) -> dict[str, object]:
    return {"rate": rate, "parts": parts, "spread": 0.0}


def test_merged_parts_count_each_point_once_the_later_part_winning(
    evaluate: ModuleType, tmp_path: Path
) -> None:
    """Two parts' JSON files (memory keys as JSON writes them); the second re-runs one of
    the first's points. By hand: ours 0.5 vs at most 0.4 with paired differences 0.1, 0.2,
    0.1 (sd 0.058) is a win; the re-run point at 0.3 vs 0.4 (differences -0.1, -0.05, -0.15,
    sd 0.05) a loss."""
    import json

    others = [p for p in evaluate.POLICIES if p != evaluate.OURS]

    def point(ours: float, ours_parts: list[float]) -> dict[str, object]:
        cells = {p: _cell(0.4, [0.4, 0.3, 0.5]) for p in others}
        cells[evaluate.OURS] = _cell(ours, ours_parts)
        return cells

    first = {"results": {"w": {"serving": {"1.0": point(0.5, [0.5, 0.5, 0.6]),
                                           "2.0": point(0.5, [0.5, 0.5, 0.6])}}}}  # fmt: skip
    second = {"results": {"w": {"serving": {"2.0": point(0.3, [0.3, 0.25, 0.35])}}}}
    paths = []
    for i, data in enumerate((first, second)):
        paths.append(tmp_path / f"part{i}.json")
        paths[-1].write_text(json.dumps(data))
    results = evaluate.merged([str(p) for p in paths])
    assert list(results["w"]["serving"]) == [1.0, 2.0]
    text = evaluate.merged_summary(results)
    assert text.startswith(
        f"{evaluate.OURS} against every other policy at once, per point: 1 wins, 0 ties, "
        "1 losses of 2 points (merged parts)."
    )


@pytest.mark.slow  # 6-7 s each: the materials' traces are generated and loaded
@pytest.mark.parametrize("material", ["evaluation", "tuning"])
def test_every_point_serves_requests_with_every_row(evaluate: ModuleType, material: str) -> None:
    """`replay` refuses a point where no request fits (`fit.check_memory`), which would end
    the whole run at that point: each point of the material must pass that check with
    every row. (The tuning material's shared documents, sequential, once had 0.5 and 1 GB,
    where none of marconi-7b's fits.)"""
    from mambaradix.replay.checks import policy_strategy
    from mambaradix.replay.fit import check_memory
    from mambaradix.replay.serving import ServingConfig

    groups = evaluate.load_material(material, None)
    rows = evaluate.POLICIES + [evaluate.NO_TUNING, *evaluate.ABLATIONS]
    checked = 0
    for workload, keys in groups.items():
        for discipline in evaluate.disciplines(workload):
            model, sequential = evaluate.DISCIPLINES[discipline]
            profile = evaluate.get_profile(model)
            for memory in evaluate.memories(workload, discipline):
                cfg = ServingConfig(memory_gb=memory, sequential=sequential)
                runs = {r for row in rows for r in evaluate.runs_of(row, discipline, memory)}
                strategies = {run: policy_strategy(run) for run in runs}
                for key in keys:
                    check_memory(evaluate._TRACES[key], profile, cfg, strategies)
                    checked += 1
    assert checked > 20


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--memory", "x"], "--memory: comma-separated GB, e.g. 1,5; got 'x'"),
        (["--only", "mt-bnch"], "--only: unknown mt-bnch; choose from mooncake,"),
        (["--disciplines", "serial"], "--disciplines: unknown serial"),
        (
            ["--only", "mt-bench", "--memory", "3"],  # mt-bench's points: 1, 2, 5 GB
            "--only, --disciplines, --memory: together they choose no point of the material",
        ),
    ],
)
def test_a_bad_choice_of_points_is_one_line_before_any_run(
    evaluate: ModuleType,
    argv: list[str],
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    ran: list[object] = []
    monkeypatch.setattr(evaluate, "run_all", lambda jobs, workers: ran.append(jobs) or [])
    monkeypatch.setattr(sys, "argv", ["evaluate.py", *argv, "--out", str(tmp_path / "e")])
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main()
    assert exit_info.value.code == 2
    assert says in capsys.readouterr().err
    assert ran == []


def test_memory_keeps_only_those_points(
    evaluate: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """mt-bench, serving, at 5 GB of its 1, 2 and 5 GB: each row's runs at that point only."""
    seen: list[list[object]] = []

    def run_all(jobs: list[object], workers: int) -> list[object]:
        seen.append(jobs)
        raise SystemExit(0)  # the jobs are what is checked: no replay

    monkeypatch.setattr(evaluate, "run_all", run_all)
    argv = ["--only", "mt-bench", "--disciplines", "serving", "--memory", "5"]
    monkeypatch.setattr(sys, "argv", ["evaluate.py", *argv, "--policies", "mambaradix"])
    with pytest.raises(SystemExit):
        evaluate.main()
    (jobs,) = seen
    points = {(j.trace, j.discipline, j.memory) for j in jobs}  # type: ignore[attr-defined]
    assert points == {("mt-bench", "serving", 5.0)}
    # sglang, sglang-extra-buffer, vllm, marconi, the oracle's 8 alphas and ours
    assert len(jobs) == 4 + 8 + 1
