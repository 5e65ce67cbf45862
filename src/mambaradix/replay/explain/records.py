"""`explain`'s results: one `RequestGap` per request, one `Explanation` per run."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from mambaradix.names import Names
from mambaradix.replay.explain.attribute import CATEGORIES
from mambaradix.replay.serving import ServingConfig


class Room(Names):
    """The pool an eviction made room in: the KV pool, the state pool, or one budget
    shared by both (`Explanation.evicted`'s keys)."""

    KV = "kv"
    STATES = "states"
    BOTH = "both"


@dataclass(frozen=True, slots=True)
class RequestGap:
    """One request: its bound, its hit, and the gap between them by category
    (`attribute.CATEGORIES`; they add up to `gap_tokens`). `never_seen_tokens`,
    the prompt beyond the bound (nothing earlier shares it, and the last token
    is always computed), is outside the gap: prompt = hit + gap + never seen."""

    request: int  # index in the trace (arrival order)
    session_id: int | str
    turn_id: int
    input_tokens: int
    bound_tokens: int
    hit_tokens: int
    source: int | None  # an earlier request whose prompt + answer holds the bound's prefix
    instance: int | None  # the instance that served it (None: dropped)
    categories: dict[str, int]
    host_hit_tokens: int = 0
    store_hit_tokens: int = 0

    @property
    def gap_tokens(self) -> int:
        return self.bound_tokens - self.hit_tokens

    @property
    def never_seen_tokens(self) -> int:
        return self.input_tokens - self.bound_tokens

    def to_json(self) -> dict[str, Any]:
        out = {f: getattr(self, f) for f in self.__slots__ if f != "categories"}
        out["gap_tokens"] = self.gap_tokens
        out["never_seen_tokens"] = self.never_seen_tokens
        out["categories"] = dict(self.categories)
        return out


@dataclass(frozen=True)
class Explanation:
    """One (policy, serving config) run explained: every request of the trace,
    in trace order."""

    policy: str
    config: ServingConfig
    requests: tuple[RequestGap, ...]
    router: str | None = None
    instances: int = 1
    alpha: float | None = None  # Marconi's tuned (oracle: best) alpha
    evicted: dict[str, dict[str, int]] | None = None
    """What the run's evictions freed, by the pool they made room in (`Room`: "kv",
    "states", "both": one shared budget): `kv_tokens` and `states`. A state
    evicted from a leaf takes the leaf's KV with it, so KV freed for states is
    KV lost to the state pool's pressure."""
    tiers: dict[str, int] | None = None
    """On a tiered run (None otherwise), what the lower tiers did, over every
    instance (`replay.tiered.TierStats`): `host_loads`, `store_loads`,
    `loads_recomputed` (the rule chose to recompute), `loads_failed` (no device
    memory for the load) and `dropped_bytes` (fell out of the last tier)."""

    @property
    def prompt_tokens(self) -> int:
        return sum(r.input_tokens for r in self.requests)

    @property
    def bound_tokens(self) -> int:
        return sum(r.bound_tokens for r in self.requests)

    @property
    def hit_tokens(self) -> int:
        return sum(r.hit_tokens for r in self.requests)

    @property
    def gap_tokens(self) -> int:
        return self.bound_tokens - self.hit_tokens

    def totals(self) -> dict[str, int]:
        """Tokens per category over every request; they add up to `gap_tokens`."""
        out: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        for r in self.requests:
            for name, tokens in r.categories.items():
                out[name] += tokens
        return out

    def to_json(self) -> dict[str, Any]:
        """The aggregate (without the per-request records: `requests_json`)."""
        gap = self.gap_tokens
        totals = self.totals()
        return {
            "policy": self.policy,
            "memory_gb": self.config.memory_gb,
            "state_fraction": self.config.state_fraction,
            "router": self.router,
            "instances": self.instances,
            "alpha": self.alpha,
            "requests": len(self.requests),
            "prompt_tokens": self.prompt_tokens,
            "bound_tokens": self.bound_tokens,
            "hit_tokens": self.hit_tokens,
            "host_hit_tokens": sum(r.host_hit_tokens for r in self.requests),
            "store_hit_tokens": sum(r.store_hit_tokens for r in self.requests),
            "gap_tokens": gap,
            "never_seen_tokens": self.prompt_tokens - self.bound_tokens,
            "categories": totals,
            "share_of_gap": {k: v / gap if gap else 0.0 for k, v in totals.items()},
            "evicted": self.evicted,
            "tiers": self.tiers,
            "config": asdict(self.config),
        }

    def requests_json(self) -> list[dict[str, Any]]:
        """The per-request records, each with the run's policy and memory."""
        cfg = self.config
        head: dict[str, Any] = {
            "policy": self.policy,
            "memory_gb": cfg.memory_gb,
            "state_fraction": cfg.state_fraction,
        }
        if self.router is not None:
            head["router"] = self.router
        return [{**head, **r.to_json()} for r in self.requests]
