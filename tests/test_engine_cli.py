"""`mambaradix engine`: the real-text multi-turn comparison, cache on vs off."""

from __future__ import annotations

import pytest


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
