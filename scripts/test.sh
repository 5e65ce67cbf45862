#!/usr/bin/env bash
# Full test suite: set-up, lint, types, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests bench
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
