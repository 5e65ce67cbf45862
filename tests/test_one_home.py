"""One home per rule and declared seams, checked by reading the source (issue 20): a rule
written twice drifts, and a `getattr` probe for a capability hides a seam the type checker
cannot see. Each check names the duplicates it guards against."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "mambaradix"
STRATEGY_HOME = SRC / "lifecycle" / "strategy.py"


def lines(exclude: Path | None = None) -> list[tuple[Path, int, str]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        if path == exclude:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            out.append((path, i, line))
    return out


def where(found: list[tuple[Path, int, str]]) -> list[str]:
    return [f"{p.relative_to(SRC)}:{i}: {line.strip()}" for p, i, line in found]


def test_the_page_rule_of_no_buffer_lives_in_lifecycle_strategy() -> None:
    """'no_buffer needs page size 1' was written in 6 places; now each asks `takes_page`."""
    compare = re.compile(r"(==|!=|>|<)")
    both = re.compile(r"no_buffer.*page|page.*no_buffer|NO_BUFFER.*page|page.*NO_BUFFER")
    found = [
        (p, i, s)
        for p, i, s in lines(STRATEGY_HOME)
        if both.search(s) and compare.search(s) and not s.lstrip().startswith(("#", '"'))
    ]
    assert found == [], where(found)


def test_the_strategy_names_are_declared_once() -> None:
    found = [(p, i, s) for p, i, s in lines(STRATEGY_HOME) if re.match(r"\s*STRATEGIES\s*=", s)]
    assert found == [], where(found)


def test_the_scheduler_hooks_are_called_not_probed() -> None:
    """`before_match`, `on_abort` (CheckpointPolicy) and `pass_steps` (Forward) are declared."""
    probe = re.compile(r"getattr\([^)]*[\"'](before_match|on_abort|pass_steps)[\"']")
    found = [(p, i, s) for p, i, s in lines() if probe.search(s)]
    assert found == [], where(found)


def test_the_checks_can_fail() -> None:
    """The patterns above match the code they replaced."""
    old = [
        'if strategy == "no_buffer" and page != 1:',
        'hook = getattr(self.checkpoints, "before_match", None)',
    ]
    assert re.search(r"no_buffer.*page", old[0]) and re.search(r"(==|!=)", old[0])
    assert re.search(r"getattr\([^)]*[\"'](before_match|on_abort|pass_steps)[\"']", old[1])
