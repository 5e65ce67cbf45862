"""The serving model in virtual time: a trace through the scheduler.

Requests arrive at their trace timestamps (or at a chosen rate), a session's
later turns no earlier than its previous answer plus the recorded think time
(closed loop, `sessions`; ``open_loop`` releases each at its time), and are served
by the same driver the engine runs (`mambaradix.scheduler.Scheduler`): SGLang's
continuous batching with prefill priority, chunked prefill, admission budgets,
retraction, on the core tree and the request lifecycle. Only the forward is
virtual: a prefill batch takes its FLOPs (uncached tokens, attention over the
cached context included) divided by the accelerator's throughput, a decode
step `tpot` seconds per token; a prefill preempts decoding at the next token
boundary (`VirtualClock`). TTFT = queueing + prefill.

Positions are trace units (a token, or a 512-token block for Mooncake). A
decode step is one token for every running request; on block traces a request
decodes `output_tokens - 1` steps and takes a new block of KV every 512 of
them (its output blocks spread evenly over its steps), so it holds its memory
for as long as it would decode.

Pools: a memory budget split between a KV pool and a state pool, or with
`sequential=True` Marconi's discipline: one shared byte budget, one request at
a time, each prefilled, decoded and finished before the next starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mambaradix.core.tree import MambaRadixCache
from mambaradix.geometry.profile import ModelProfile
from mambaradix.lifecycle import CacheManager
from mambaradix.lifecycle.strategy import PAGE_RULE, takes_page
from mambaradix.lifecycle.tier_lru import LowerTier
from mambaradix.policies import Policy, PolicyContext
from mambaradix.policies.tier_rules import (
    DEFAULT_HOST_GBPS,
    DEFAULT_HOST_LATENCY_US,
    DEFAULT_STORE_GBPS,
    DEFAULT_STORE_LATENCY_US,
)
from mambaradix.pools import ReqToTokenTable
from mambaradix.replay.checks import check_serving_config
from mambaradix.replay.memory import NullStatePool, exact_pools, shared_pools, split_pools
from mambaradix.replay.sessions import Releases
from mambaradix.replay.tiered import TieredCache, TierHooks
from mambaradix.replay.trace import Trace, TraceRequest
from mambaradix.scheduler import (
    DECODE,
    STALLED,
    DecodeStep,
    Extend,
    Scheduler,
    SchedulerConfig,
    ScriptedForward,
    Sequence,
)

SGLANG_MAMBA_CHUNK = 64  # FLA chunk: SGLang's mamba_cache_chunk_size = max(64, page)


@dataclass(frozen=True)
class ServingConfig:
    """memory_gb: KV + states. state_fraction: the state pool's share (SGLang's
    --mamba-full-memory-ratio 0.9 -> 0.9/1.9). prefill_flops_per_s, tpot_s:
    the accelerator. chunk_tokens, max_running, page_size, track_interval:
    SGLang's --chunked-prefill-size, --max-running-requests, --page-size,
    --mamba-track-interval. rate: requests/s instead of trace times.
    sequential: Marconi's discipline (see the module docstring). open_loop:
    every request at its time, not after its session's previous answer
    (`replay.sessions`). host_gb, store_gb: the lower tiers' bytes (0: none), their
    links' GB/s and microseconds per load (`policies.tier_rules`, published defaults).
    tier_write: when units go down to the host (`lifecycle.tier_write`), for every row;
    None: each row's own (`policies.tier_rules`: the peers' rows write through)."""

    memory_gb: float
    state_fraction: float = 0.9 / 1.9
    prefill_flops_per_s: float = 2.4e15  # 8 H100-class GPUs at ~30% of bf16 dense peak
    tpot_s: float = 0.02
    chunk_tokens: int = 8192
    max_running: int = 256
    rate: float | None = None
    sequential: bool = False
    page_size: int = 1
    track_interval: int = 256
    kv_units: int | None = None  # exact pool sizes instead of the memory split
    state_slots: int | None = None
    open_loop: bool = False
    host_gb: float = 0.0  # lower tiers (`replay.tiered`): 0 = none
    store_gb: float = 0.0
    host_gbps: float = DEFAULT_HOST_GBPS
    host_latency_us: float = DEFAULT_HOST_LATENCY_US
    store_gbps: float = DEFAULT_STORE_GBPS
    store_latency_us: float = DEFAULT_STORE_LATENCY_US
    tier_write: str | None = None  # back, through, through-selective; None: each row's own

    @property
    def tiered(self) -> bool:
        """Whether a host or store tier is configured."""
        return self.host_gb > 0 or self.store_gb > 0

    def __post_init__(self) -> None:
        check_serving_config(self)
        for name in ("chunk_tokens", "max_running", "page_size", "track_interval"):
            object.__setattr__(self, name, int(getattr(self, name)))  # numpy ints: plain
        if self.kv_units is not None and self.state_slots is not None:
            object.__setattr__(self, "kv_units", int(self.kv_units))
            object.__setattr__(self, "state_slots", int(self.state_slots))


def page_units(page_size: int, unit_tokens: int) -> int:
    """The tree's page in trace units: a page of tokens on token traces; one
    unit on block traces (blocks are whole pages; the page must divide them)."""
    if unit_tokens == 1:
        return page_size
    if unit_tokens % page_size:
        raise ValueError(
            f"page_size {page_size} must divide the trace's {unit_tokens}-token blocks"
        )
    return 1


@dataclass
class Outcome:
    request: int  # index in the trace
    input_tokens: int
    hit_tokens: int
    ttft_s: float
    flops_saved: float
    kv_hit_tokens: int = 0
    retractions: int = 0
    cached_units: int = 0  # raw, of the admission that completed (may cover outputs)
    arrival_s: float = 0.0  # when it reached the server (closed loop: after its previous turn)
    done_s: float = 0.0  # when its last token was out
    host_hit_tokens: int = 0  # of hit_tokens, loaded from the host tier
    store_hit_tokens: int = 0  # of hit_tokens, loaded from the store tier
    load_s: float = 0.0  # seconds loading from the tiers (in ttft_s)


class Units:
    """Unit <-> token conversions of one trace."""

    def __init__(self, trace: Trace) -> None:
        self.unit = trace.unit_tokens
        out_units = sum(len(r.output_units) for r in trace.requests)
        out_tokens = sum(r.output_tokens for r in trace.requests)
        self.tokens_per_out_unit = out_tokens / out_units if out_units else 1.0

    def tokens_at(self, tr: TraceRequest, units: int) -> int:
        """Tokens at unit position `units` of a request (the last prompt unit
        may be partial)."""
        n_in = len(tr.input_units)
        if units <= n_in:
            return min(units * self.unit, tr.input_tokens)
        return tr.input_tokens + round((units - n_in) * self.tokens_per_out_unit)

    def hit_tokens(self, tr: TraceRequest, units: int) -> int:
        """Prompt tokens a hit of `units` serves (at most input - 1)."""
        return min(units * self.unit, tr.input_tokens - 1) if units else 0


class VirtualClock:
    """Virtual time. Decode steps run back to back on the accelerator; a
    prefill batch preempts the decode step in flight at its next token
    boundary (SGLang runs prefill first, between token steps) and delays it by
    its own duration. `now` is when the scheduler acts; `decode_until` when the
    decode step in flight (which began at `decode_start`) completes."""

    def __init__(self, tpot_s: float) -> None:
        self.tpot = tpot_s
        self.now = self.decode_start = self.decode_until = 0.0
        self.prefill_s = 0.0  # accelerator time spent prefilling, in total

    def __call__(self) -> float:
        return self.now

    def prefill(self, seconds: float) -> None:
        start = self.now
        self.now += seconds
        self.prefill_s += seconds
        if self.decode_until > start:
            self.decode_until += seconds

    def decode(self, seconds: float) -> None:
        self.now = self.decode_start = max(self.now, self.decode_until)
        self.decode_until = self.now + seconds

    def wait_for(self, arrival: float) -> None:
        """Move to where the scheduler could act on `arrival`: at it if the
        accelerator is free, else at the next token boundary of the decode
        step in flight (or that step's end)."""
        if arrival >= self.decode_until:
            self.now = max(self.now, arrival)
            return
        steps = -(-(arrival - self.decode_start) // self.tpot) if self.tpot > 0 else 0
        self.now = max(self.now, min(self.decode_start + steps * self.tpot, self.decode_until))


class VirtualForward(ScriptedForward):
    """Scripted outputs; time advances by the batch's prefill FLOPs at the
    configured throughput, or by one decode step (`VirtualClock`)."""

    def __init__(
        self, profile: ModelProfile, units: Units, cfg: ServingConfig, clock: VirtualClock
    ) -> None:
        self.profile, self.units, self.cfg, self.clock = profile, units, cfg, clock
        self.requests: dict[int, TraceRequest] = {}

    def prefill(self, batch: list[Extend]) -> list[int | None]:
        flops = 0.0
        for e in batch:
            tr = self.requests[e.seq.id]
            a, b = self.units.tokens_at(tr, e.start), self.units.tokens_at(tr, e.end)
            flops += self.profile.prefill_flops(a, b - a)
        self.clock.prefill(flops / self.cfg.prefill_flops_per_s)
        return super().prefill(batch)

    def decode(self, batch: list[DecodeStep]) -> list[int]:
        self.clock.decode(self.cfg.tpot_s)
        return super().decode(batch)

    def pass_steps(self, n: int) -> None:
        """n decode steps with no new unit (a block trace's tokens within a block)."""
        self.clock.decode(self.cfg.tpot_s * n)


@dataclass
class ServingModel:
    """One trace through one policy at one memory size. `run()`, then read
    `outcomes` (per served request, in finish order), `dropped` (requests that
    could never run), `cache` and the peaks."""

    trace: Trace
    profile: ModelProfile
    policy: Policy
    cfg: ServingConfig
    outcomes: list[Outcome] = field(default_factory=list)
    dropped: list[TraceRequest] = field(default_factory=list)
    admitted: list[TraceRequest] = field(default_factory=list)
    peak_kv: int = 0
    peak_states: int = 0
    on_done: Callable[[int, float], None] | None = None
    """Called with (request index, virtual time) when a request's answer is done
    or it is dropped: the driver's `Releases.done`."""
    on_submit: Callable[[int, Sequence], None] | None = None
    """Called with (request index, its new `Sequence`) as the request is queued
    (`replay.explain` maps the scheduler's requests back to the trace)."""
    store: LowerTier | None = None
    """The store tier (L3) when it is shared with other serving models (`replay.cluster`'s
    `shared_store`); None: its own, of `cfg.store_gb`."""

    def __post_init__(self) -> None:
        # requests done (with their outcome) or dropped (None) in the step in flight
        self._ended: list[tuple[int, Outcome | None]] = []
        self.units = Units(self.trace)
        self.kv_unit_bytes = self.profile.kv_bytes_per_token * self.units.unit
        self.state_bytes = self.policy.state_bytes(self.profile)
        self.clock = VirtualClock(self.cfg.tpot_s)
        self.cache = self._build_cache()
        self.forward = VirtualForward(self.profile, self.units, self.cfg, self.clock)
        self.tiered = self._build_tiers()
        hooks = self.policy if self.tiered is None else TierHooks(self.policy, self.tiered)
        self.scheduler = Scheduler(
            self.cache,
            self.forward,
            hooks,
            self._scheduler_config(),
            self.clock,
            on_finish=self._record,
            on_abort=self._aborted,
        )
        self.policy.attach(self._context())

    # ----------------------------------------------------------------- setup

    def _build_cache(self) -> CacheManager:
        own_page = self.policy.tree_page(self.profile, self.units.unit)
        page = own_page or page_units(self.cfg.page_size, self.units.unit)
        budget = int(self.cfg.memory_gb * 1e9)
        strategy = self.policy.strategy
        if not takes_page(strategy, page) and own_page is None:
            raise ValueError(
                f"policy {self.policy.name!r} (no_buffer) needs page_size 1 ({PAGE_RULE}); "
                f"page_size {self.cfg.page_size} needs an extra_buffer policy"
            )
        own = self.policy.build_memory(
            self._budget_bytes(budget), self.kv_unit_bytes, self.profile, self.units.unit
        )
        if own is not None:
            kv, slots = own
        elif self.cfg.kv_units is not None and self.cfg.state_slots is not None:
            kv, slots = exact_pools(self.cfg.kv_units, self.cfg.state_slots, page)
        elif self.cfg.sequential or self.policy.one_budget(self.cfg.tiered):
            kv, slots = shared_pools(budget, self.kv_unit_bytes, self.state_bytes)
        else:
            kv, slots = split_pools(
                budget, self.cfg.state_fraction, self.kv_unit_bytes, self.state_bytes, page
            )
        longest = max(r.input_units.__len__() + len(r.output_units) for r in self.trace.requests)
        rows = 1 if self.cfg.sequential else self.cfg.max_running
        chunk = max(page, SGLANG_MAMBA_CHUNK // self.units.unit, 1)
        chunk = -(-chunk // page) * page
        tree = MambaRadixCache(page_size=page, chunk_size=chunk, compat=self.policy.compat)
        return CacheManager(
            tree,
            kv,
            slots,
            NullStatePool(),
            ReqToTokenTable(rows, longest + page),
            strategy=strategy,
            evictor=self.policy.evict,
            sglang_rules=self.policy.sglang_rules,
            page_checkpoints=own_page is not None,
        )

    def _shared_memory(self) -> bool:
        """Whether KV and states draw on one byte budget (`_build_cache`)."""
        one = self.cfg.sequential or self.policy.one_budget(self.cfg.tiered)
        return one and self.cfg.kv_units is None

    def _build_tiers(self) -> TieredCache | None:
        if not self.cfg.tiered:
            return None
        rules = self.policy.tier_rules(self.profile)
        tiered = TieredCache(
            self.cache,
            self.profile,
            self.cfg,
            rules,
            self.units.unit,
            self.kv_unit_bytes,
            self.state_bytes,
            self.store,
        )
        tiered.adopt = self.policy.adopt_loaded
        tiered.pool = self.policy.pool
        return tiered

    def _budget_bytes(self, budget: int) -> int:
        """The memory in bytes; with exact pool sizes, what they take."""
        if self.cfg.kv_units is None or self.cfg.state_slots is None:
            return budget
        return self.cfg.kv_units * self.kv_unit_bytes + self.cfg.state_slots * self.state_bytes

    def _scheduler_config(self) -> SchedulerConfig:
        unit, cfg = self.units.unit, self.cfg
        page = self.cache.page_size
        track = max(page, cfg.track_interval // unit // page * page)
        chunk = max(page, cfg.chunk_tokens // unit // page * page)
        running = 1 if cfg.sequential else cfg.max_running
        return SchedulerConfig(chunk_tokens=chunk, max_running=running, track_interval=track)

    def _context(self) -> PolicyContext:
        sched = self.scheduler.config
        return PolicyContext(
            self.profile,
            self.units.unit,
            sched.chunk_tokens or 1 << 62,
            self.kv_unit_bytes,
            self.cache.kv.capacity,
            self.cache.slots.capacity,
            self.cache.slots.available_size,
            tree=self.cache.tree,
            state_bytes=self.state_bytes,
            shared_memory=self._shared_memory(),
            budget_units=max(1, self.cfg.chunk_tokens // self.units.unit),
            rows=self.cache.rows,
            cache=self.cache,
            waiting=lambda: [seq.req for seq in self.scheduler.waiting],
        )

    # ------------------------------------------------------------------- run

    def arrival_times(self) -> list[float]:
        reqs = self.trace.requests
        if self.cfg.rate is None:
            return [r.ts for r in reqs]
        return [i / self.cfg.rate for i in range(len(reqs))]

    def releases(self) -> Releases:
        """The trace's arrivals, open or closed loop (`ServingConfig.open_loop`)."""
        return Releases(self.trace, self.arrival_times(), not self.cfg.open_loop)

    def run(self) -> None:
        arrivals = self.releases()
        self.on_done = arrivals.done
        while arrivals.pending or self.scheduler.busy:
            nxt = arrivals.peek()
            if nxt is not None and self.wakes_for(nxt[0]):
                self.clock.wait_for(nxt[0])
            while nxt is not None and nxt[0] <= self.clock.now:
                self.submit(nxt[1], arrivals.pop()[0])
                nxt = arrivals.peek()
            if self.scheduler.busy:
                self.step()
            elif nxt is None:  # turns held for answers that can no longer come
                raise RuntimeError(f"{arrivals.held} turns wait for requests that never ended")
        self.settle()

    # The pieces of `run()`, also driven one by one by the multi-instance replay.

    def wakes_for(self, arrival: float) -> bool:
        """Whether the scheduler moves its clock to act on `arrival`: it is
        idle, or the arrival falls inside the decode step in flight."""
        return not self.scheduler.busy or arrival < self.clock.decode_until

    def submit(self, i: int, at: float) -> None:
        """Queue trace request `i`, arrived at `at`."""
        self._submit(i, self.trace.requests[i], at)

    def step(self) -> str:
        """One scheduler step; a request that can never run is dropped."""
        kind = self.scheduler.step()
        if kind == STALLED:
            self._drop(self.scheduler.waiting[0])
        if self._ended:
            self._report_ends(self.clock.decode_until if kind == DECODE else self.clock.now)
        self._track_peaks()
        return kind

    def _report_ends(self, at: float) -> None:
        ended, self._ended = self._ended, []
        for i, outcome in ended:
            if outcome is not None:
                outcome.done_s = at
            if self.on_done is not None:
                self.on_done(i, at)

    def settle(self) -> None:
        """After the last step: a request neither finished nor dropped (none
        while the scheduler reports every abort through `_aborted`) was never
        served, so it is dropped too, not lost."""
        self.dropped += self.forward.requests.values()
        self._ended += [(i, None) for i in self.forward.requests]
        self.forward.requests.clear()
        self._report_ends(self.clock.now)

    def _submit(self, i: int, tr: TraceRequest, at: float) -> None:
        n_out = max(1, len(tr.output_units))
        script = tr.output_units if len(tr.output_units) else tr.input_units[-1:]
        steps = max(n_out - 1, tr.output_tokens - 1) if self.units.unit > 1 else None
        seq = Sequence(tr.input_units, n_out, script=script, id=i, arrival=at, decode_steps=steps)
        self.forward.requests[i] = tr
        if self.on_submit is not None:
            self.on_submit(i, seq)
        self.scheduler.submit(seq)

    def _drop(self, seq: Sequence) -> None:
        self.scheduler.abort(seq)  # a waiting sequence: `_aborted` at once

    def _aborted(self, seq: Sequence) -> None:
        """The scheduler stopped `seq` unfinished (stalled, or out of memory even
        alone while decoding): never served, it counts as dropped."""
        self.dropped.append(self.forward.requests.pop(seq.id))
        self._ended.append((seq.id, None))

    def _record(self, seq: Sequence) -> None:
        tr = self.forward.requests.pop(seq.id)
        self.admitted.append(tr)
        self.policy.on_request_done()
        hit = self.units.hit_tokens(tr, seq.cached_tokens)
        ttft = (seq.first_token_time or seq.arrival) - seq.arrival
        lower = self._lower_hit(tr, seq, hit)
        self.outcomes.append(
            Outcome(
                seq.id,
                tr.input_tokens,
                hit,
                ttft,
                self.profile.flops_saved(hit, tr.input_tokens),
                self.units.hit_tokens(tr, seq.kv_hit_tokens),
                seq.retractions,
                seq.cached_tokens,
                seq.arrival,
            )
        )
        if lower is not None:
            tier, tokens, seconds = lower
            out = self.outcomes[-1]
            out.ttft_s += seconds
            out.load_s = seconds
            if tier == "host":
                out.host_hit_tokens = tokens
            else:
                out.store_hit_tokens = tokens
        self._ended.append((seq.id, self.outcomes[-1]))

    def _lower_hit(
        self, tr: TraceRequest, seq: Sequence, hit: int
    ) -> tuple[str, int, float] | None:
        """(tier, hit tokens loaded from it, load seconds) when the tiers served it."""
        if self.tiered is None:
            return None
        got = self.tiered.lower_hit_units(seq.req, seq.cached_tokens)
        if got is None:
            return None
        tier, units, seconds = got
        below = self.units.hit_tokens(tr, seq.cached_tokens - units) if units else 0
        return tier, hit - below, seconds

    def _track_peaks(self) -> None:
        kv, slots = self.cache.kv, self.cache.slots
        used_kv = kv.capacity - kv.free_list_size()
        used_slots = slots.capacity - slots.free_list_size()
        self.peak_kv = max(self.peak_kv, used_kv)
        self.peak_states = max(self.peak_states, used_slots)
