"""The multi-instance replay: N serving models behind a router, in one virtual time.

Each instance is a whole `ServingModel` (its own tree, lifecycle, pools, scheduler and
accelerator clock) built from the whole trace, with the same policy and memory size
(`--memory` is per instance). One loop takes the arrivals in order. Before routing the
request that arrives at t, every instance runs the steps it would run before it could act
on an arrival at t, exactly as the single-instance loop does (`ServingModel.run`); then
the router picks an instance (`routers.py`), and that instance alone wakes for the
arrival (`VirtualClock.wait_for`) and queues it. With one instance this is the
single-instance loop, step for step (a test checks every metric is equal).

What the router sees (`RouterView`):

* **events**: every instance's tree has an `EventEmitter`; the events of each step are
  stamped with the step's end in the instance's virtual time (kept in emission order) and
  reach one `Indexer` once `now - lag` has passed that stamp. Only routers that read them
  (kv-overlap, hybrid) pay for them. The router's block is the tree's page by default
  (SGLang's page hash at its page size: every state position can be announced), in
  tokens a multiple of it; a state off that grid is floored, as the indexer floors it;
* **load**: the counts and tokens an instance reports (`Load`), as of its last step;
* the **oracle** asks every tree with a read-only `match_prefix`.

Metrics beyond `replay()`'s (`cluster_metrics`): `credited_tokens` (what the router
expected the chosen instance to serve), `mispredicted_tokens` (over-credit: the sum over
requests of credited minus actually hit tokens where positive; a dropped request hit
nothing), `undercredited_tokens` (the converse), `load_imbalance` (the busiest instance's
prefill time over the mean instance's: 1.0 is perfectly even; prefill is the work a
routing decision moves, decode steps run for any number of requests), and per instance
its requests, hit rate and prefill time (`results.ClusterMetrics`); `ttft_mean_s` is over
every instance's requests, as the other metrics.

Traces whose units fall outside uint32 (Mooncake's synthetic output block ids are
negative) are relabelled: every such id gets an unused id in range. The emitter hashes
tokens as SGLang does (uint32) and skips what it cannot hash; the tree and the indexer
only compare ids for equality, so nothing else changes.
"""

from __future__ import annotations

import math
import statistics
import time
from array import array
from collections import deque
from dataclasses import dataclass, replace

from mambaradix.events import Event, EventEmitter
from mambaradix.geometry.profile import ModelProfile
from mambaradix.index import Indexer, Overlap
from mambaradix.policies import Marconi, make_policy
from mambaradix.replay.checks import (
    check_cluster,
    check_inputs,
    check_instanced,
    check_paged,
    check_policies,
    policy_strategy,
)
from mambaradix.replay.fit import check_memory
from mambaradix.replay.results import ClusterMetrics, InstanceRow, ReplayResult
from mambaradix.replay.routers import Load, Route, Router, make_router
from mambaradix.replay.run import attach_tuner, summarize
from mambaradix.replay.serving import ServingConfig, ServingModel
from mambaradix.replay.sessions import Releases
from mambaradix.replay.trace import Trace, TraceRequest
from mambaradix.scheduler import DECODE
from mambaradix.validate import as_bool

UINT32 = 1 << 32


@dataclass(frozen=True)
class ClusterSpec:
    """instances: serving models; router_lag_s: how old the router's view of the
    event streams is; block_tokens: the router's block (None: the tree's page);
    overlap_weight: the weight of prefill work in the cost rule (Dynamo's
    overlap score weight). shared_store: the instances share one store tier (L3) of
    `store_gb` (HiCache's and Mooncake's shared L3), instead of one each."""

    instances: int = 1
    router_lag_s: float = 0.0
    block_tokens: int | None = None
    overlap_weight: float = 1.0
    shared_store: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.instances, bool) or not isinstance(self.instances, int):
            raise ValueError(f"instances must be a positive int, got {self.instances!r}")
        if self.instances < 1:
            raise ValueError(f"instances must be a positive int, got {self.instances!r}")
        for name in ("router_lag_s", "overlap_weight"):
            value = getattr(self, name)
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not ok or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        b = self.block_tokens
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
            raise ValueError(f"block_tokens must be a positive int or None, got {b!r}")
        as_bool(self.shared_store, "shared_store")


