"""One replay: a trace through one policy at one memory size, with metrics."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, replace
from typing import Any

from mambaradix.replay.models import ModelProfile
from mambaradix.replay.policies import ORACLE, Marconi, make_policy
from mambaradix.replay.policies.constants import MARCONI_TUNING_WINDOW, ORACLE_ALPHAS
from mambaradix.replay.serving import ServingConfig, ServingModel
from mambaradix.replay.trace import Trace

FIXED_ALPHA = "marconi@"
"""`marconi@0.5`: Marconi with alpha fixed at 0.5 (no tuning): one run of the oracle."""


def oracle_runs() -> list[str]:
    """The runs `marconi-oracle` is made of: Marconi at each alpha of its grid."""
    return [f"{FIXED_ALPHA}{a:g}" for a in ORACLE_ALPHAS]


def oracle_result(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """`marconi-oracle` from its runs: the one with the highest token hit rate
    (the first in grid order among equals), with every alpha's hit rate."""
    best = max(runs, key=lambda r: r["token_hit_rate"])
    out = dict(best)
    out["policy"] = ORACLE
    out["oracle_grid"] = {str(r["alpha"]): r["token_hit_rate"] for r in runs}
    out["replay_s"] = sum(r["replay_s"] for r in runs)
    return out


def replay(
    trace: Trace,
    profile: ModelProfile,
    policy_name: str,
    cfg: ServingConfig,
    per_request: bool = False,
) -> dict[str, Any]:
    """Run the serving model and return the metrics of one (policy, memory)
    point. `marconi-oracle` runs Marconi once per alpha of its grid. With
    `per_request`, also `request_hits`: each request's hit tokens, in trace
    order (0 for a dropped request)."""
    if policy_name == ORACLE:
        runs = [replay(trace, profile, name, cfg, per_request) for name in oracle_runs()]
        return oracle_result(runs)
    if policy_name.startswith(FIXED_ALPHA):
        policy = make_policy("marconi", alpha=float(policy_name[len(FIXED_ALPHA) :]))
    else:
        policy = make_policy(policy_name)
    model = ServingModel(trace, profile, policy, cfg)
    if isinstance(policy, Marconi):
        policy.tuner = lambda alpha: _window_flops(model, profile, cfg, alpha)
    start = time.perf_counter()
    model.run()
    elapsed = time.perf_counter() - start
    out = metrics(model, policy_name, cfg)
    out["replay_s"] = elapsed
    out["requests_per_s"] = len(trace) / elapsed if elapsed else 0.0
    if isinstance(policy, Marconi):
        out["alpha"] = policy.alpha
    if per_request:
        hits = [0] * len(trace)
        for o in model.outcomes:
            hits[o.request] = o.hit_tokens
        out["request_hits"] = hits
    return out


def _window_flops(
    model: ServingModel, profile: ModelProfile, cfg: ServingConfig, alpha: float
) -> float:
    """Marconi's tuner: replay the recent requests with a fixed alpha (sequentially,
    from an empty cache of the same size) and report the FLOPs saved."""
    window = model.admitted[-MARCONI_TUNING_WINDOW:]
    sub = Trace(model.trace.name, list(window), model.trace.unit_tokens)
    s = ServingModel(sub, profile, Marconi(alpha=alpha), replace(cfg, sequential=True))
    s.run()
    return sum(o.flops_saved for o in s.outcomes)


def metrics(model: ServingModel, policy: str, cfg: ServingConfig) -> dict[str, Any]:
    """Hit rates are over every request of the trace: a dropped request (one
    that could never fit) counts as a miss."""
    outs = model.outcomes
    prompt = sum(o.input_tokens for o in outs) + sum(r.input_tokens for r in model.dropped)
    hits = sum(o.hit_tokens for o in outs)
    requests = len(outs) + len(model.dropped)
    ttfts = sorted(o.ttft_s for o in outs) or [0.0]
    ev, unit = model.cache.evictions, model.units.unit
    return {
        "policy": policy,
        "memory_gb": cfg.memory_gb,
        "requests": requests,
        "served": len(outs),
        "dropped": len(model.dropped),
        "prompt_tokens": prompt,
        "cached_tokens": hits,
        "token_hit_rate": hits / max(1, prompt),
        "request_hit_rate": sum(1 for o in outs if o.hit_tokens) / max(1, requests),
        "kv_hit_tokens": sum(o.kv_hit_tokens for o in outs),
        "flops_saved": sum(o.flops_saved for o in outs),
        "ttft_p50_s": statistics.median(ttfts),
        "ttft_p95_s": ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))],
        "retractions": sum(o.retractions for o in outs),
        "kv_tokens_evicted": ev["kv_tokens"] * unit,
        "states_evicted": ev["states"],
        "peak_kv_tokens": model.peak_kv * unit,
        "kv_capacity_tokens": model.cache.kv.capacity * unit,
        "peak_states": model.peak_states,
        "state_capacity": model.cache.slots.capacity,
        "config": asdict(cfg),
    }
