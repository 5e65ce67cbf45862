"""Argument checks of the replay's entry points (`ServingConfig`, `replay`,
`sweep`): TypeError / ValueError naming the parameter, raised before any work."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from mambaradix.lifecycle.strategy import PAGE_RULE, takes_page
from mambaradix.lifecycle.tier_write import as_write_policy
from mambaradix.validate import as_bool, as_positive, as_real, as_type, check_page_multiple

if TYPE_CHECKING:
    from mambaradix.geometry.profile import ModelProfile
    from mambaradix.policies import Policy
    from mambaradix.replay.serving import ServingConfig
    from mambaradix.replay.trace import Trace


def check_serving_config(cfg: ServingConfig) -> None:
    """The first field out of its range, by name."""
    as_real(cfg.memory_gb, "memory_gb", low=0, low_open=True)
    as_real(cfg.state_fraction, "state_fraction", low=0, high=1, low_open=True, high_open=True)
    as_real(cfg.prefill_flops_per_s, "prefill_flops_per_s", low=0, low_open=True)
    as_real(cfg.tpot_s, "tpot_s", low=0)
    for name in ("chunk_tokens", "max_running", "page_size", "track_interval"):
        as_positive(getattr(cfg, name), name)
    if cfg.rate is not None:
        as_real(cfg.rate, "rate", low=0, low_open=True)
    as_bool(cfg.sequential, "sequential")
    as_bool(cfg.open_loop, "open_loop")
    check_page_multiple(
        cfg.track_interval, "track_interval", cfg.page_size, why=", as SGLang requires"
    )
    if (cfg.kv_units is None) != (cfg.state_slots is None):
        raise ValueError("kv_units and state_slots: give both (exact pool sizes) or neither")
    if cfg.kv_units is not None:
        as_positive(cfg.kv_units, "kv_units")
        as_positive(cfg.state_slots, "state_slots")
    for name in ("host_gb", "store_gb", "host_latency_us", "store_latency_us"):
        as_real(getattr(cfg, name), name, low=0)
    for name in ("host_gbps", "store_gbps"):
        as_real(getattr(cfg, name), name, low=0, low_open=True)
    if cfg.tier_write is not None:  # None: each row's own (`TierRules.write`)
        as_write_policy(cfg.tier_write, "tier_write")


def check_inputs(trace: Trace, profile: ModelProfile, cfg: ServingConfig) -> None:
    """Types of a replay's three inputs, and a trace with requests."""
    from mambaradix.geometry.profile import ModelProfile
    from mambaradix.replay.serving import ServingConfig
    from mambaradix.replay.trace import Trace

    as_type(trace, Trace, "trace")
    as_type(profile, ModelProfile, "profile")
    as_type(cfg, ServingConfig, "cfg")
    if not trace.requests:
        raise ValueError(f"trace {trace.name!r} has no requests")


def check_policies(policies: object, name: str = "policies") -> list[str]:
    """A non-empty list of known policy names (`policies.is_known`: the
    POLICIES, our ablations, `marconi@ALPHA`), without repeats."""
    from mambaradix.policies import POLICIES, is_known, retired_reason

    names = _str_list(policies, name)
    if (why := retired_reason(names)) is not None:
        raise ValueError(f"{name}: {why}")
    unknown = [p for p in names if not is_known(p)]
    if unknown:
        raise ValueError(
            f"{name}: unknown policy {', '.join(unknown)}; choose from {', '.join(POLICIES)}"
        )
    return names


def policy_strategy(policy: str) -> str:
    """The lifecycle strategy a known policy runs (`no_buffer`, `extra_buffer`)."""
    return str(_instance(policy).strategy)


def policy_state_bytes(policy: str, profile: ModelProfile) -> int:
    """Bytes of one state slot as a known policy's upstream holds it (vLLM pads
    a state to its page)."""
    return _instance(policy).state_bytes(profile)


def policy_shared_budget(policy: str, tiered: bool = False) -> bool:
    """Whether a known policy draws KV and states on one byte budget in the serving
    discipline, with (`tiered`) or without a lower tier (`Policy.one_budget`: ours, on a
    device alone)."""
    return _instance(policy).one_budget(tiered)


def policy_own_memory(policy: str) -> bool:
    """Whether a known policy's upstream lays out its own memory (vLLM's one block pool,
    `Policy.build_memory`) rather than the replay's pools."""
    from mambaradix.policies.base import own_memory

    return own_memory(_instance(policy))