class Instance:
    """One serving model as the cluster loop drives it. `waking`: it woke for
    an arrival and still takes those due by its clock (the single loop's
    submit phase); otherwise it wakes for the next arrival it is given."""

    def __init__(self, model: ServingModel, emitter: EventEmitter | None) -> None:
        self.model = model
        self.emitter = emitter
        self.waking = False
        self.events: deque[tuple[float, list[Event]]] = deque()
        self.stamp = 0.0  # stamp of the newest events (stamps never go back)
        self.routed = 0

    def ready(self, t: float) -> bool:
        """Whether it would act on an arrival at t before its next step."""
        clock = self.model.clock
        if self.waking:
            return t <= clock.now
        return self.model.wakes_for(t) or t <= clock.now

    def advance_to(self, t: float, arrivals: Releases | None = None) -> None:
        """Step until it would act on an arrival at t; stop early when a step
        releases an earlier arrival (a closed-loop turn whose previous answer
        it finished), which is then routed first."""
        while not self.ready(t):
            if self.model.scheduler.busy:
                self.step()
            self.waking = False
            nxt = arrivals.peek() if arrivals is not None else None
            if nxt is not None and nxt[0] < t:
                return

    def accept(self, i: int, t: float) -> None:
        model = self.model
        if not self.waking:
            if model.wakes_for(t):
                model.clock.wait_for(t)
            self.waking = True
        model.submit(i, t)
        self.routed += 1

    def step(self) -> None:
        kind = self.model.step()
        if self.emitter is not None:
            events = self.emitter.take()
            if events:
                clock = self.model.clock
                end = clock.decode_until if kind == DECODE else clock.now
                self.stamp = max(self.stamp, end)
                self.events.append((self.stamp, events))

    def drain(self) -> None:
        if self.emitter is not None:
            self.emitter.close()
            self.emitter = None
            self.events.clear()
        while self.model.scheduler.busy:
            self.step()
        self.model.settle()

    def load(self) -> Load:
        sched, unit = self.model.scheduler, self.model.units.unit
        prefill = sum(s.req.total_len for s in sched.waiting)
        decode = sum(s.req.total_len for s in sched.running)
        for s in sched.prefilling:
            prefill += s.req.total_len - s.req.computed
            decode += s.req.computed
        running = len(sched.prefilling) + len(sched.running)
        return Load(len(sched.waiting), running, prefill * unit, decode * unit)


class Cluster:
    """N instances and a router over one trace (see the module docstring)."""

    def __init__(
        self,
        trace: Trace,
        profile: ModelProfile,
        policy: str,
        cfg: ServingConfig,
        router: Router,
        spec: ClusterSpec,
    ) -> None:
        self.trace = routable(trace)
        self.router, self.spec = router, spec
        first = ServingModel(self.trace, profile, make_policy(policy), cfg)
        store = None  # with a shared store, the first instance's is every instance's
        if spec.shared_store and first.tiered is not None and cfg.store_gb > 0:
            store = first.tiered.tiers.store
        self.models = [first] + [
            ServingModel(self.trace, profile, make_policy(policy), cfg, store=store)
            for _ in range(spec.instances - 1)
        ]
        for model in self.models:
            attach_tuner(model)
        self.block_units = self._block_units()
        self.indexer = Indexer(self.block_units) if router.needs_events else None
        self.nodes = [
            Instance(m, EventEmitter(m.cache.tree, self.block_units) if self.indexer else None)
            for m in self.models
        ]
        self.routes: list[Route | None] = [None] * len(self.trace)
        self.now = 0.0

    def _block_units(self) -> int:
        unit, page = self.models[0].units.unit, self.models[0].cache.page_size
        tokens = self.spec.block_tokens or page * unit
        if tokens % (page * unit):
            raise ValueError(
                f"the router's block ({tokens} tokens) must be a multiple of the tree's "
                f"page ({page * unit} tokens)"
            )
        return tokens // unit

    def run(self) -> None:
        reqs = self.trace.requests
        arrivals = self.models[0].releases()  # shared: a turn may go to another instance
        for model in self.models:
            model.on_done = arrivals.done
        while arrivals.pending:
            nxt = arrivals.peek()
            if nxt is None:
                self._finish_one(arrivals)
                continue
            t, i = nxt
            for node in self.nodes:
                node.advance_to(t, arrivals)
            if arrivals.peek() != nxt:  # an earlier turn was released meanwhile
                continue
            arrivals.pop()
            self.now = t
            route = self.router.route(reqs[i], self)
            self.routes[i] = route
            self.nodes[route.instance].accept(i, t)
        for node in self.nodes:
            node.drain()

    def _finish_one(self, arrivals: Releases) -> None:
        """Every known arrival is routed and turns still wait for answers: step
        the instance whose clock is earliest until one is released."""
        busy = [node for node in self.nodes if node.model.scheduler.busy]
        if not busy:
            raise RuntimeError(f"{arrivals.held} turns wait for requests that never ended")
        min(busy, key=lambda node: node.model.clock.now).step()
        for node in busy:
            node.waking = False

    # ----------------------------------------------------- what the router sees

    @property
    def instances(self) -> int:
        return len(self.nodes)

    def load(self, instance: int) -> Load:
        return self.nodes[instance].load()

    def overlaps(self, request: TraceRequest) -> list[Overlap]:
        assert self.indexer is not None, "this router reads no events"
        self._deliver(self.now - self.spec.router_lag_s)
        found = self.indexer.query(request.input_units)
        none = Overlap(0, 0, 0)
        return [found.get(k, none) for k in range(len(self.nodes))]

    def probe(self, instance: int, request: TraceRequest) -> int:
        tree = self.models[instance].cache.tree
        return tree.match_prefix(request.input_units[:-1], read_only=True).prefix_len

    def hit_tokens(self, request: TraceRequest, units: int) -> int:
        return self.models[0].units.hit_tokens(request, units)

    def _deliver(self, upto: float) -> None:
        """Apply every event batch stamped at or before `upto`, in order."""
        assert self.indexer is not None
        for k, node in enumerate(self.nodes):
            batch: list[Event] = []
            while node.events and node.events[0][0] <= upto:
                batch += node.events.popleft()[1]
            if batch:
                self.indexer.apply(k, batch)


