#!/usr/bin/env bash
# Full test suite: set-up, lint, types, the default tier (compiled core), Python 3.10 (the
# pure-Python core), the slow tier (compiled core).
set -euo pipefail
cd "$(dirname "$0")/.."
# step CMD...: runs it and says how long it took (docs/using.md: where CI's time goes)
step() { local start=$SECONDS; "$@"; echo "test.sh: $((SECONDS - start)) s: $*" >&2; }
# beside LOG CMD...: runs it in the background, its output to LOG, shown by `joined` (which
# fails if it failed).
sides=()
logs=()
beside() { local log=$1; shift; "$@" >"$log" 2>&1 & sides+=($!); logs+=("$log"); }
joined() {
    local i status=0
    for i in "${!sides[@]}"; do
        wait "${sides[$i]}" || status=$?
        cat "${logs[$i]}"
    done
    sides=()
    logs=()
    [ "$status" -eq 0 ] || { echo "test.sh: a step run beside failed (exit $status)" >&2; exit "$status"; }
}
# quiet CMD...: runs it, its output shown only if it fails
quiet() { local out; out=$("$@" 2>&1) || { echo "$out"; return 1; }; }
side_dir=$(mktemp -d)
trap 'kill "${sides[@]}" 2>/dev/null || true; rm -rf "$side_dir"' EXIT

# Bytecode is written (some machines set PYTHONDONTWRITEBYTECODE): without it every pytest
# process rewrites the asserts of every test module again, 6-8 s of each worker's start.
unset PYTHONDONTWRITEBYTECODE
step bash scripts/setup.sh
# Installs and downloads wait on one core and the network: beside lint and types, and
# joined before the default tier (timed on idle cores), they save about a minute.
beside "$side_dir/dynamo" step bash scripts/setup-dynamo.sh   # its own venv: the interop test
beside "$side_dir/wheels" step bash scripts/fetch-event-wheels.sh --all  # for the slow tier
# 3.10 builds its compiled core too: its tests run the pure one, and test_compiled.py the
# two side by side.
beside "$side_dir/py310" step bash scripts/test-py310.sh --install-only
# pytest writes the bytecode of the tests (their asserts rewritten) once, here
beside "$side_dir/collect" step quiet .venv/bin/python -m pytest --collect-only -q
step .venv/bin/ruff check src tests bench
step .venv/bin/mypy
step .venv/bin/python scripts/lock.py --check        # constraints.txt pins what was installed
joined
# The compiled core (setup.py, docs/build.md) must have been built: tests/test_compiled.py
# fails without it here instead of skipping. Python 3.10 runs the pure core.
export MAMBARADIX_REQUIRE_COMPILED=1
step .venv/bin/python -m pytest -n 2 --durations=10 "$@"  # the default tier (<= 90 s on 2 idle cores)
step env MAMBARADIX_REQUIRE_COMPILED=0 MAMBARADIX_PURE=1 bash scripts/test-py310.sh --installed -n 2 "$@"  # 3.10, pure core
# the slow tier (engine, ZMQ, Dask, long runs) on 2 processes, its items handed out one at a
# time, the longest first (tests/conftest.py, LONGEST_FIRST)
step .venv/bin/python -m pytest -m slow -n 2 --maxschedchunk 1 --durations=20 "$@"
