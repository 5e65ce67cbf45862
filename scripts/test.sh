#!/usr/bin/env bash
# Full test suite: set-up, lint, types, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup-dynamo.sh   # Dynamo's indexer, in its own venv, for the interop test
.venv/bin/ruff check src tests bench
.venv/bin/mypy
.venv/bin/python -m pytest "$@"                 # the default tier (< 5 min on 2 cores)
bash scripts/fetch-event-wheels.sh --all        # every release's wheel, for the slow tier
.venv/bin/python -m pytest -m slow "$@"         # the slow tier: long randomized runs