def cluster_replay(
    trace: Trace,
    profile: ModelProfile,
    policy: str,
    cfg: ServingConfig,
    router: str,
    spec: ClusterSpec,
) -> ReplayResult:
    """Run the cluster; one result row: `replay()`'s metrics over all instances
    together, plus the cluster's (module docstring). Checks what `replay()`
    checks, and the router and spec, before any instance is built."""
    check_inputs(trace, profile, cfg)
    check_policies([policy], "policy")
    check_instanced([policy], "policy")
    check_paged([policy], trace, cfg, "policy")
    check_cluster([router], spec, trace, cfg, ("router", "spec"))
    check_memory(trace, profile, cfg, {policy: policy_strategy(policy)})
    return cluster_replay_checked(trace, profile, policy, cfg, router, spec)


def cluster_replay_checked(
    trace: Trace,
    profile: ModelProfile,
    policy: str,
    cfg: ServingConfig,
    router: str,
    spec: ClusterSpec,
) -> ReplayResult:
    """`cluster_replay` of a point its caller has already checked as `cluster_replay`
    checks (`sweep` checks every cell before the first runs)."""
    cluster = Cluster(trace, profile, policy, cfg, make_router(router, spec.overlap_weight), spec)
    start = time.perf_counter()
    cluster.run()
    elapsed = time.perf_counter() - start
    alphas = [m.policy.alpha for m in cluster.models if isinstance(m.policy, Marconi)]
    alpha = None
    if alphas:
        alpha = alphas[0] if len(alphas) == 1 else statistics.median(alphas)
    return replace(
        summarize(cluster.models, policy, cfg),
        replay_s=elapsed,
        requests_per_s=len(trace) / elapsed if elapsed else 0.0,
        alpha=alpha,
        cluster=cluster_metrics(cluster, router),
    )


def cluster_metrics(cluster: Cluster, router: str) -> ClusterMetrics:
    """The cluster's metrics (module docstring). Its mean TTFT is `summarize`'s over
    every instance (`statistics.fmean` sums exactly: the instances' order cannot
    change the last bit), so it is not computed again here."""
    hit = {o.request: o.hit_tokens for m in cluster.models for o in m.outcomes}
    credited = over = under = 0
    for i, route in enumerate(cluster.routes):
        assert route is not None
        got = hit.get(i, 0)
        credited += route.credited_tokens
        over += max(0, route.credited_tokens - got)
        under += max(0, got - route.credited_tokens)
    busy = [m.clock.prefill_s for m in cluster.models]
    mean_busy = sum(busy) / len(busy)
    spec = cluster.spec
    return ClusterMetrics(
        instances=spec.instances,
        router=router,
        router_lag_s=spec.router_lag_s,
        router_block_tokens=cluster.block_units * cluster.models[0].units.unit,
        overlap_weight=spec.overlap_weight,
        credited_tokens=credited,
        mispredicted_tokens=over,
        undercredited_tokens=under,
        load_imbalance=max(busy) / mean_busy if mean_busy > 0 else 1.0,
        per_instance=[_instance_row(node) for node in cluster.nodes],
    )


def _instance_row(node: Instance) -> InstanceRow:
    outs = node.model.outcomes
    prompt = sum(o.input_tokens for o in outs) + sum(r.input_tokens for r in node.model.dropped)
    return InstanceRow(
        requests=node.routed,
        token_hit_rate=sum(o.hit_tokens for o in outs) / max(1, prompt),
        prefill_s=node.model.clock.prefill_s,
    )


def routable(trace: Trace) -> Trace:
    """The trace, with every unit outside uint32 given an unused id inside it
    (the same id for equal units); the trace itself if none is outside."""
    arrays = [a for r in trace.requests for a in (r.input_units, r.output_units) if len(a)]
    if all(min(a) >= 0 and max(a) < UINT32 for a in arrays):
        return trace
    inside = [x for a in arrays for x in a if 0 <= x < UINT32]
    fresh: dict[int, int] = {}
    start = max(inside, default=-1) + 1

    def relabel(units: array[int]) -> array[int]:
        out = array("q", units)
        for j, x in enumerate(out):
            if not 0 <= x < UINT32:
                out[j] = fresh.setdefault(x, start + len(fresh))
        return out

    requests = [
        replace(r, input_units=relabel(r.input_units), output_units=relabel(r.output_units))
        for r in trace.requests
    ]
    if start + len(fresh) > UINT32:
        raise ValueError("the trace has too many distinct units to relabel into uint32")
    return Trace(trace.name, requests, trace.unit_tokens, trace.source, dict(trace.meta))


__all__ = ["Cluster", "ClusterSpec", "cluster_replay", "routable"]
