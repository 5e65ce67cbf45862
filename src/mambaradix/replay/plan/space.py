"""The planner's search space: the settings (every axis but device memory) and, per
setting, the device-memory range worth searching, derived from the trace.

A `Setting` is a policy, a state share (the state pool's fraction of device memory;
`None` for a policy that lays out its own memory, vLLM's one block pool, for one that
draws KV and states on one byte budget, ours, or under `sequential`'s one shared
budget) and the host memory (GB of a host tier, L2, behind the device pools; 0: none).
Device memory is the axis searched within a setting
(`search.py`). `Setting.config` is the one place a setting becomes a `ServingConfig`,
`Setting.cost` the one place the tiers are weighed: device GB plus host GB times the
host's price relative to device memory (`host_cost`).

The range of a setting runs from the least memory that serves the trace's largest
request alone at that setting (`fit.gb_for_largest`: below it some request is dropped)
to the bound's footprint: the KV of every prefix the ideal bound reuses and a state at
every position where it resumes, at the setting's split, plus the least memory again
for the requests in flight.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple

from mambaradix.geometry.profile import ModelProfile
from mambaradix.replay.checks import (
    policy_own_memory,
    policy_shared_budget,
    policy_state_bytes,
    policy_strategy,
)
from mambaradix.replay.fit import TRACK_SLOTS, fit, policy_fit
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.trace import Trace

__all__ = ["Footprint", "Setting", "footprint", "least_gb", "settings", "top_gb"]


class Setting(NamedTuple):
    """Every axis but device memory."""

    policy: str
    state_fraction: float | None  # None: the policy's (or sequential's) own layout
    host_gb: float = 0.0  # the host tier (L2); 0: none

    def config(self, base: ServingConfig, memory_gb: float) -> ServingConfig:
        cfg = replace(base, memory_gb=memory_gb, host_gb=self.host_gb)
        if self.state_fraction is None:
            return cfg
        return replace(cfg, state_fraction=self.state_fraction)

    def cost(self, memory_gb: float, host_cost: float) -> float:
        """What `memory_gb` of device memory and this setting's host memory cost, in
        device GB (a host GB costs `host_cost` of a device GB)."""
        return memory_gb + host_cost * self.host_gb

    def label(self) -> str:
        host = f", host {self.host_gb:g} GB" if self.host_gb else ""
        if self.state_fraction is None:
            return f"{self.policy}{' (' + host[2:] + ')' if host else ''}"
        return f"{self.policy} (states {self.state_fraction:.0%}{host})"


def settings(
    policies: list[str],
    fractions: list[float],
    sequential: bool,
    hosts: list[float] | None = None,
) -> list[Setting]:
    """Every policy at every state share and every host memory; one share for a policy
    the share does not apply to (vLLM's own pool, ours' one budget, sequential's)."""
    out: list[Setting] = []
    for h in hosts or [0.0]:
        for p in policies:
            if sequential or policy_own_memory(p) or policy_shared_budget(p, h > 0):
                out.append(Setting(p, None, h))
            else:
                out += [Setting(p, f, h) for f in fractions]
    return out


class Footprint(NamedTuple):
    """What the ideal bound reuses: distinct KV units of its reused prefixes and
    distinct positions it resumes at (each needs a state)."""

    kv_units: int
    positions: int


def footprint(trace: Trace, bound_hits: list[int]) -> Footprint:
    """From the bound's per-request hit tokens (`bound.bound_hit_tokens`): a trie
    of the reused prefixes, counted once each."""
    root: dict[object, dict] = {}  # type: ignore[type-arg]
    units = 0
    ends: set[int] = set()
    for r, hit in zip(trace.requests, bound_hits, strict=True):
        if not hit:
            continue
        node = root
        for u in r.input_units[: -(-hit // trace.unit_tokens)]:
            child = node.get(u)
            if child is None:
                child = node[u] = {}
                units += 1
            node = child
        ends.add(id(node))
    return Footprint(units, len(ends))


def least_gb(trace: Trace, profile: ModelProfile, base: ServingConfig, s: Setting) -> float:
    """The least memory (GB, 0.01 steps) at which `s` serves the largest request alone."""
    cfg = s.config(base, 1.0)
    if policy_own_memory(s.policy):
        return policy_fit(trace, profile, cfg, s.policy).gb_for_largest
    track = TRACK_SLOTS[policy_strategy(s.policy)]
    sb = policy_state_bytes(s.policy, profile)
    shared = policy_shared_budget(s.policy, cfg.tiered)
    return fit(trace, profile, cfg, track, sb, shared).gb_for_largest


def top_gb(
    fp: Footprint,
    trace: Trace,
    profile: ModelProfile,
    base: ServingConfig,
    s: Setting,
    least: float,
) -> float:
    """The bound's footprint at `s`'s split (GB, rounded up to 0.01), plus `least`
    for the requests in flight."""
    kv = fp.kv_units * trace.unit_tokens * profile.kv_bytes_per_token
    states = fp.positions * policy_state_bytes(s.policy, profile)
    f = s.state_fraction
    one_pool = f is None or base.sequential
    need = float(kv + states) if one_pool or f is None else max(kv / (1 - f), states / f)
    return math.ceil(need / 1e7) / 100 + least
