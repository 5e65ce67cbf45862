"""Router policies for the multi-instance replay: which instance serves a request.

A router sees only what a real one sees (`RouterView`, provided by `cluster.py`): each
instance's load as the instance reports it, and what the instances cache as their event
streams describe it (an `Indexer` fed with a lag). The oracle alone asks every tree.

    round-robin   the i-th request goes to instance i mod N
    session       sticky sessions: every turn of a session goes where its first turn
                  went; a first turn goes to the least loaded instance (fewest
                  running + waiting requests, lowest index among equals)
    kv-overlap    Dynamo's KV router cost (below), crediting the KV overlap
                  (`longest_matched`: what KV-event routers credit today)
    hybrid        the same cost, crediting the indexer's usable prefix (the deepest
                  state inside the KV overlap)
    oracle        the same cost, crediting what each tree would serve right now
                  (a read-only `match_prefix`, no lag, no block rounding)

**The cost rule** (one rule for the three overlap routers; only the credited prefix
differs). NVIDIA Dynamo's KV router cost (its routing-concepts docs, 1.x; `DefaultWorker
Selector`): per instance, in tokens,

    cost = weight * (prefill_tokens + max(0, input_tokens - credited)) + decode_tokens

where `prefill_tokens` is prompt work queued or part-way on the instance, `decode_tokens`
the KV held by its admitted requests, and `weight` Dynamo's overlap score weight (default
1.0). The lowest cost wins. Departures from Dynamo: ties go to the lowest instance index
(Dynamo picks one at random), which keeps the replay deterministic; loads are the
instance's own report at routing time rather than Dynamo's router-side prediction of
them; the credit is counted in tokens a hit could serve (at most `input - 1`, the last
prompt token is always computed), so a fully cached prompt is not credited one token
more than any engine could reuse; no softmax sampling (Dynamo's default temperature 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Protocol

from mambaradix.index import Overlap
from mambaradix.names import Names
from mambaradix.replay.trace import TraceRequest
from mambaradix.validate import suggest


class RouterName(Names):
    """The routers, by the names `--router` and `make_router` take (module docstring)."""

    ROUND_ROBIN = "round-robin"
    SESSION = "session"
    KV_OVERLAP = "kv-overlap"
    HYBRID = "hybrid"
    ORACLE = "oracle"


@dataclass(frozen=True, slots=True)
class Load:
    """What an instance reports: requests queued (not admitted) and admitted
    (prefilling or decoding); prompt tokens still to prefill; tokens of KV
    its admitted requests hold."""

    waiting: int
    running: int
    prefill_tokens: int
    decode_tokens: int


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request goes, and the prompt tokens the router expected that
    instance to serve from its cache (0 for routers that credit nothing)."""

    instance: int
    credited_tokens: int


class RouterView(Protocol):
    """What a router may ask about the instances."""

    @property
    def instances(self) -> int: ...

    def load(self, instance: int) -> Load: ...

    def overlaps(self, request: TraceRequest) -> list[Overlap]:
        """Per instance, in trace units, from the (lagged) event streams."""
        ...

    def probe(self, instance: int, request: TraceRequest) -> int:
        """Units the instance's tree would serve the request now (read-only)."""
        ...

    def hit_tokens(self, request: TraceRequest, units: int) -> int:
        """Prompt tokens that a hit of `units` serves (at most input - 1)."""
        ...


class Router:
    name: ClassVar[RouterName]
    needs_events = False  # whether the instances must publish cache events

    def route(self, request: TraceRequest, view: RouterView) -> Route:
        raise NotImplementedError


class RoundRobin(Router):
    name = RouterName.ROUND_ROBIN

    def __init__(self) -> None:
        self.next = 0

    def route(self, request: TraceRequest, view: RouterView) -> Route:
        k, self.next = self.next, (self.next + 1) % view.instances
        return Route(k, 0)


class Session(Router):
    """Sticky sessions by `session_id` (traces without sessions, such as
    Mooncake, give each request its own id: then every request is a first turn)."""

    name = RouterName.SESSION

    def __init__(self) -> None:
        self.home: dict[int | str, int] = {}

    def route(self, request: TraceRequest, view: RouterView) -> Route:
        k = self.home.get(request.session_id)
        if k is None:
            k = least_loaded(view)
            self.home[request.session_id] = k
        return Route(k, 0)


def least_loaded(view: RouterView) -> int:
    def requests(k: int) -> tuple[int, int]:
        load = view.load(k)
        return load.running + load.waiting, k

    return min(range(view.instances), key=requests)


class CostRouter(Router):
    """Dynamo's KV router cost (module docstring) over a credited prefix."""

    def __init__(self, weight: float = 1.0) -> None:
        ok = isinstance(weight, int | float) and not isinstance(weight, bool)
        if not ok or not math.isfinite(weight) or weight < 0:
            raise ValueError(f"weight must be a finite number >= 0, got {weight!r}")
        self.weight = weight
        # The cost times q, in integers: exact, so a huge weight cannot overflow
        # every cost to inf (a tie), and a tie is a tie in real arithmetic.
        self.p, self.q = float(weight).as_integer_ratio()

    def credits(self, request: TraceRequest, view: RouterView) -> list[int]:
        raise NotImplementedError

    def route(self, request: TraceRequest, view: RouterView) -> Route:
        credits = self.credits(request, view)
        best, best_cost = 0, -1
        for k, credit in enumerate(credits):
            load = view.load(k)
            prefill = load.prefill_tokens + max(0, request.input_tokens - credit)
            cost = self.p * prefill + self.q * load.decode_tokens
            if best_cost < 0 or cost < best_cost:  # strictly: ties keep the lowest index
                best, best_cost = k, cost
        return Route(best, credits[best])


class KVOverlap(CostRouter):
    name = RouterName.KV_OVERLAP
    needs_events = True

    def credits(self, request: TraceRequest, view: RouterView) -> list[int]:
        return [view.hit_tokens(request, o.longest_matched) for o in view.overlaps(request)]


class Hybrid(CostRouter):
    name = RouterName.HYBRID
    needs_events = True

    def credits(self, request: TraceRequest, view: RouterView) -> list[int]:
        return [view.hit_tokens(request, o.usable) for o in view.overlaps(request)]


class Oracle(CostRouter):
    name = RouterName.ORACLE

    def credits(self, request: TraceRequest, view: RouterView) -> list[int]:
        return [view.hit_tokens(request, view.probe(k, request)) for k in range(view.instances)]


ROUTERS: dict[RouterName, type[Router]] = {
    r.name: r for r in (RoundRobin, Session, KVOverlap, Hybrid, Oracle)
}


def check_router_names(names: list[str], name: str) -> None:
    """ValueError naming the parameter `name` when one of `names` is not a router."""
    if unknown := [r for r in names if r not in ROUTERS]:
        raise ValueError(
            f"{name}: unknown router {', '.join(unknown)}; choose from {', '.join(ROUTERS)}"
            f"{suggest(str(unknown[0]), ROUTERS)}"
        )


def make_router(name: str, weight: float = 1.0) -> Router:
    """A fresh router (routers keep state: the round-robin position, sessions)."""
    if name not in ROUTERS:
        hint = suggest(str(name), ROUTERS)
        raise ValueError(f"unknown router {name!r}; choose from {', '.join(ROUTERS)}{hint}")
    cls = ROUTERS[RouterName(name)]
    return cls(weight) if issubclass(cls, CostRouter) else cls()
