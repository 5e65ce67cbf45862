"""How many seeds a long randomized test runs: CI's budget, or the deep run's.

`HYPOTHESIS_PROFILE=deep` (tests/conftest.py) lengthens the Hypothesis runs and, through
`seeds`, the seed sweeps of the slow tier; CI runs the first seeds of each sweep, the deep
run all of them (docs/using.md, "Developing: two test tiers").
"""

from __future__ import annotations

import os

DEEP = os.environ.get("HYPOTHESIS_PROFILE", "ci") == "deep"


def seeds(first: int, ci: int, deep: int) -> range:
    """Seeds first, first + 1, ...: `ci` of them in CI, `deep` in the deep run."""
    return range(first, first + (deep if DEEP else ci))
