"""The replay's results: one point (`ReplayResult`, from `replay`, `cluster_replay`
and each row of a sweep or a plan) and a sweep (`SweepResult`). Attribute access is
the typed way to read them; each is also the read-only mapping over its JSON keys
(`mambaradix.results`), the dict `to_json()` returns, in the order the command line
writes it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mambaradix.replay.serving import ServingConfig
from mambaradix.results import JsonResult, flat, omitted

__all__ = [
    "Bound",
    "ClusterMetrics",
    "InstanceRow",
    "ModelInfo",
    "ReplayResult",
    "ShardHeader",
    "SweepResult",
    "TierMetrics",
    "TraceInfo",
]


@dataclass(frozen=True, eq=False)
class TierMetrics(JsonResult):
    """What the lower tiers served (`replay.tiered`), over every instance."""

    host_hit_tokens: int
    store_hit_tokens: int
    host_loads: int
    store_loads: int
    loads_recomputed: int
    loads_failed: int
    loaded_bytes: int
    load_s: float
    host_peak_bytes: int
    store_peak_bytes: int
    break_even_tokens: dict[str, int | None] | None


@dataclass(frozen=True, eq=False)
class InstanceRow(JsonResult):
    """One instance of a cluster: the requests routed to it, its hit rate (over
    them, dropped ones as misses) and its busy prefill time."""

    requests: int
    token_hit_rate: float
    prefill_s: float


@dataclass(frozen=True, eq=False)
class ClusterMetrics(JsonResult):
    """A cluster replay's metrics beyond `replay()`'s (`replay.cluster`)."""

    instances: int
    router: str
    router_lag_s: float
    router_block_tokens: int
    overlap_weight: float
    credited_tokens: int
    mispredicted_tokens: int
    undercredited_tokens: int
    load_imbalance: float
    per_instance: list[InstanceRow]


@dataclass(frozen=True, eq=False)
class ReplayResult(JsonResult):
    """The metrics of one (policy, memory) point. Hit rates are over every request of
    the trace (a dropped one counts as a miss, its prompt in the denominator); TTFTs
    over the served ones (None if none was). The optional fields are absent from the
    JSON while None: `tiers` (a host or store tier configured), `replay_s` and
    `requests_per_s` (a timed run), `alpha` (Marconi's), `request_hits` (asked for),
    `oracle_grid` (`marconi-oracle`), `cluster` (a cluster replay), `state_fraction` and
    `share_of_bound` (a sweep's row)."""

    policy: str
    memory_gb: float
    requests: int
    served: int
    dropped: int
    dropped_requests: list[int]
    prompt_tokens: int
    dropped_prompt_tokens: int
    cached_tokens: int
    token_hit_rate: float
    request_hit_rate: float
    kv_hit_tokens: int
    flops_saved: float
    ttft_mean_s: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    retractions: int
    kv_tokens_evicted: int
    states_evicted: int
    peak_kv_tokens: int
    kv_capacity_tokens: int
    peak_states: int
    state_capacity: int
    config: ServingConfig
    tiers: TierMetrics | None = flat()
    replay_s: float | None = omitted()
    requests_per_s: float | None = omitted()
    alpha: float | None = omitted()
    request_hits: list[int] | None = omitted()
    oracle_grid: dict[str, float] | None = omitted()
    cluster: ClusterMetrics | None = flat()
    state_fraction: float | None = omitted()
    share_of_bound: float | None = omitted()


@dataclass(frozen=True, eq=False)
class TraceInfo(JsonResult):
    name: str
    requests: int
    prompt_tokens: int
    unit_tokens: int
    source: str | None


@dataclass(frozen=True, eq=False)
class ModelInfo(JsonResult):
    """The model's sizes; with a state dtype chosen on the command line, that dtype
    and whether it changes the outputs."""

    name: str
    kv_bytes_per_token: int
    state_bytes: int
    state_dtype: str | None = omitted()
    changes_outputs: bool | None = omitted()


@dataclass(frozen=True, eq=False)
class Bound(JsonResult):
    """The token hit rate with unlimited memory and a state everywhere."""

    token_hit_rate: float


@dataclass(frozen=True, eq=False)
class ShardHeader(JsonResult):
    """What a shard's JSON carries for `shards.merge` (`replay.shards`)."""

    mambaradix_version: str
    trace_hash: str
    sweep_hash: str
    shard: dict[str, int]
    cells: list[list[Any]]


@dataclass(frozen=True, eq=False)
class SweepResult(JsonResult):
    """A sweep: the trace, the model, the bound and one `ReplayResult` per cell, in
    the cells' order. `header`: a shard's (`--shard`); `policies_left_out` and
    `elapsed_s`: set by the command line."""

    trace: TraceInfo
    model: ModelInfo
    bound: Bound
    results: list[ReplayResult]
    header: ShardHeader | None = flat()
    policies_left_out: dict[str, str] | None = omitted()
    elapsed_s: float | None = omitted()
