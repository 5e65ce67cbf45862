#!/usr/bin/env bash
# Full test suite: set-up, lint, types, the default tier (compiled core), Python 3.10 (the
# pure-Python core), the slow tier (compiled core).
set -euo pipefail
cd "$(dirname "$0")/.."
# step CMD...: runs it and says how long it took (docs/using.md: where CI's time goes)
step() { local start=$SECONDS; "$@"; echo "test.sh: $((SECONDS - start)) s: $*" >&2; }
step bash scripts/setup.sh
step bash scripts/setup-dynamo.sh   # Dynamo's indexer, in its own venv, for the interop test
step .venv/bin/ruff check src tests bench
step .venv/bin/mypy
step .venv/bin/python scripts/lock.py --check        # constraints.txt pins what was installed
# The compiled core (setup.py, docs/build.md) must have been built: tests/test_compiled.py
# fails without it here instead of skipping. Python 3.10 runs the pure core.
export MAMBARADIX_REQUIRE_COMPILED=1
step .venv/bin/python -m pytest -n 2 "$@"            # the default tier (<= 90 s on 2 idle cores in one process)
step env MAMBARADIX_REQUIRE_COMPILED=0 MAMBARADIX_PURE=1 bash scripts/test-py310.sh -n 2 "$@"  # 3.10, pure core
step bash scripts/fetch-event-wheels.sh --all        # every release's wheel, for the slow tier
step .venv/bin/python -m pytest -m slow -n 2 --durations=20 "$@"  # the slow tier (engine, ZMQ, Dask, long runs) on 2 processes
