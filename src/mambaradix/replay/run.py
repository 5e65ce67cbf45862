"""One replay: a trace through one policy at one memory size, with metrics."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from mambaradix.geometry.profile import ModelProfile
from mambaradix.policies import FIXED_ALPHA, ORACLE, Marconi, make_policy
from mambaradix.policies.constants import MARCONI_TUNING_WINDOW, ORACLE_ALPHAS
from mambaradix.replay.checks import check_inputs, check_paged, check_policies, policy_strategy
from mambaradix.replay.fit import check_memory
from mambaradix.replay.results import ReplayResult, TierMetrics
from mambaradix.replay.serving import ServingConfig, ServingModel
from mambaradix.replay.trace import Trace
from mambaradix.validate import as_bool


def oracle_runs() -> list[str]:
    """The runs `marconi-oracle` is made of: Marconi at each alpha of its grid."""
    return [f"{FIXED_ALPHA}{a:g}" for a in ORACLE_ALPHAS]


def oracle_pick(rates: Sequence[float]) -> int:
    """Which of `marconi-oracle`'s runs it reports, from their token hit rates in grid
    order: the highest, the first among equals."""
    return max(range(len(rates)), key=rates.__getitem__)


def oracle_result(runs: list[ReplayResult]) -> ReplayResult:
    """`marconi-oracle` from its runs: the one with the highest token hit rate
    (the first in grid order among equals), with every alpha's hit rate."""
    best = runs[oracle_pick([r.token_hit_rate for r in runs])]
    return replace(
        best,
        policy=ORACLE,
        oracle_grid={str(r.alpha): r.token_hit_rate for r in runs},
        replay_s=sum(r.replay_s or 0.0 for r in runs),
    )


def replay(
    trace: Trace,
    profile: ModelProfile,
    policy_name: str,
    cfg: ServingConfig,
    per_request: bool = False,
) -> ReplayResult:
    """Run the serving model and return the metrics of one (policy, memory)
    point. `marconi-oracle` runs Marconi once per alpha of its grid. With
    `per_request`, also `request_hits`: each request's hit tokens, in trace
    order (0 for a dropped request).

    TypeError / ValueError (naming the parameter) for inputs of the wrong type,
    an unknown policy (`policies.is_known`: ablations and `marconi@ALPHA` too),
    a page size the policy cannot run at, or a memory point at which no request
    of the trace fits (`fit.check_memory`)."""
    check_inputs(trace, profile, cfg)
    check_policies([policy_name], "policy_name")
    as_bool(per_request, "per_request")
    check_paged([policy_name], trace, cfg, "policy_name")
    check_memory(trace, profile, cfg, {policy_name: policy_strategy(policy_name)})
    return replay_checked(trace, profile, policy_name, cfg, per_request)


def replay_checked(
    trace: Trace,
    profile: ModelProfile,
    policy_name: str,
    cfg: ServingConfig,
    per_request: bool = False,
) -> ReplayResult:
    """`replay` of a point its caller has already checked as `replay` checks (`sweep`
    checks every cell before the first runs, so a cell does not check again)."""
    if policy_name == ORACLE:
        return oracle_result([_replay(trace, profile, n, cfg, per_request) for n in oracle_runs()])
    return _replay(trace, profile, policy_name, cfg, per_request)


def _replay(
    trace: Trace, profile: ModelProfile, policy_name: str, cfg: ServingConfig, per_request: bool
) -> ReplayResult:
    policy = make_policy(policy_name)
    model = ServingModel(trace, profile, policy, cfg)
    attach_tuner(model)
    start = time.perf_counter()
    model.run()
    elapsed = time.perf_counter() - start
    hits = None
    if per_request:
        hits = [0] * len(trace)
        for o in model.outcomes:
            hits[o.request] = o.hit_tokens
    return replace(
        metrics(model, policy_name, cfg),
        replay_s=elapsed,
        requests_per_s=len(trace) / elapsed if elapsed else 0.0,
        alpha=policy.alpha if isinstance(policy, Marconi) else None,
        request_hits=hits,
    )


def attach_tuner(model: ServingModel) -> None:
    """Marconi tunes its alpha by replaying the model's recent requests."""
    policy = model.policy
    if isinstance(policy, Marconi):
        policy.tuner = lambda alpha: _window_flops(model, model.profile, model.cfg, alpha)


