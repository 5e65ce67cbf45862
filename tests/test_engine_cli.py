"""`mambaradix engine`: the real-text multi-turn comparison, cache on vs off."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # engine runs through the CLI: a real model, seconds each


def test_engine_cli_mt_bench(capsys: pytest.CaptureFixture[str]) -> None:
    from mambaradix.cli import main
    from mambaradix.compare import engine_sessions

    assert engine_sessions("mt-bench", 1024, 1)  # needs the `text` extra (setup installs it)
    args = ["engine", "--sessions", "3", "--max-new-tokens", "4", "--chunk-size", "32"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "outputs identical: yes" in out
    for label in ("prompt tokens", "prefill tokens computed", "hit rate", "time per request"):
        assert label in out


def test_engine_cli_rejects_unknown_model(capsys: pytest.CaptureFixture[str]) -> None:
    from mambaradix.cli import main

    assert main(["engine", "--model", "no-such-model"]) == 2
    assert "unknown model" in capsys.readouterr().err


@pytest.mark.parametrize("deterministic", [False, True])
def test_engine_cli_bf16(capsys: pytest.CaptureFixture[str], deterministic: bool) -> None:
    # bf16 on the CPU: with --deterministic the cache must not change the answer (exit 0);
    # without it the exit code and the hint follow what the run found.
    from mambaradix.cli import main

    args = ["engine", "--dtype", "bfloat16", "--sessions", "4", "--max-new-tokens", "8"]
    args += ["--chunk-size", "64", "--no-progress"] + (["--deterministic"] if deterministic else [])
    rc = main(args)
    out = capsys.readouterr().out
    assert "device cpu, bfloat16" + (", deterministic" if deterministic else "") in out
    identical = "outputs identical: yes" in out
    assert rc == (0 if identical else 1)
    assert identical or not deterministic
    assert ("--deterministic cuts both on one grid" in out) == (not identical)
    # the replay's prediction is given only where the replay models the run
    assert ("`mambaradix replay` predicts" in out) == (not deterministic)


def test_engine_cli_runs_a_replay_policy_as_the_replay_predicts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--policy marconi@0.5` under pool pressure: cached output == uncached output, and the
    replay's prediction for the same requests, pools and policy is the engine's hit rate."""
    import re

    from mambaradix.cli import main

    args = ["engine", "--policy", "marconi@0.5", "--sessions", "4", "--max-new-tokens", "4",
            "--chunk-size", "32", "--state-slots", "6", "--no-progress"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "outputs identical: yes" in out
    saved, predicted = re.search(r"cache: ([\d.]+)%; .* predicts ([\d.]+)%", out).groups()  # type: ignore[union-attr]
    assert saved == predicted


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--policy", "vllm"], "--policy 'vllm' lays out its own memory"),
        (["--policy", "mambaradx"], "did you mean 'mambaradix'?"),
        (["--policy", "mambaradix", "--strategy", "extra_buffer"], "--strategy 'extra_buffer'"),
    ],
)
def test_engine_cli_refuses_a_policy_it_cannot_run(
    capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    from mambaradix.cli import main

    assert main(["engine", *args]) == 2
    assert says in capsys.readouterr().err
