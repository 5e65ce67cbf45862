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


# The slow tier's longest items (each 9-40 s, `--durations=0`), longest first: started
# first, they never leave one worker running a long item alone at the end. Matched by the
# start of the node id; everything else keeps its collection order, after them. Only the
# order changes: scripts/test.sh hands the items out one at a time (`--maxschedchunk 1`).
LONGEST_FIRST = (
    "test_vllm_differential.py::test_interval_retention_over_10000_requests",
    "test_vllm_differential.py::test_defaults_match_vllm_over_10000_requests",
    "test_readme.py::test_readme_command[.venv/bin/python bench/evaluate.py",
    "test_explain.py::test_categories_add_up_on_bundled_traces_paged_and_instanced",
    "test_compiled.py::test_compiled_and_pure_decide_alike_long",
    "test_cluster.py::test_one_instance_reproduces",
    "test_tiers_mooncake.py::",
    "test_lifecycle_differential.py::test_lifecycle_equals_sglang_sweep",
    "test_readme.py::test_readme_command[.venv/bin/python bench/tuning_pairs.py --generator "
    "synthetic-agent --discipline serving --",  # ids stop at 90 characters
    "test_tiers_crash.py::test_killed_writer_many_times",
    "test_readme.py::test_readme_command[.venv/bin/mambaradix plan",
    "test_readme.py::test_readme_command[.venv/bin/python bench/bench_plan.py",
    "test_differential_sglang_0523.py::test_same_decisions_as_sglang_0523_long",
    "test_lifecycle_differential_sglang_0523.py::test_lifecycle_equals_sglang_0523_sweep",
    "test_explain.py::test_categories_add_up_on_bundled_traces",
    "test_evaluate_progress.py::test_every_point_serves_requests_with_every_row",
    "test_residency_stateful.py::",
    "test_tiers_stateful.py::",
    "test_tiers_redis.py::test_killed_writer_many_times",
    "test_tree_stateful.py::",
    "test_explain_tiers.py::test_categories_add_up_on_a_bundled_trace_with_tiers",
    "test_lifecycle_differential.py::test_lifecycle_equals_sglang",
    "test_eviction_order.py::",
)


def start_rank(item: pytest.Item) -> int:
    """Where `item` starts: its place in `LONGEST_FIRST`, or after all of them."""
    test_id = item.nodeid.removeprefix("tests/")
    return next(
        (i for i, start in enumerate(LONGEST_FIRST) if test_id.startswith(start)),
        len(LONGEST_FIRST),
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=start_rank)  # stable: the rest keep their order
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
