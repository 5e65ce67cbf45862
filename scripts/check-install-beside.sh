#!/usr/bin/env bash
# The package beside vLLM 0.33.0 and SGLang 0.5.23: pip's resolver, dry-run, with PyPI's
# metadata (tests/test_install_beside.py; 5-15 minutes, so in neither test tier).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -m pytest -m resolver tests/test_install_beside.py "$@"
