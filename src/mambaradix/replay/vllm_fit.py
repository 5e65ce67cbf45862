"""Which requests the `vllm` row can serve at a memory point (`fit.check_memory` for a
policy with its own memory, `Policy.build_memory`: vLLM's one block pool).

The row draws KV and states from one pool of vLLM blocks (`policies.vllm_pool`). A request
runs alone when the scheduler admits it (prompt, output up to the 4,096 clip and one block
below the pool, `scheduler.budget`) and the most it holds at once fits: its KV blocks, its
running state, the state it copies from or keeps, and vLLM's second running block
(`VLLM._boundary`). Far from both limits the answer is known; near them the request is
served alone through the serving model itself, so the two cannot drift.
"""

from __future__ import annotations

import math
from dataclasses import replace

from mambaradix.geometry.profile import ModelProfile
from mambaradix.policies.vllm import VLLM
from mambaradix.replay.fit import Fit, Pools, request_units
from mambaradix.replay.serving import ServingConfig, ServingModel
from mambaradix.replay.trace import Trace, TraceRequest
from mambaradix.scheduler import admission_need

__all__ = ["blocks_of", "runs_alone", "vllm_fit", "vllm_pools"]


def budget_bytes(profile: ModelProfile, unit_tokens: int, cfg: ServingConfig) -> int:
    """The memory in bytes, as `ServingModel` sizes it (exact pools: what they take)."""
    if cfg.kv_units is not None and cfg.state_slots is not None:
        kvb = profile.kv_bytes_per_token * unit_tokens
        return cfg.kv_units * kvb + cfg.state_slots * profile.vllm_state_bytes
    return int(cfg.memory_gb * 1e9)


def blocks_of(profile: ModelProfile, unit_tokens: int, cfg: ServingConfig) -> tuple[int, int, int]:
    """(blocks, block in units, blocks per state) of the row's pool at `cfg`."""
    kvb = profile.kv_bytes_per_token * unit_tokens
    return VLLM.pool_shape(budget_bytes(profile, unit_tokens, cfg), kvb, profile, unit_tokens)


def vllm_pools(profile: ModelProfile, unit_tokens: int, cfg: ServingConfig) -> Pools:
    blocks, block, groups = blocks_of(profile, unit_tokens, cfg)
    kvb = profile.kv_bytes_per_token * unit_tokens
    budget = budget_bytes(profile, unit_tokens, cfg)
    return Pools(blocks * block, blocks // groups, budget, True, block, kvb, block * kvb * groups)


def _bounds(r: TraceRequest, blocks: int, block: int, groups: int) -> bool | None:
    """True / False when the answer is sure without a run, else None."""
    prompt, new = request_units(r)
    if blocks < 1 or admission_need(prompt, new, block) >= blocks * block:
        return False  # the scheduler never admits it (PrefillBudget: NO_TOKEN)
    if -(-(prompt + new) // block) + 4 * groups + 2 <= blocks:
        return True
    return None


_ALONE: dict[tuple[object, ...], bool] = {}  # a request alone: only its sizes matter


def _served_alone(
    r: TraceRequest, unit_tokens: int, profile: ModelProfile, cfg: ServingConfig, policy: str
) -> bool:
    from mambaradix.policies import make_policy

    sizes = (len(r.input_units), len(r.output_units), r.input_tokens, r.output_tokens)
    key = (sizes, unit_tokens, profile, cfg, policy)
    if key not in _ALONE:
        if len(_ALONE) > 4096:
            _ALONE.clear()
        model = ServingModel(Trace("alone", [r], unit_tokens), profile, make_policy(policy), cfg)
        model.run()
        _ALONE[key] = bool(model.outcomes)
    return _ALONE[key]


def runs_alone(
    r: TraceRequest, unit_tokens: int, profile: ModelProfile, cfg: ServingConfig, policy: str
) -> bool:
    """Whether the `policy` row (a `VLLM`) serves `r` alone at `cfg`."""
    blocks, block, groups = blocks_of(profile, unit_tokens, cfg)
    sure = _bounds(r, blocks, block, groups)
    if sure is not None:
        return sure
    return _served_alone(r, unit_tokens, profile, cfg, policy)


def _blocks_key(r: TraceRequest, block: int) -> int:
    prompt, new = request_units(r)
    return -(-(prompt + new) // block)


def vllm_fit(trace: Trace, profile: ModelProfile, cfg: ServingConfig, policy: str) -> Fit:
    """`fit.fit` for the `policy` row (a `VLLM`): never-fit requests, the smallest and the
    largest (in the KV units their blocks hold) and the memory that serves the largest."""
    from mambaradix.policies import make_policy

    policy_obj = make_policy(policy)
    assert isinstance(policy_obj, VLLM)
    policy_obj.check_profile(profile)
    unit = trace.unit_tokens
    pools = vllm_pools(profile, unit, cfg)
    reqs = trace.requests
    never = [i for i, r in enumerate(reqs) if not runs_alone(r, unit, profile, cfg, policy)]
    units = [_blocks_key(r, pools.page) * pools.page for r in reqs]
    small = min(range(len(units)), key=units.__getitem__)
    large = max(range(len(units)), key=units.__getitem__)
    gb = gb_needed(reqs[large], unit, profile, cfg, policy)
    return Fit(pools, never, (small, units[small]), (large, units[large]), gb)


def gb_needed(
    r: TraceRequest, unit: int, profile: ModelProfile, cfg: ServingConfig, policy: str
) -> float:
    """The least memory (GB, in steps of 0.01) at which the row serves `r` alone."""
    cfg = replace(cfg, kv_units=None, state_slots=None)
    _, block, groups = blocks_of(profile, unit, replace(cfg, memory_gb=1.0))
    block_bytes = block * profile.kv_bytes_per_token * unit
    prompt, new = request_units(r)
    lo = (admission_need(prompt, new, block) // block) + 1  # below: never admitted
    hi = -(-(prompt + new) // block) + 4 * groups + 2  # surely served
    while lo < hi:  # the fewest blocks that serve it
        mid = (lo + hi) // 2
        at = replace(cfg, memory_gb=((mid + 1) * block_bytes + 0.5) / 1e9)
        if runs_alone(r, unit, profile, at, policy):
            hi = mid
        else:
            lo = mid + 1
    gb = math.ceil((lo + 1) * block_bytes / 1e7) / 100
    while not runs_alone(r, unit, profile, replace(cfg, memory_gb=gb), policy):
        gb = round(gb + 0.01, 2)
    return gb
