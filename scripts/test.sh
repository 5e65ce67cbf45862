#!/usr/bin/env bash
# Full test suite: set-up, lint, types, the default tier, Python 3.10, the slow tier.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup-dynamo.sh   # Dynamo's indexer, in its own venv, for the interop test
.venv/bin/ruff check src tests bench
.venv/bin/mypy
.venv/bin/python scripts/lock.py --check        # constraints.txt pins what was installed
.venv/bin/python -m pytest "$@"                 # the default tier (<= 90 s on 2 idle cores)
bash scripts/test-py310.sh "$@"                 # the default tier again on Python 3.10
bash scripts/fetch-event-wheels.sh --all        # every release's wheel, for the slow tier
.venv/bin/python -m pytest -m slow -n 2 --durations=20 "$@"  # the slow tier (engine, ZMQ, Dask, long runs) on 2 processes
