#!/usr/bin/env bash
# Creates .venv with the project, its extras and the test tools, and fetches the
# SGLang 0.5.15.post1 wheel that the differential tests and benchmarks read.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# pyproject.toml holds ranges; constraints.txt the exact versions the tests run with
# (scripts/lock.py writes it). Its torch==2.13.0 takes the local CPU build on these machines.
.venv/bin/python -m pip install -q -c constraints.txt -e ".[dev,torch,text,replay,engine,events,dask]"
mkdir -p .cache/sglang
if ! ls .cache/sglang/sglang-0.5.15.post1-*.whl >/dev/null 2>&1; then
    .venv/bin/python -m pip download -q sglang==0.5.15.post1 --no-deps -d .cache/sglang
fi
