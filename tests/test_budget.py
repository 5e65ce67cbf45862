"""The seed budgets of tests/budget.py, by hand."""

from __future__ import annotations

import importlib
import sys

import pytest


def load(profile: str | None, monkeypatch: pytest.MonkeyPatch) -> object:
    if profile is None:
        monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    else:
        monkeypatch.setenv("HYPOTHESIS_PROFILE", profile)
    monkeypatch.delitem(sys.modules, "budget", raising=False)
    return importlib.import_module("budget")


@pytest.mark.parametrize("profile", [None, "ci"])
def test_ci_runs_the_first_seeds(profile: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    budget = load(profile, monkeypatch)
    assert budget.DEEP is False  # type: ignore[attr-defined]
    assert list(budget.seeds(100, ci=2, deep=4)) == [100, 101]  # type: ignore[attr-defined]


def test_the_deep_run_runs_every_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    budget = load("deep", monkeypatch)
    assert list(budget.seeds(100, ci=2, deep=4)) == [100, 101, 102, 103]  # type: ignore[attr-defined]
