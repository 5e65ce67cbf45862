#!/usr/bin/env bash
# The engine on a GPU, in one go (a few minutes on an H100/H200; every step is capped):
#   1. fp32 exactness on the GPU: the engine's tests with MAMBARADIX_TEST_DEVICE=cuda
#      (cached == uncached within 1e-4, under pressure with retraction; batched decode ==
#      a plain transformers forward over the whole sequence); the tier data path on CUDA
#      (pinned host pools, side-stream copies, store round trips, bitwise; tests/test_tiers_*)
#   2. speed in bf16 on a ~250M-parameter Nemotron-H-shaped model built from a config:
#      batched vs one-sequence decode at 8 sequences, cache on vs off on 8 sessions sharing
#      a 4,096-token prompt, and the engine's step against a plain transformers forward
#   3. bf16 greedy tokens with the cache on and off, deterministic mode off and on
# Usage: bash bench/gpu_check.sh            (PYTHON=... to choose the interpreter)
# Expected output: the README's engine section ("On a GPU") shows the lines each step prints.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export PYTHONPATH=src
status=0

"$PY" - <<'EOF' || exit 2
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("gpu_check.sh: no CUDA device: this check needs a GPU")
print(torch.__version__, torch.cuda.get_device_name(), flush=True)
EOF

echo "== 1. fp32 exactness on cuda"
MAMBARADIX_TEST_DEVICE=cuda timeout 240 "$PY" -m pytest -q -p no:cacheprovider \
    tests/test_engine.py tests/test_engine_batched.py tests/test_tiers_host.py \
    tests/test_tiers_engine.py || status=1

echo "== 2. speed, bf16, nemotron-h base"
timeout 300 "$PY" bench/bench_engine_speed.py --device cuda --dtype bfloat16 --size base \
    --batch 8 --prompt 512 --new 128 --system 4096 --chunk 2048 --repeats 10 --threads 4 \
    || status=1

echo "== 3. bf16 greedy tokens, cache on vs off"
timeout 240 "$PY" bench/bench_determinism.py --device cuda --threads 4 --single \
    --models nemotron-h-tiny,qwen3-next-tiny,nemotron-h-base || status=1

exit $status
