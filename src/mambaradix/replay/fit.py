"""Which requests of a trace can be served at a memory point, known before a replay runs.

The serving model (`serving.ServingModel`) sizes its pools with `replay.memory`
and admits requests with the scheduler's budget (`scheduler.budget`). A request
it cannot run even alone is dropped (and counts as a miss). Here, per pool kind:

* split (default) and exact pools: a request of P prompt units generating N
  runs alone iff `fits_alone(P, N, page, KV units)`: P + min(N, 4096) + one
  page stays below the KV pool, and its last token's page fits when N passes
  the clip. States: a request that reuses a cached state holds it, its
  running copy and extra_buffer's two track slots (`slots_alone`); a state pool
  smaller than that is refused, since such requests would be dropped.
* shared (`sequential`, Marconi's byte budget): admission wants P + min(N,
  4096) + 1 below the KV units the budget holds, and decoding alone holds
  P + N - 1 units and its running and track states. A request that misses
  either is dropped whatever the cache holds; one that meets both may still be
  dropped when the states cached by then eat the bytes it needs.

`tests/test_replay_fit.py` checks these against the serving model itself.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple

from mambaradix.geometry.profile import ModelProfile
from mambaradix.replay.memory import shared_sizes, split_sizes
from mambaradix.replay.serving import ServingConfig, page_units
from mambaradix.replay.trace import Trace, TraceRequest
from mambaradix.scheduler import admission_need, fits_alone, slots_alone

__all__ = ["Fit", "Pools", "check_memory", "fit", "gb_needed", "pools_for", "request_units"]

TRACK_SLOTS = {"no_buffer": 0, "extra_buffer": 2}  # CacheManager's ping-pong default


class Pools(NamedTuple):
    kv_units: int
    states: int
    budget_bytes: int
    shared: bool  # one byte budget for both (sequential)
    page: int  # in units
    kv_unit_bytes: int
    state_bytes: int


class Fit(NamedTuple):
    """One memory point: its pools, the requests that can never be served
    (arrival-order indices), the smallest and the largest request (index,
    the least KV pool in units it runs in), and the memory in GB that serves
    the largest."""

    pools: Pools
    never_fit: list[int]
    smallest: tuple[int, int]
    largest: tuple[int, int]
    gb_for_largest: float


def request_units(r: TraceRequest) -> tuple[int, int]:
    """(prompt units, units to generate) as the serving model submits it."""
    return len(r.input_units), max(1, len(r.output_units))


def held_units(r: TraceRequest) -> int:
    """KV units a request holds when its last token has been computed."""
    prompt, new = request_units(r)
    return prompt + new - 1


def pools_for(
    profile: ModelProfile,
    unit_tokens: int,
    cfg: ServingConfig,
    state_bytes: int | None = None,
    shared: bool = False,
) -> Pools:
    """The pool sizes `ServingModel` builds for this profile and configuration,
    for a policy whose state slot costs `state_bytes` (default: the profile's;
    `Policy.state_bytes`) and that runs on one byte budget if `shared`
    (`Policy.shared_budget`; the sequential discipline always does)."""
    page = page_units(cfg.page_size, unit_tokens)
    budget = int(cfg.memory_gb * 1e9)
    kvb, sb = profile.kv_bytes_per_token * unit_tokens, state_bytes or profile.state_bytes
    if cfg.kv_units is not None and cfg.state_slots is not None:
        return Pools(cfg.kv_units, cfg.state_slots, budget, False, page, kvb, sb)
    if cfg.sequential or shared:
        return Pools(*shared_sizes(budget, kvb, sb), budget, True, page, kvb, sb)
    kv, slots = split_sizes(budget, cfg.state_fraction, kvb, sb, page)
    return Pools(kv, slots, budget, False, page, kvb, sb)


def servable(pools: Pools, r: TraceRequest, track_slots: int) -> bool:
    """Whether a request can run alone (shared budget: whether it may)."""
    prompt, new = request_units(r)
    if not pools.shared:
        return fits_alone(prompt, new, pools.page, pools.kv_units)
    admits = admission_need(prompt, new, pools.page) < min(
        pools.kv_units, pools.budget_bytes // pools.kv_unit_bytes
    )
    states = slots_alone(track_slots, reuses=False) * pools.state_bytes
    return admits and held_units(r) * pools.kv_unit_bytes + states <= pools.budget_bytes


def _kv_units_needed(r: TraceRequest, page: int) -> int:
    """The least KV pool (whole pages) in which `r` fits alone."""
    prompt, new = request_units(r)
    least = max(admission_need(prompt, new, page) + 1, -(-held_units(r) // page) * page)
    return -(-least // page) * page


def gb_needed(
    profile: ModelProfile,
    unit_tokens: int,
    cfg: ServingConfig,
    r: TraceRequest,
    track: int,
    state_bytes: int | None = None,
    shared: bool = False,
) -> float:
    """The least memory (GB, in steps of 0.01) that serves `r` alone, at
    `cfg`'s state fraction or shared budget, with the states a request that
    reuses one holds (`track` slots: 0 no_buffer, 2 extra_buffer); `math.inf`
    when that is beyond any float."""
    cfg = replace(cfg, kv_units=None, state_slots=None)  # sized by memory, not exact
    p = pools_for(profile, unit_tokens, replace(cfg, memory_gb=1.0), state_bytes, shared)
    kv = _kv_units_needed(r, p.page) * p.kv_unit_bytes
    states = slots_alone(track) * p.state_bytes
    need: float = kv + states
    if not (cfg.sequential or shared):
        need = max(kv / (1 - cfg.state_fraction), states / cfg.state_fraction)
    if not math.isfinite(need):  # a state fraction so close to 0 or 1 that no float is enough
        return math.inf
    gb = math.ceil(need / 1e7) / 100
    for _ in range(100):  # int() truncations in the pool split can cost a unit or a state
        at = pools_for(profile, unit_tokens, replace(cfg, memory_gb=gb), state_bytes, shared)
        if _serves(at, r, track):
            break
        gb = round(gb + 0.01, 2)
    return gb


def _serves(pools: Pools, r: TraceRequest, track: int) -> bool:
    if pools.shared:
        states = slots_alone(track) * pools.state_bytes
        return servable(pools, r, track) and (
            held_units(r) * pools.kv_unit_bytes + states <= pools.budget_bytes
        )
    return servable(pools, r, track) and pools.states >= slots_alone(track)


def fit(
    trace: Trace,
    profile: ModelProfile,
    cfg: ServingConfig,
    track_slots: int = 0,
    state_bytes: int | None = None,
    shared: bool = False,
) -> Fit:
    """The `Fit` of `trace` at `cfg`'s memory point, for a policy holding
    `track_slots` (0: no_buffer, 2: extra_buffer) states of `state_bytes`
    (default: the profile's)."""
    pools = pools_for(profile, trace.unit_tokens, cfg, state_bytes, shared)
    reqs = trace.requests
    never = [i for i, r in enumerate(reqs) if not servable(pools, r, track_slots)]
    units = [_kv_units_needed(r, pools.page) for r in reqs]
    small = min(range(len(units)), key=units.__getitem__)
    large = max(range(len(units)), key=units.__getitem__)
    gb = gb_needed(
        profile, trace.unit_tokens, cfg, reqs[large], track_slots, pools.state_bytes, shared
    )
    return Fit(pools, never, (small, units[small]), (large, units[large]), gb)


def describe_pools(p: Pools, unit_tokens: int) -> str:
    unit = "KV tokens" if unit_tokens == 1 else f"KV units of {unit_tokens} tokens"
    if p.shared:
        return f"{p.kv_units:,} {unit} or {p.states:,} states (one shared budget)"
    return f"{p.kv_units:,} {unit} and {p.states:,} states"


def describe_request(trace: Trace, index: int, least: int) -> str:
    r = trace.requests[index]
    prompt, new = request_units(r)
    unit = "KV units" if trace.unit_tokens > 1 else "KV tokens"
    return (
        f"request {index} (session {r.session_id}, turn {r.turn_id}: {prompt:,} prompt + "
        f"{new:,} new) needs a pool of {least:,} {unit}"
    )


def check_memory(
    trace: Trace,
    profile: ModelProfile,
    cfg: ServingConfig,
    strategies: dict[str, str],
    name: str = "memory_gb",
) -> Fit:
    """The `Fit` at this memory point (for the policy that holds the most
    states); ValueError naming `name` when, for one of the policies in
    `strategies` (policy -> strategy), the state pool is too small for a
    request that reuses a state, or not one request fits. A known policy's
    states cost what it says (`checks.policy_state_bytes`: vLLM pads them)."""
    from mambaradix.policies import is_known
    from mambaradix.replay.checks import (
        policy_own_memory,
        policy_shared_budget,
        policy_state_bytes,
    )

    fits: dict[tuple[int, int, bool], Fit] = {}
    keys = {}
    own: dict[str, Fit] = {}  # policies with their upstream's own memory (vLLM's block pool)
    for policy, strategy in strategies.items():
        if is_known(policy) and policy_own_memory(policy):
            own[policy] = policy_fit(trace, profile, cfg, policy)
            continue
        track = TRACK_SLOTS[strategy]
        sb = policy_state_bytes(policy, profile) if is_known(policy) else profile.state_bytes
        shared = is_known(policy) and policy_shared_budget(policy, cfg.tiered)
        key = keys[policy] = (track, sb, shared)
        fits[key] = fits.get(key) or fit(trace, profile, cfg, track, sb, shared)
    # the advice is the memory that serves every request under every policy of the run
    gb = max(f.gb_for_largest for f in [*fits.values(), *own.values()])
    for policy, strategy in strategies.items():
        who = f"policy {policy} ({strategy})"
        if policy in own:
            _check_point(trace, cfg, own[policy], who, 0, name, gb)
        else:
            _check_point(trace, cfg, fits[keys[policy]], who, keys[policy][0], name, gb)
    return fits[max(fits)] if fits else next(iter(own.values()))


def policy_fit(trace: Trace, profile: ModelProfile, cfg: ServingConfig, policy: str) -> Fit:
    """`fit` for a policy whose upstream lays memory out its own way (`vllm`)."""
    from mambaradix.replay.vllm_fit import vllm_fit

    return vllm_fit(trace, profile, cfg, policy)


def _check_point(
    trace: Trace, cfg: ServingConfig, f: Fit, who: str, track: int, name: str, gb: float
) -> None:
    p, least_states = f.pools, slots_alone(track)
    states = f" and {slots_alone(track, reuses=False)} states" if p.shared else ""
    at = f"{name} {cfg.memory_gb:g} GB" if cfg.kv_units is None else "kv_units/state_slots"
    holds = f"{at} holds {describe_pools(p, trace.unit_tokens)}"
    serve = (
        f"use at least {gb:g} GB to serve every request"
        if math.isfinite(gb)
        else "no memory size serves every request"
    )
    if len(f.never_fit) == len(trace):
        raise ValueError(
            f"{holds}: no request fits{f' ({who})' if p.shared else ''}; the smallest, "
            f"{describe_request(trace, *f.smallest)}{states}; the largest, "
            f"{describe_request(trace, *f.largest)}{states}: {serve}"
        )
    if not p.shared and p.states < least_states:
        raise ValueError(
            f"{holds}: {who} needs {least_states} states for a request that reuses one; {serve}"
        )
