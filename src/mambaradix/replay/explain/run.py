"""`explain()`: one replay, observed, and each request's gap to the bound split."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import partial

from mambaradix.geometry.profile import ModelProfile
from mambaradix.policies import ORACLE, Marconi, make_policy
from mambaradix.replay.checks import (
    check_cluster,
    check_inputs,
    check_instanced,
    check_paged,
    check_policies,
    policy_strategy,
)
from mambaradix.replay.cluster import Cluster, ClusterSpec
from mambaradix.replay.explain.attribute import categories, dropped
from mambaradix.replay.explain.ideal import Ideal, ideal
from mambaradix.replay.explain.observe import Observer, Shared
from mambaradix.replay.explain.records import Explanation, RequestGap
from mambaradix.replay.fit import check_memory
from mambaradix.replay.routers import make_router
from mambaradix.replay.run import attach_tuner, oracle_runs
from mambaradix.replay.serving import ServingConfig, ServingModel, page_units
from mambaradix.replay.sessions import previous_turns
from mambaradix.replay.trace import Trace


def explain(
    trace: Trace,
    profile: ModelProfile,
    policy: str,
    cfg: ServingConfig,
    *,
    router: str | None = None,
    spec: ClusterSpec | None = None,
    structure: Ideal | None = None,
) -> Explanation:
    """Replay `trace` through `policy` at `cfg` (as `replay()` does; with
    `router` and `spec`, over `spec.instances` instances as `cluster_replay()`
    does) and explain every request's gap to the bound (`attribute`).
    `structure`: the trace's `ideal(trace)`, if already computed. With lower
    tiers (`cfg.host_gb`, `cfg.store_gb`) their loads are hits, and what they
    held but did not serve is `tier_dropped`, `tier_kv_dropped`, `recompute_chosen`
    or `load_failed` (`attribute`).

    Checks what `replay()` checks (TypeError / ValueError naming the
    parameter, before any work); `marconi-oracle` is explained on its best run."""
    check_inputs(trace, profile, cfg)
    check_policies([policy], "policy")
    check_paged([policy], trace, cfg, "policy")
    if (router is None) != (spec is None):
        raise ValueError("router and spec: give both (several instances) or neither")
    if spec is not None and router is not None:
        check_instanced([policy], "policy")
        check_cluster([router], spec, trace, cfg, ("router", "spec"))
    check_memory(trace, profile, cfg, {policy: policy_strategy(policy)})
    if structure is None:
        structure = ideal(trace)
    elif len(structure.bound) != len(trace):
        raise ValueError(f"structure: {len(structure.bound)} requests for a trace of {len(trace)}")
    if policy != ORACLE:
        return _explain(trace, profile, policy, cfg, structure, router, spec)
    runs = [_explain(trace, profile, n, cfg, structure, None, None) for n in oracle_runs()]
    best = max(runs, key=lambda e: e.hit_tokens)  # the first of the grid among equals
    return replace(best, policy=ORACLE)


def _explain(
    trace: Trace,
    profile: ModelProfile,
    policy: str,
    cfg: ServingConfig,
    structure: Ideal,
    router: str | None,
    spec: ClusterSpec | None,
) -> Explanation:
    if spec is None or router is None:
        model = ServingModel(trace, profile, make_policy(policy), cfg)
        attach_tuner(model)
        models, run = [model], model.run
    else:
        cluster = Cluster(
            trace, profile, policy, cfg, make_router(router, spec.overlap_weight), spec
        )
        models, run = cluster.models, cluster.run
    page = page_units(cfg.page_size, trace.unit_tokens)
    reach = [c - c % page for c in structure.computable]
    shared = Shared(len(trace), len(models))
    previous = previous_turns(trace)
    observers = [Observer(m, k, shared, reach, previous) for k, m in enumerate(models)]
    run()
    alphas = [m.policy.alpha for m in models if isinstance(m.policy, Marconi)]
    return Explanation(
        policy,
        cfg,
        gaps(observers, structure, reach),
        router,
        len(models),
        alphas[0] if len(alphas) == 1 else None,
        evicted(observers, trace.unit_tokens),
        tier_stats(models),
    )


def tier_stats(models: Sequence[ServingModel]) -> dict[str, int] | None:
    """The lower tiers' counts, summed over the instances (None: no tier)."""
    stats = [m.tiered.tiers.stats for m in models if m.tiered is not None]
    if not stats:
        return None
    return {
        "host_loads": sum(s.loads["host"] for s in stats),
        "store_loads": sum(s.loads["store"] for s in stats),
        "loads_recomputed": sum(s.recomputed for s in stats),
        "loads_failed": sum(s.failed for s in stats),
        "dropped_bytes": sum(s.dropped_bytes for s in stats),
    }


def evicted(observers: Sequence[Observer], unit: int) -> dict[str, dict[str, int]]:
    """The observers' eviction counts, summed, KV in tokens."""
    out: dict[str, dict[str, int]] = {}
    for why in observers[0].evicted:
        kv = sum(o.evicted[why][0] for o in observers)
        out[why] = {"kv_tokens": kv * unit, "states": sum(o.evicted[why][1] for o in observers)}
    return out


def gaps(
    observers: Sequence[Observer], structure: Ideal, reach: list[int]
) -> tuple[RequestGap, ...]:
    """Every request's record, in trace order, from what the observers saw and
    the models' own outcomes (hits) and drops."""
    trace = observers[0].requests
    out: list[RequestGap | None] = [None] * len(trace)
    index = {id(r): i for i, r in enumerate(trace)}
    for obs in observers:
        units = obs.model.units
        for o in obs.model.outcomes:
            i, tr = o.request, trace[o.request]
            seen, hit = obs.seen[i]
            assert hit == o.cached_units, f"request {i}: the admission seen is not the last"
            cats = categories(
                structure.bound[i], reach[i], hit, seen, partial(units.hit_tokens, tr)
            )
            bound = units.hit_tokens(tr, structure.bound[i])
            record = _record(i, structure, bound, o.hit_tokens, obs.instance, cats, obs)
            out[i] = replace(
                record, host_hit_tokens=o.host_hit_tokens, store_hit_tokens=o.store_hit_tokens
            )
        for tr in obs.model.dropped:
            i = index[id(tr)]
            bound = units.hit_tokens(tr, structure.bound[i])
            out[i] = _record(i, structure, bound, 0, None, dropped(bound), obs)
    missing = [i for i, r in enumerate(out) if r is None]
    assert not missing, f"requests neither served nor dropped: {missing[:5]}"
    return tuple(r for r in out if r is not None)


def _record(
    i: int,
    structure: Ideal,
    bound: int,
    hit: int,
    instance: int | None,
    cats: dict[str, int],
    obs: Observer,
) -> RequestGap:
    tr = obs.requests[i]
    source = structure.source[i]
    return RequestGap(
        i,
        tr.session_id,
        tr.turn_id,
        tr.input_tokens,
        bound,
        hit,
        source if source >= 0 else None,
        instance,
        cats,
    )
