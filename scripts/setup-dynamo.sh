#!/usr/bin/env bash
# Creates .venv-dynamo with NVIDIA Dynamo's runtime (ai-dynamo-runtime 1.6.1, which ships
# `python -m dynamo.indexer`), for the interop test tests/test_dynamo_interop.py. It lives
# in its own venv because it pins pydantic<=2.13.5 and pulls uvloop: never in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv-dynamo/bin/python ]; then
    python3 -m venv .venv-dynamo
fi
.venv-dynamo/bin/python -m pip install -q --upgrade pip >/dev/null
.venv-dynamo/bin/python -m pip install -q ai-dynamo-runtime==1.6.1 pydantic==2.13.5 uvloop==0.23.0
