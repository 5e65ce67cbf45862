"""`EngineConfig`: everything an `Engine` is built from but the model object.

Frozen and checked once, when it is made (TypeError / ValueError naming the field, before
anything is built); the engine trusts it. `Engine(**fields)` makes one from its keyword
arguments; `Engine.from_config(config, net=...)` takes one made beforehand (a config can be
kept, compared, or used for several engines: each gets its own copy of a policy the config
names; a policy handed in as an instance is the one engine's). What the checks resolve (the
policy a name stands for, the strategy it runs, the model's dtype, the tiers' sizes and write
policy) is kept beside the fields, as `resolved`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import torch

from mambaradix.engine.checks import (
    check_engine_args,
    check_host_tier,
    check_policy,
    check_prefetch,
    check_store_tier,
    check_tier_rules,
)
from mambaradix.lifecycle.tier_write import WritePolicy
from mambaradix.policies import Policy
from mambaradix.tiers.cost import LoadRule

__all__ = ["EngineConfig", "Resolved"]


class Resolved(NamedTuple):
    """What the checks of a config found: the named policy (None: the compat's default),
    the strategy it runs, the model's dtype (`engine.device.check_dtype`), whether there
    is a host tier, the store's bytes and the write policy."""

    policy: Policy | None
    strategy: str
    dtype: torch.dtype
    host_tier: bool
    store_bytes: int
    write: WritePolicy


@dataclass(frozen=True)
class EngineConfig:
    """The engine's settings (each documented on `Engine`), checked when made."""

    model: str = "nemotron-h-tiny"
    seed: int = 0
    prefix_cache: bool = True
    kv_tokens: int = 65536
    state_slots: int = 64
    chunk_size: int = 256
    max_running: int = 8
    max_context: int | None = None
    dtype: torch.dtype = torch.float32
    model_overrides: dict[str, Any] | None = None
    page_size: int = 1
    strategy: str | None = None
    compat: str | None = None
    track_interval: int = 256
    policy: str | Policy | None = None
    sglang_rules: bool | str | None = None
    device: str | torch.device = "cpu"
    batch_decode: bool = True
    deterministic: bool = False
    keep_logits: bool = True
    host_state_slots: int = 0
    host_kv_tokens: int = 0
    store_dir: str | os.PathLike[str] | None = None
    store_gb: float = 0.0
    tier_write: str | WritePolicy = "back"
    tier_cost: LoadRule | None = None
    prefetch_wait_s: float | None = None
    resolved: Resolved = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        named, strategy = check_policy(self.policy, self.compat, self.strategy)
        given = {f.name: getattr(self, f.name) for f in fields(self) if f.name in _ARGS}
        dtype = check_engine_args(**{**given, "strategy": strategy, "net": None})
        host_tier = check_host_tier(self.prefix_cache, self.host_state_slots, self.host_kv_tokens)
        store_bytes = check_store_tier(host_tier, self.store_dir, self.store_gb)
        write = check_tier_rules(host_tier, self.tier_write, self.tier_cost)
        check_prefetch(self.store_dir, self.prefetch_wait_s)
        found = Resolved(named, strategy, dtype, host_tier, store_bytes, write)
        object.__setattr__(self, "resolved", found)


# the fields `check_engine_args` reads (with `net`, which is not configuration)
_ARGS = (
    "model", "seed", "prefix_cache", "kv_tokens", "state_slots", "chunk_size", "max_running",
    "max_context", "dtype", "model_overrides", "page_size", "strategy", "compat",
    "track_interval", "batch_decode", "deterministic", "keep_logits", "sglang_rules",
)  # fmt: skip