def _instance(policy: str) -> Policy:
    from mambaradix.policies import ORACLE, make_policy

    return make_policy("marconi" if policy == ORACLE else policy)


def unpaged_policies(policies: list[str], trace: Trace, cfg: ServingConfig) -> list[str]:
    """The policies that cannot run at `cfg.page_size` on this trace: no_buffer
    keeps states at exact unit ends, so it needs a page of one unit (any page
    that divides a block trace's blocks is one unit). ValueError (naming
    page_size) when the page cannot be used at all here."""
    from mambaradix.replay.serving import page_units

    page = page_units(cfg.page_size, trace.unit_tokens)
    if page > 1 and cfg.sequential:
        raise ValueError(
            f"page_size {cfg.page_size} needs the split pools: sequential (Marconi's shared "
            "byte budget) allocates KV one token at a time"
        )
    return [
        p for p in policies if not takes_page(policy_strategy(p), page) and not policy_own_page(p)
    ]


def policy_own_page(policy: str) -> bool:
    """Whether a known policy fixes the tree's page itself (vLLM's block)."""
    from mambaradix.policies.base import own_page

    return own_page(_instance(policy))


def check_instanced(policies: list[str], name: str) -> None:
    """ValueError if `policies` (checked names) hold the oracle, which runs the
    trace once per alpha and has no form over instances."""
    from mambaradix.policies import ORACLE

    if ORACLE in policies:
        raise ValueError(f"{name}: {ORACLE} (a run per alpha) is not run over instances")


def check_paged(policies: list[str], trace: Trace, cfg: ServingConfig, name: str) -> None:
    """ValueError naming the first of `policies` that cannot run at this page size."""
    left_out = unpaged_policies(policies, trace, cfg)
    if left_out:
        raise ValueError(
            f"{name}: {', '.join(left_out)} (no_buffer) needs page_size 1 on a token-level "
            f"trace, got {cfg.page_size} ({PAGE_RULE}); extra_buffer policies "
            "(sglang-extra-buffer) take any page size"
        )


def check_cluster(
    routers: object,
    cluster: object,
    trace: Trace,
    cfg: ServingConfig,
    names: tuple[str, str] = ("routers", "cluster"),
) -> list[str] | None:
    """Known routers without repeats, a `ClusterSpec`, and a router block of
    whole pages of the tree (`cluster.py`); both None for a plain sweep.
    `names`: the two parameters as the caller calls them."""
    from mambaradix.replay.cluster import ClusterSpec
    from mambaradix.replay.routers import check_router_names
    from mambaradix.replay.serving import page_units

    if routers is None and cluster is None:
        return None
    routers_name, cluster_name = names
    known = _str_list(routers, routers_name)
    check_router_names(known, routers_name)
    as_type(cluster, ClusterSpec, cluster_name)
    assert isinstance(cluster, ClusterSpec)
    block = cluster.block_tokens
    page = page_units(cfg.page_size, trace.unit_tokens) * trace.unit_tokens
    if block is not None and block % page:
        raise ValueError(
            f"{cluster_name}: block_tokens {block} must be a multiple of the tree's "
            f"{page}-token page"
        )
    return known


def check_reals(
    values: object, name: str, *, low: float, high: float | None = None, open_: bool = True
) -> list[float]:
    """A non-empty list of finite numbers in (low, high) (closed ends unless `open_`),
    without repeats."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise TypeError(f"{name} must be a non-empty list of numbers, got {values!r}")
    out = [
        as_real(v, f"{name}[{i}]", low=low, high=high, low_open=open_, high_open=open_)
        for i, v in enumerate(values)
    ]
    _no_repeats(out, name)
    return out


def check_workers(workers: object) -> int | None:
    return None if workers is None else as_positive(workers, "workers")


def _str_list(values: object, name: str) -> list[str]:
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
        raise TypeError(f"{name} must be a non-empty list of names, got {values!r}")
    for i, v in enumerate(values):
        as_type(v, str, f"{name}[{i}]")
    out = list(values)
    _no_repeats(out, name)
    return out


def _no_repeats(values: Sequence[object], name: str) -> None:
    seen = set()
    for v in values:
        if v in seen:
            raise ValueError(f"{name}: {v!r} is given twice")
        seen.add(v)
