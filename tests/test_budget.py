"""The seed budgets of tests/budget.py, by hand."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

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


class Collected:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


def test_the_longest_items_start_first_the_rest_keep_their_order() -> None:
    import conftest

    ids = [
        "tests/test_a.py::test_one",
        "tests/test_eviction_order.py::test_default_mode_evicts_in_the_reference_order_long[1]",
        "tests/test_b.py::test_two",
        "tests/test_readme.py::test_readme_command[.venv/bin/python bench/evaluate.py]",
        "tests/test_c.py::test_three",
    ]
    items = [Collected(i) for i in ids]
    items.sort(key=conftest.start_rank)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == [ids[3], ids[1], ids[0], ids[2], ids[4]]


def test_every_longest_first_entry_names_a_test_that_exists() -> None:
    """A renamed test would silently fall back to collection order: each entry's file and
    function (or, for the README's rows, its command in docs/commands.md) must exist."""
    import conftest

    here = Path(__file__).parent
    commands = (here.parent / "docs" / "commands.md").read_text()
    for entry in conftest.LONGEST_FIRST:
        file, _, test = entry.partition("::")
        source = (here / file).read_text()
        name, _, param = test.partition("[")
        if name:
            assert f"def {name}" in source or f"class {name}" in source, entry
        if param:
            assert f"| `{param}" in commands, entry
