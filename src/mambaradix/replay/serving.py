"""The serving model in virtual time: a trace through the scheduler.

Requests arrive at their trace timestamps (or at a chosen rate) and are served
by the same driver the engine runs (`mambaradix.scheduler.Scheduler`): SGLang's
continuous batching with prefill priority, chunked prefill, admission budgets,
retraction, on the core tree and the request lifecycle. Only the forward is
virtual: a prefill batch takes its FLOPs (uncached tokens, attention over the
cached context included) divided by the accelerator's throughput, a decode
step `tpot` seconds per token. TTFT = queueing + prefill.

Positions are trace units (a token, or a 512-token block for Mooncake). A
decode step advances every running request by one unit; for block traces it
stands for the trace's mean output tokens per output unit, so total decode time
is preserved on average (a modelling approximation at block granularity).

Pools: a memory budget split between a KV pool and a state pool, or with
`sequential=True` Marconi's discipline: one shared byte budget, one request at
a time, each prefilled, decoded and finished before the next starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mambaradix.core.tree import MambaRadixCache
from mambaradix.lifecycle import CacheManager
from mambaradix.pools import ReqToTokenTable
from mambaradix.replay.memory import NullStatePool, exact_pools, shared_pools, split_pools
from mambaradix.replay.models import ModelProfile
from mambaradix.replay.policies import Policy, PolicyContext
from mambaradix.replay.trace import Trace, TraceRequest
from mambaradix.scheduler import (
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
    sequential: Marconi's discipline (see the module docstring)."""

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

    def __post_init__(self) -> None:
        _finite("memory_gb", self.memory_gb, lo=0.0)
        if not 0 < self.state_fraction < 1 or not math.isfinite(self.state_fraction):
            raise ValueError(f"state_fraction must lie in (0, 1), got {self.state_fraction!r}")
        _finite("prefill_flops_per_s", self.prefill_flops_per_s, lo=0.0)
        _finite("tpot_s", self.tpot_s, lo=0.0, inclusive=True)
        if self.rate is not None:
            _finite("rate", self.rate, lo=0.0)
        for name in ("chunk_tokens", "max_running", "page_size", "track_interval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.track_interval % self.page_size:
            raise ValueError("track_interval must be a multiple of page_size")
        for name in ("kv_units", "state_slots"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{name} must be an int or None, got {value!r}")
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if (self.kv_units is None) != (self.state_slots is None):
            raise ValueError("give both kv_units and state_slots, or neither")


def _finite(name: str, value: object, lo: float, inclusive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < lo or (value == lo and not inclusive):
        raise ValueError(f"{name} must be {'>=' if inclusive else '>'} {lo}, got {value!r}")


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
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class VirtualForward(ScriptedForward):
    """Scripted outputs; time advances by the batch's prefill FLOPs at the
    configured throughput, or by one decode step."""

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
        self.clock.now += flops / self.cfg.prefill_flops_per_s
        return super().prefill(batch)

    def decode(self, batch: list[DecodeStep]) -> list[int]:
        self.clock.now += self.cfg.tpot_s * self.units.tokens_per_out_unit
        return super().decode(batch)


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

    def __post_init__(self) -> None:
        self.units = Units(self.trace)
        self.kv_unit_bytes = self.profile.kv_bytes_per_token * self.units.unit
        self.state_bytes = self.policy.state_bytes(self.profile)
        self.clock = VirtualClock()
        self.cache = self._build_cache()
        self.forward = VirtualForward(self.profile, self.units, self.cfg, self.clock)
        self.scheduler = Scheduler(
            self.cache,
            self.forward,
            self.policy,
            self._scheduler_config(),
            self.clock,
            on_finish=self._record,
        )
        self.policy.attach(self._context())

    # ----------------------------------------------------------------- setup

    def _page_units(self) -> int:
        """The tree's page in units: a page of tokens on token traces; one unit
        on block traces (blocks are whole pages)."""
        page = self.cfg.page_size
        if self.units.unit == 1:
            return page
        if self.units.unit % page:
            raise ValueError(
                f"page_size {page} must divide the trace's {self.units.unit}-token blocks"
            )
        return 1

    def _build_cache(self) -> CacheManager:
        page, budget = self._page_units(), int(self.cfg.memory_gb * 1e9)
        strategy = self.policy.strategy
        if page > 1 and strategy == "no_buffer":
            raise ValueError(
                f"policy {self.policy.name!r} (no_buffer) needs page_size 1; "
                f"page_size {self.cfg.page_size} needs an extra_buffer policy"
            )
        if self.cfg.kv_units is not None and self.cfg.state_slots is not None:
            kv, slots = exact_pools(self.cfg.kv_units, self.cfg.state_slots, page)
        elif self.cfg.sequential:
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
        )

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
            shared_memory=self.cfg.sequential and self.cfg.kv_units is None,
        )

    # ------------------------------------------------------------------- run

    def arrival_times(self) -> list[float]:
        reqs = self.trace.requests
        if self.cfg.rate is None:
            return [r.ts for r in reqs]
        return [i / self.cfg.rate for i in range(len(reqs))]

    def run(self) -> None:
        reqs, times = self.trace.requests, self.arrival_times()
        sched, i = self.scheduler, 0
        while i < len(reqs) or sched.busy:
            while i < len(reqs) and times[i] <= self.clock.now:
                self._submit(i, reqs[i], times[i])
                i += 1
            if not sched.busy:
                self.clock.now = times[i]
                continue
            if sched.step() == STALLED:
                self._drop(sched.waiting[0])
            self._track_peaks()

    def _submit(self, i: int, tr: TraceRequest, at: float) -> None:
        n_out = max(1, len(tr.output_units))
        script = tr.output_units if len(tr.output_units) else tr.input_units[-1:]
        seq = Sequence(tr.input_units, n_out, script=script, id=i, arrival=at)
        self.forward.requests[i] = tr
        self.scheduler.submit(seq)

    def _drop(self, seq: Sequence) -> None:
        self.scheduler.abort(seq)
        self.dropped.append(self.forward.requests.pop(seq.id))

    def _record(self, seq: Sequence) -> None:
        tr = self.forward.requests.pop(seq.id)
        self.admitted.append(tr)
        self.policy.on_request_done()
        hit = self.units.hit_tokens(tr, seq.cached_tokens)
        ttft = (seq.first_token_time or seq.arrival) - seq.arrival
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
            )
        )

    def _track_peaks(self) -> None:
        kv, slots = self.cache.kv, self.cache.slots
        used_kv = kv.capacity - getattr(kv, "free_list_size", kv.available_size)()
        used_slots = slots.capacity - getattr(slots, "free_list_size", slots.available_size)()
        self.peak_kv = max(self.peak_kv, used_kv)
        self.peak_states = max(self.peak_states, used_slots)
