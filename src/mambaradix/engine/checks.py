"""Argument checks at the entry of `Engine.__init__` and `Engine.generate`:
TypeError / ValueError naming the parameter, raised before anything is built
or run (so a failed call leaves the engine as it was)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from mambaradix.core.compat import resolve_compat
from mambaradix.engine.device import check_dtype
from mambaradix.lifecycle.manager import rules_release
from mambaradix.lifecycle.strategy import PAGE_RULE, check_strategy, takes_page
from mambaradix.lifecycle.tier_write import WritePolicy, as_write_policy
from mambaradix.policies import (
    ORACLE,
    POLICIES,
    Policy,
    is_known,
    make_policy,
    own_memory,
    retired_reason,
)
from mambaradix.policies import own_page as own_tree_page
from mambaradix.scheduler import (
    admission_need,
    fits_alone,
    kv_needed_alone,
    slots_alone,
)
from mambaradix.tiers.cost import LoadRule
from mambaradix.validate import (
    HOST_BYTES_PER_ID,
    as_bool,
    as_count,
    as_int,
    as_positive,
    as_token_ids,
    as_type,
    available_bytes,
    check_page_multiple,
    suggest,
)

if TYPE_CHECKING:
    from mambaradix.engine.engine import Engine

__all__ = [
    "check_engine_args",
    "check_generate_args",
    "check_net_type",
    "check_policy",
    "check_host_tier",
    "check_store_tier",
    "kv_need",
    "memory_shortfall",
    "min_state_slots",
]

TRACK_SLOTS = 2  # extra_buffer's ping-pong (CacheManager's default)


def min_state_slots(prefix_cache: bool, strategy: str = "no_buffer") -> int:
    """Slots one sequence holds alone: its running state, extra_buffer's two
    track slots and, with the cache on, the cached state it matched (locked
    while its copy is made)."""
    return slots_alone(TRACK_SLOTS if strategy == "extra_buffer" else 0, reuses=prefix_cache)


def check_host_tier(prefix_cache: bool, state_slots: Any, kv_tokens: Any) -> bool:
    """Whether the engine has a host tier: `host_state_slots` and `host_kv_tokens` both 0
    (none) or both > 0 with the cache on (ValueError naming the parameter otherwise)."""
    slots, tokens = as_count(state_slots, "host_state_slots"), as_count(kv_tokens, "host_kv_tokens")
    if not slots and not tokens:
        return False
    for name, value in (("host_state_slots", slots), ("host_kv_tokens", tokens)):
        if not value:
            raise ValueError(f"{name} must be > 0 when the other host pool is (got 0)")
    if not prefix_cache:
        raise ValueError("host_state_slots / host_kv_tokens need prefix_cache=True")
    return True


def check_tier_rules(host_tier: bool, tier_write: Any, tier_cost: Any) -> WritePolicy:
    """`tier_write` as a WritePolicy and `tier_cost` None or a `LoadRule`, either one
    other than its default only with a host tier (TypeError / ValueError naming it)."""
    write = as_write_policy(tier_write, "tier_write")
    if tier_cost is not None and not isinstance(tier_cost, LoadRule):
        raise TypeError(f"tier_cost must be None or a tiers.cost.LoadRule, got {tier_cost!r}")
    if not host_tier and (write is not WritePolicy.WRITE_BACK or tier_cost is not None):
        name = "tier_cost" if tier_cost is not None else "tier_write"
        raise ValueError(f"{name} needs a host tier (host_state_slots, host_kv_tokens)")
    return write


def check_prefetch(store_dir: Any, wait_s: Any) -> None:
    """`prefetch_wait_s`: None, or seconds >= 0 with a store (ValueError naming it)."""
    if wait_s is None:
        return
    ok = isinstance(wait_s, (int, float)) and not isinstance(wait_s, bool) and wait_s >= 0
    if not ok or wait_s != wait_s or wait_s == float("inf"):
        raise ValueError(f"prefetch_wait_s must be None or seconds >= 0, got {wait_s!r}")
    if store_dir is None:
        raise ValueError("prefetch_wait_s needs a store (store_dir, store_gb)")


def check_store_tier(host_tier: bool, store_dir: Any, store_gb: Any) -> int:
    """The store's capacity in bytes (0: no store): `store_dir` a path and `store_gb` > 0
    together, below a host tier (TypeError / ValueError naming the parameter otherwise)."""
    if isinstance(store_gb, bool) or not isinstance(store_gb, (int, float)) or store_gb < 0:
        raise ValueError(f"store_gb must be a number >= 0, got {store_gb!r}")
    if store_dir is None:
        if store_gb:
            raise ValueError("store_gb needs store_dir (the store's directory)")
        return 0
    if not isinstance(store_dir, (str, os.PathLike)):
        raise TypeError(f"store_dir must be a path, got {type(store_dir).__name__}")
    if not store_gb:
        raise ValueError("store_dir needs store_gb > 0 (the store's capacity)")
    if not host_tier:
        raise ValueError("store_dir needs a host tier (host_state_slots, host_kv_tokens)")
    return int(store_gb * 1e9)


def check_engine_args(**kw: Any) -> torch.dtype:
    """The constructor's arguments (by their names), in signature order; the dtype
    checked (`check_dtype`), for the config to keep."""
    if not isinstance(kw["model"], (str, os.PathLike)):
        raise TypeError(f"model must be a preset name or a path, got {type(kw['model']).__name__}")
    if as_count(kw["seed"], "seed") >= 2**64:
        raise ValueError(f"seed must be < 2**64 (torch.manual_seed's range), got {kw['seed']}")
    cache_on = as_bool(kw["prefix_cache"], "prefix_cache")
    page = as_positive(kw["page_size"], "page_size")
    strategy = _strategy(kw["strategy"], page)
    least = min_state_slots(cache_on, strategy)
    if as_int(kw["state_slots"], "state_slots") < least:
        raise ValueError(
            f"state_slots must be >= {least} with prefix_cache={cache_on} and {strategy} "
            f"(got {kw['state_slots']}): a running sequence holds a slot"
            + (", two track slots" if strategy == "extra_buffer" else "")
            + (" and, with the cache on, locks the cached state it matched" if cache_on else "")
        )
    for name in ("kv_tokens", "chunk_size", "track_interval"):
        check_page_multiple(as_positive(kw[name], name), name, page)
    as_positive(kw["max_running"], "max_running")
    if kw["max_context"] is not None:
        as_positive(kw["max_context"], "max_context")
    compat = resolve_compat(kw["compat"])  # ValueError naming the choices
    dtype = check_dtype(kw["dtype"])
    if kw["model_overrides"] is not None:
        as_type(kw["model_overrides"], dict, "model_overrides")
    for name in ("batch_decode", "deterministic", "keep_logits"):
        as_bool(kw[name], name)
    _check_plugins(kw, compat)
    if kw["deterministic"] and strategy != "no_buffer":
        raise ValueError("deterministic=True needs strategy='no_buffer'")
    return dtype


def check_policy(policy: object, compat: object, strategy: object) -> tuple[Policy | None, str]:
    """The engine's `policy` (None: the default, which the tree's compat picks) and
    the strategy it runs: a registered name (`mambaradix.policies.make_policy`) or a
    `Policy`, never one that lays out its own memory or page (vLLM's block pool: the
    engine runs every policy on its own pools). TypeError / ValueError naming
    `policy`, `strategy` or `compat` otherwise."""
    if policy is None:
        return None, "no_buffer" if strategy is None else check_strategy(strategy)
    built = _policy_instance(policy)
    if own_memory(built) or own_tree_page(built):
        raise ValueError(
            f"policy {built.name!r} lays out its own memory (vLLM's block pool): the engine "
            "runs policies on its own KV and state pools; choose another policy"
        )
    if strategy is not None and check_strategy(strategy) != built.strategy:
        raise ValueError(
            f"strategy {strategy!r} differs from policy {built.name!r}'s {built.strategy!r}: "
            "leave strategy unset or name a policy of that strategy"
        )
    release = resolve_compat(compat)  # ValueError naming compat and its choices
    if release is not None and built.compat is not None and release != built.compat:
        raise ValueError(
            f"compat {compat!r} differs from policy {built.name!r}'s tree {built.compat!r}: "
            "leave compat unset or name the policy of that release"
        )
    return built, built.strategy


def engine_policies() -> list[str]:
    """The registered policies the engine runs (not those with their own memory)."""
    return [
        name
        for name in POLICIES
        if name != ORACLE
        and not own_memory(built := make_policy(name))
        and not own_tree_page(built)
    ]


def _policy_instance(policy: object) -> Policy:
    if isinstance(policy, str):
        if (retired := retired_reason([policy])) is not None:
            raise ValueError(retired)
        if policy == ORACLE or not is_known(policy):
            runs = engine_policies()
            raise ValueError(
                f"policy {policy!r} is not a policy the engine runs; choose from "
                f"{', '.join(runs)}{suggest(policy, runs)}"
            )
        return make_policy(policy)
    if not isinstance(policy, Policy):
        raise TypeError(
            f"policy must be None, a policy name or a mambaradix.policies.Policy, "
            f"got {type(policy).__name__}"
        )
    return policy


def _check_plugins(kw: dict[str, Any], compat: str | None) -> None:
    """What is handed in as an object: TypeError now, not in the middle of a run."""
    rules_release(compat, kw["sglang_rules"])  # the lifecycle's rule
    check_net_type(kw["net"])


def check_net_type(net: object) -> None:
    """`net`: None or a torch module (TypeError naming it)."""
    if net is not None and not isinstance(net, torch.nn.Module):
        raise TypeError(f"net must be None or a torch.nn.Module, got {type(net).__name__}")


def _strategy(strategy: object, page: int) -> str:
    checked = check_strategy(strategy)
    if not takes_page(checked, page):
        raise ValueError(f"page_size {page} needs strategy='extra_buffer': {PAGE_RULE}")
    return checked


def kv_need(prompt: int, max_new: int, page: int, what: str = "prompt") -> tuple[int, str]:
    """The least KV pool a request fits alone in (`scheduler.kv_needed_alone`)
    and the rule that sets it, in words (`what` names the prompt's tokens)."""
    need = kv_needed_alone(prompt, max_new, page)
    if need > admission_need(prompt, max_new, page) + page:  # admission clips max_new
        return need, f"{prompt:,} {what} + {max_new:,} new - 1, held at the end, in pages of {page}"
    return need, f"{prompt:,} {what} + {max_new:,} new + a page of {page}, strictly below the pool"


def check_generate_args(eng: Engine, prompts: object, max_new_tokens: object) -> list[list[int]]:
    """The prompts as lists of ints, each checked against the vocabulary and
    against the pools: a prompt must be admissible alone, with its new tokens
    (the scheduler's admission rule, `scheduler.fits_alone`)."""
    max_new = as_count(max_new_tokens, "max_new_tokens")
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
    out = [as_token_ids(p, f"prompts[{i}]", eng.vocab_size) for i, p in enumerate(prompts)]
    if max_new == 0:
        return out
    kv, page = eng.mgr.kv.capacity, eng.mgr.page_size
    context = eng.max_context  # positions a sequence may store (its last token is not)
    for i, p in enumerate(out):
        if not fits_alone(len(p), max_new, page, kv):
            need, why = kv_need(len(p), max_new, page)
            raise ValueError(
                f"prompts[{i}] needs a KV pool of {need:,} tokens ({why}) but kv_tokens is {kv:,}"
            )
        if context is not None and len(p) + max_new - 1 > context:
            raise ValueError(
                f"prompts[{i}] needs {len(p) + max_new - 1:,} positions ({len(p):,} prompt + "
                f"{max_new} new - 1) but max_context is {context:,}"
            )
    return out


def memory_shortfall(
    net: Any, kv_tokens: int, state_slots: int, rows: int, positions: int
) -> str | None:
    """None if the engine's pools fit where they go, else 'need about X GB of
    ... and only Y GB is ...'. The K/V and state tensors go to the model's
    device; the free lists (every KV index, slot and row) and the request
    table (`rows` x `positions` int64) to this machine, which must keep half
    its available memory free. Only a probe of one token and one slot is made."""
    from mambaradix.engine.adapter import PoolAdapter

    probe = PoolAdapter(net, kv_tokens=1, state_slots=1)  # one token, one slot
    device = probe.device
    per_token = 2 * probe.k.element_size() * probe.k.numel()
    per_slot = probe.geometry.bytes_per_slot
    per_row = 8 * positions + HOST_BYTES_PER_ID
    tensors = kv_tokens * per_token + state_slots * per_slot
    host = HOST_BYTES_PER_ID * (kv_tokens + state_slots) + rows * per_row
    if device.type == "cpu":
        per_token, per_slot = per_token + HOST_BYTES_PER_ID, per_slot + HOST_BYTES_PER_ID
        host, tensors = host + tensors, 0
    units = f"{per_token:,} B per KV token, {per_slot:,} B per slot, {per_row:,} B per row"
    have = available_bytes()
    if have is not None and host > have // 2:
        gb = f"{host / 1e9:.1f} GB of this machine's memory ({units}; half stays free)"
        return f"need about {gb} and only {have / 1e9:.1f} GB is available"
    if device.type != "cuda":  # torch reports free memory only for CUDA devices
        return None
    free = torch.cuda.mem_get_info(device)[0]
    if tensors > free:
        gb = f"{tensors / 1e9:.1f} GB of {device}'s memory ({units})"
        return f"need about {gb} and only {free / 1e9:.1f} GB is free"
    return None
