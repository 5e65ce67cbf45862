"""Where the engine's exactness tests (tests/test_engine.py, tests/test_engine_batched.py)
run: MAMBARADIX_TEST_DEVICE, default "cpu"; "cuda" on a GPU machine (bench/gpu_check.sh)."""

from __future__ import annotations

import os
from typing import Any

ENGINE_DEVICE = os.environ.get("MAMBARADIX_TEST_DEVICE", "cpu")


def engine_net(name: str, seed: int = 0) -> Any:
    """A preset on ENGINE_DEVICE in float32, 1 CPU thread (two threads on a loaded
    2-core machine spin for minutes), no TF32 on a GPU (fp32 tolerances)."""
    import torch

    from mambaradix.engine import build_model

    torch.set_num_threads(1)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return build_model(name, seed=seed).to(ENGINE_DEVICE)
