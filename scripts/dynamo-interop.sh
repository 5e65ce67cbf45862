#!/usr/bin/env bash
# One event stream, two indexers: NVIDIA Dynamo 1.6.1's standalone indexer and ours, run
# in a private network namespace (needs root: Dynamo binds HTTP on 0.0.0.0). Prints both
# answers for the README's over-credit example (tests/dynamo_driver.py explains it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-dynamo.sh
PY=${PYTHON:-.venv/bin/python}
unshare -n sh -c 'ip link set lo up && exec "$0" tests/dynamo_driver.py .venv-dynamo/bin/python' \
    "$PY" | "$PY" -m json.tool
