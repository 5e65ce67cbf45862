#!/usr/bin/env bash
# Downloads the vLLM and SGLang wheels whose event modules the event tests load
# (tests/upstream_kv_events.py) into .cache/vllm and .cache/sglang, skipping those there.
#   scripts/fetch-event-wheels.sh        the default tier's: vLLM 0.33.0, SGLang 0.5.23 and
#                                        0.5.15.post1 (about 390 MB)
#   scripts/fetch-event-wheels.sh --all  every release in events/releases.py (`pytest -m
#                                        slow`; about 3.9 GB, vLLM wheels are ~300 MB each)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if [ "${1:-}" = "--all" ]; then
    names=$(PYTHONPATH=src "$PY" -c \
        'from mambaradix.events.releases import RELEASES; print(*RELEASES)')
else
    names="vllm-0.33.0 sglang-0.5.23 sglang-0.5.15.post1"
fi
for name in $names; do
    engine=${name%%-*}
    version=${name#*-}
    mkdir -p ".cache/$engine"
    if ! ls ".cache/$engine/$engine-$version-"*.whl >/dev/null 2>&1; then
        "$PY" -m pip download -q "$engine==$version" --no-deps -d ".cache/$engine"
    fi
done
