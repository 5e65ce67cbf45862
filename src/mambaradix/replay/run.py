"""One replay: a trace through one policy at one memory size, with metrics."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, replace
from typing import Any

from mambaradix.replay.models import ModelProfile
from mambaradix.replay.policies import Marconi, make_policy
from mambaradix.replay.sim import ServingConfig, Simulator
from mambaradix.replay.trace import Trace

TUNING_WINDOW = 1000  # requests replayed per alpha when Marconi tunes


def replay(
    trace: Trace, profile: ModelProfile, policy_name: str, cfg: ServingConfig
) -> dict[str, Any]:
    """Run the serving model and return the metrics of one (policy, memory) point."""
    policy = make_policy(policy_name)
    sim = Simulator(trace, profile, policy, cfg)
    if isinstance(policy, Marconi):
        policy.tuner = lambda alpha: _window_flops(sim, profile, cfg, alpha)
    start = time.perf_counter()
    sim.run()
    elapsed = time.perf_counter() - start
    out = metrics(sim, policy_name, cfg)
    out["replay_s"] = elapsed
    out["requests_per_s"] = len(trace) / elapsed if elapsed else 0.0
    if isinstance(policy, Marconi):
        out["alpha"] = policy.alpha
    return out


def _window_flops(sim: Simulator, profile: ModelProfile, cfg: ServingConfig, alpha: float) -> float:
    """Marconi's tuner: replay the recent requests with a fixed alpha (sequentially,
    from an empty cache of the same size) and report the FLOPs saved."""
    window = sim.admitted[-TUNING_WINDOW:]
    sub = Trace(sim.trace.name, list(window), sim.trace.unit_tokens)
    s = Simulator(sub, profile, Marconi(alpha=alpha), replace(cfg, sequential=True))
    s.run()
    return sum(o.flops_saved for o in s.outcomes)


def metrics(sim: Simulator, policy: str, cfg: ServingConfig) -> dict[str, Any]:
    outs = sim.outcomes
    prompt = sum(o.input_tokens for o in outs)
    hits = sum(o.hit_tokens for o in outs)
    ttfts = sorted(o.ttft_s for o in outs) or [0.0]
    ev = sim.mgr.evictions
    return {
        "policy": policy,
        "memory_gb": cfg.memory_gb,
        "requests": len(outs),
        "dropped": sim.dropped,
        "prompt_tokens": prompt,
        "cached_tokens": hits,
        "token_hit_rate": hits / max(1, prompt),
        "request_hit_rate": sum(1 for o in outs if o.hit_tokens) / max(1, len(outs)),
        "state_hits": sum(1 for o in outs if o.hit_tokens),
        "flops_saved": sum(o.flops_saved for o in outs),
        "ttft_p50_s": statistics.median(ttfts),
        "ttft_p95_s": ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))],
        "kv_tokens_evicted": ev["kv_tokens"] * sim.unit,
        "states_evicted": ev["states"],
        "peak_kv_tokens": sim.peak_kv * sim.unit,
        "kv_capacity_tokens": sim.mgr.kv.capacity * sim.unit,
        "peak_states": sim.peak_states,
        "state_capacity": sim.mgr.slots.capacity,
        "config": asdict(cfg),
    }
