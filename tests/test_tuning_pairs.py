"""bench/tuning_pairs.py: `--seeds N` pairs the first N tuning seeds (the docs' commands run
with two in the test suite), and refuses what it cannot mean."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from bench_scripts import load_bench
from mambaradix.geometry.profile import get_profile
from mambaradix.replay.run import replay
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.trace import Trace
from mambaradix.replay.workloads import multi_turn

BENCH = Path(__file__).resolve().parents[1] / "bench" / "tuning_pairs.py"


@pytest.fixture(scope="module")
def tuning_pairs() -> ModuleType:
    return load_bench("tuning_pairs")


@pytest.mark.parametrize(
    ("generator", "seeds", "says"),
    [
        ("synthetic-agent", "1", "--seeds must be 2 to 5 (a sd needs two), got 1"),
        ("synthetic-agent", "6", "--seeds must be 2 to 5 (a sd needs two), got 6"),
        ("chitchat-heldout", "2", "--seeds: chitchat-heldout is one trace, paired by folds"),
    ],
)
def test_bad_seeds_are_refused_before_any_replay(
    tuning_pairs: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    generator: str,
    seeds: str,
    says: str,
) -> None:
    def no_replay(*args: object, **kwargs: object) -> None:
        raise AssertionError("a replay ran")

    monkeypatch.setattr(tuning_pairs, "replay", no_replay)
    argv = ["tuning_pairs.py", "--generator", generator, "--discipline", "sequential"]
    argv += ["--memory", "2", "--rows", "mambaradix", "--seeds", seeds, "--workers", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as stop:
        tuning_pairs.main()
    assert stop.value.code == 2
    assert says in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.slow
def test_two_seeds_pair_seeds_100_and_101() -> None:
    """The mean of each row and the mean and sample sd of the per-seed differences, against
    replays of the same traces made here, through the public API."""
    argv = ["--generator", "synthetic-two-turn", "--discipline", "sequential", "--memory", "2"]
    argv += ["--rows", "mambaradix,marconi", "--seeds", "2", "--workers", "1"]
    out = subprocess.run(
        [sys.executable, str(BENCH), *argv], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    cfg = ServingConfig(memory_gb=2, sequential=True)
    model = get_profile("marconi-7b")  # the sequential discipline's

    def two_turn(seed: int) -> Trace:  # the generator, as docs/methodology.md describes it
        return multi_turn(
            sessions=80, turns=(2, 2), shared_system=False, system_tokens=(0, 0), seed=seed
        )

    rate = {
        (seed, row): 100 * replay(two_turn(seed), model, row, cfg)["token_hit_rate"]
        for seed in (100, 101)
        for row in ("mambaradix", "marconi")
    }
    diffs = [rate[(s, "marconi")] - rate[(s, "mambaradix")] for s in (100, 101)]
    mean = {row: (rate[(100, row)] + rate[(101, row)]) / 2 for row in ("mambaradix", "marconi")}
    assert out[0] == "synthetic-two-turn, sequential, seeds 100-101; paired vs mambaradix"
    assert out[1] == (
        f"2 GB: mambaradix {mean['mambaradix']:.1f}%; marconi {mean['marconi']:.1f}% "
        f"({statistics.fmean(diffs):+.1f}, sd {abs(diffs[0] - diffs[1]) / 2**0.5:.1f})"
    )
