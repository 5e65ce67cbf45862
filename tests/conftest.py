"""Shared pytest configuration.

Hypothesis profiles, chosen with the HYPOTHESIS_PROFILE environment variable:
  ci   (default) quick: the budgets written in each test file apply
  deep long randomized runs: HYPOTHESIS_PROFILE=deep pytest tests/test_tree_stateful.py

The engine's exactness tests run on MAMBARADIX_TEST_DEVICE (tests/engine_device.py).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", deadline=None, print_blob=True)
settings.register_profile(
    "deep",
    deadline=None,
    print_blob=True,
    max_examples=2_000,
    stateful_step_count=120,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
