"""Virtual time of the serving model on block traces: an arrival while the
running requests decode quiet steps (steps that generate no new block) is
served at the next token boundary, not when the quiet steps end."""

from __future__ import annotations

import math
from array import array

from mambaradix.geometry.profile import get_profile
from mambaradix.policies import make_policy
from mambaradix.replay.serving import ServingConfig, ServingModel
from mambaradix.replay.trace import Trace, TraceRequest


def test_an_arrival_during_quiet_decode_steps_waits_one_token_step_at_most() -> None:
    # Mooncake-style units (512 tokens). r0: 1000 prompt tokens, 1000 output tokens
    # (999 decode steps of 20 ms, a new block only every ~500 of them). r1 arrives at 5 s
    # with another 1000-token prompt (no shared unit, so no hit).
    r0 = TraceRequest(0, 0, 0.0, array("q", [1, 2]), array("q", [-1, -2]), 1000, 1000)
    r1 = TraceRequest(1, 0, 5.0, array("q", [3, 4]), array("q", [-3]), 1000, 10)
    cfg = ServingConfig(memory_gb=40)
    model = ServingModel(
        Trace("t", [r0, r1], 512), get_profile("nemotron-h-8b"), make_policy("mambaradix"), cfg
    )
    model.run()
    ttft = {o.request: o.ttft_s for o in model.outcomes}
    # r0 arrives to an idle accelerator: its TTFT is its prefill time p; its decode steps
    # then start at p, one token every 20 ms. r1 is seen at the first token boundary after
    # 5 s, p + ceil((5 - p) / 0.02) * 0.02, and prefills the same amount of work (p).
    p = ttft[0]
    boundary = p + math.ceil((5.0 - p) / cfg.tpot_s) * cfg.tpot_s
    assert math.isclose(ttft[1], boundary - 5.0 + p, rel_tol=0, abs_tol=1e-9)
    assert ttft[1] < p + cfg.tpot_s  # before the fix: ~15 s, the rest of the quiet steps
