#!/usr/bin/env bash
# The claim "Python >= 3.10", tested: .venv-py310 from a Python 3.10 (pyenv's, or $PYTHON310)
# with the ranges of pyproject.toml and no constraints file (pip picks what 3.10 runs), then
# the default tier there. The torch and engine extras are left out: the CPU build of torch
# on these machines is for 3.11 only, and their tests skip without them. scripts/test.sh runs
# it with MAMBARADIX_PURE=1: the suite on the pure-Python core (docs/build.md).
#   scripts/test-py310.sh [PYTEST ARGS]             install, then the tests
#   scripts/test-py310.sh --install-only            install only (CI runs it beside other steps)
#   scripts/test-py310.sh --installed [PYTEST ARGS] the tests of an installed .venv-py310
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON310:-$(ls -d /root/.pyenv/versions/3.10.*/bin/python 2>/dev/null | tail -1 || true)}
if [ -z "$PY" ] || [ ! -x "$PY" ]; then
    echo "test-py310: no Python 3.10 found (set PYTHON310); skipped" >&2
    exit 0
fi
if [ "${1:-}" = "--installed" ]; then
    shift
else
    if [ ! -x .venv-py310/bin/python ]; then
        "$PY" -m venv .venv-py310
    fi
    .venv-py310/bin/python -m pip install -q --upgrade pip >/dev/null
    .venv-py310/bin/python -m pip install -q -e ".[dev,text,replay,events,dask,redis]"
    [ "${1:-}" = "--install-only" ] && exit 0
fi
.venv-py310/bin/python -c 'import sys; assert sys.version_info[:2] == (3, 10), sys.version'
.venv-py310/bin/python -m pytest "$@"