def _window_flops(
    model: ServingModel, profile: ModelProfile, cfg: ServingConfig, alpha: float
) -> float:
    """Marconi's tuner: replay the recent requests with a fixed alpha (sequentially,
    from an empty cache of the same size) and report the FLOPs saved."""
    window = model.admitted[-MARCONI_TUNING_WINDOW:]
    sub = Trace(model.trace.name, list(window), model.trace.unit_tokens)
    one_by_one = replace(cfg, sequential=True, open_loop=True)  # the window in arrival order
    s = ServingModel(sub, profile, Marconi(alpha=alpha), one_by_one)
    s.run()
    return sum(o.flops_saved for o in s.outcomes)


def metrics(model: ServingModel, policy: str, cfg: ServingConfig) -> ReplayResult:
    """Hit rates are over every request of the trace: a dropped request (one
    that could never fit) counts as a miss, its prompt in the denominator.
    TTFTs are over the served requests (None if none was)."""
    return summarize([model], policy, cfg)


def summarize(models: Sequence[ServingModel], policy: str, cfg: ServingConfig) -> ReplayResult:
    """`metrics` of several serving models taken together (the instances of a
    multi-instance replay, each built on the same trace): counts, evictions,
    capacities and peaks add up (a peak is the sum of each model's own peak);
    rates and TTFT percentiles are over every request, dropped ones counted
    as misses (their arrival-order indices in `dropped_requests`)."""
    outs = [o for m in models for o in m.outcomes]
    dropped = [r for m in models for r in m.dropped]
    index = {id(r): i for i, r in enumerate(models[0].trace.requests)}
    dropped_prompt = sum(r.input_tokens for r in dropped)
    prompt = sum(o.input_tokens for o in outs) + dropped_prompt
    hits = sum(o.hit_tokens for o in outs)
    requests = len(outs) + len(dropped)
    ttfts = sorted(o.ttft_s for o in outs)
    unit = models[0].units.unit
    return ReplayResult(
        policy=policy,
        memory_gb=cfg.memory_gb,
        requests=requests,
        served=len(outs),
        dropped=len(dropped),
        dropped_requests=sorted(index[id(r)] for r in dropped),
        prompt_tokens=prompt,
        dropped_prompt_tokens=dropped_prompt,
        cached_tokens=hits,
        token_hit_rate=hits / max(1, prompt),
        request_hit_rate=sum(1 for o in outs if o.hit_tokens) / max(1, requests),
        kv_hit_tokens=sum(o.kv_hit_tokens for o in outs),
        flops_saved=sum(o.flops_saved for o in outs),
        ttft_mean_s=statistics.fmean(ttfts) if ttfts else None,
        ttft_p50_s=statistics.median(ttfts) if ttfts else None,
        ttft_p95_s=ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))] if ttfts else None,
        retractions=sum(o.retractions for o in outs),
        kv_tokens_evicted=sum(m.cache.evictions["kv_tokens"] for m in models) * unit,
        states_evicted=sum(m.cache.evictions["states"] for m in models),
        peak_kv_tokens=sum(m.peak_kv for m in models) * unit,
        kv_capacity_tokens=sum(m.cache.kv.capacity for m in models) * unit,
        peak_states=sum(m.peak_states for m in models),
        state_capacity=sum(m.cache.slots.capacity for m in models),
        config=cfg,
        tiers=tier_metrics(models, outs) if cfg.tiered else None,
    )


def tier_metrics(models: Sequence[ServingModel], outs: list[Any]) -> TierMetrics:
    """What the lower tiers served (`replay.tiered`), over every instance."""
    tiered = [m.tiered for m in models if m.tiered is not None]
    stats = [t.tiers.stats for t in tiered]
    return TierMetrics(
        host_hit_tokens=sum(o.host_hit_tokens for o in outs),
        store_hit_tokens=sum(o.store_hit_tokens for o in outs),
        host_loads=sum(s.loads["host"] for s in stats),
        store_loads=sum(s.loads["store"] for s in stats),
        loads_recomputed=sum(s.recomputed for s in stats),
        loads_failed=sum(s.failed for s in stats),
        loaded_bytes=sum(sum(s.loaded_bytes.values()) for s in stats),
        load_s=sum(o.load_s for o in outs),
        host_peak_bytes=sum(t.tiers.host.peak for t in tiered),
        store_peak_bytes=sum(t.tiers.store.peak for t in tiered),
        break_even_tokens=tiered[0].break_even_tokens() if tiered else None,
    )
