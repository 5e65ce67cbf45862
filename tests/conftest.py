"""Shared pytest configuration.

Hypothesis profiles, chosen with the HYPOTHESIS_PROFILE environment variable:
  ci   (default) quick: the budgets written in each test file apply
  deep long randomized runs: HYPOTHESIS_PROFILE=deep pytest tests/test_tree_stateful.py

The engine's exactness tests run on MAMBARADIX_TEST_DEVICE (tests/engine_device.py).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
from hypothesis import HealthCheck, settings

# Without torch (the Python 3.10 run, scripts/test-py310.sh: the CPU build on these machines
# is for 3.11), the files that import it are not collected; everything else runs.
NEEDS_TORCH = [
    "test_api_validation.py",
    "test_checkpoint_hooks.py",
    "test_differential.py",
    "test_differential_sglang_0523.py",
    "test_engine.py",
    "test_engine_batched.py",
    "test_engine_config.py",
    "test_engine_deterministic.py",
    "test_engine_policy.py",
    "test_engine_tiers.py",
    "test_engine_vs_replay.py",
    "test_lifecycle_differential.py",
    "test_lifecycle_differential_sglang_0523.py",
    "test_lifecycle_torch.py",
    "test_pools.py",
    "test_results.py",
    "test_tiers_engine.py",
    "test_tiers_host.py",
    "test_tiers_upstream.py",
    "test_upstream_harness.py",
]
# ... and in files that run without it, the tests that reach torch or transformers skip.
NEEDS_ENGINE = (
    "test_cli_validation.py::test_engine_",
    "test_geometry.py::test_engine_",
    "test_geometry.py::test_transformers_",
    "test_one_home.py::test_engine_",
    "test_readme.py::test_readme_python_blocks_run",
    "test_readme.py::test_python_blocks_run[docs/tiers-data-path.md",
)
HAS_TORCH = importlib.util.find_spec("torch") is not None
collect_ignore = [] if HAS_TORCH else NEEDS_TORCH


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if HAS_TORCH:
        return
    skip = pytest.mark.skip(reason="needs torch (the torch and engine extras)")
    for item in items:
        if any(part in item.nodeid for part in NEEDS_ENGINE):
            item.add_marker(skip)


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
