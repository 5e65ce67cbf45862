#!/usr/bin/env bash
# Creates .venv with the project, its extras and the test tools, and fetches the
# SGLang 0.5.15.post1 wheel that the differential tests and benchmarks read.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# torch==2.13.0 resolves to the local CPU build on these machines.
.venv/bin/python -m pip install -q -e ".[dev,torch,text,replay,engine,events,dask]"
mkdir -p .cache/sglang
if ! ls .cache/sglang/sglang-0.5.15.post1-*.whl >/dev/null 2>&1; then
    .venv/bin/python -m pip download -q sglang==0.5.15.post1 --no-deps -d .cache/sglang
fi
# the event tests' wheels (default tier; `scripts/fetch-event-wheels.sh --all` for -m slow)
bash scripts/fetch-event-wheels.sh
