"""The serving model in virtual time.

Requests arrive at their trace timestamps (or at a chosen rate). One prefill
server takes them first come, first served: at admission a request matches its
prompt, locks what it reuses, copies the state, allocates KV for its prompt and
output, and its checkpoints are inserted; the server is then busy for the
prefill FLOPs of the uncached tokens divided by the accelerator's throughput.
The request then decodes (`tpot` seconds per output token), holding its lock
and its KV, and finishes. Memory pressure and concurrency are therefore real:
running requests pin KV and states, and a request that cannot get memory waits
for one to finish. TTFT = queueing + prefill.

Pools: a memory budget split between a KV pool and a state pool
(`state_fraction`, SGLang's mamba_full_memory_ratio style), or with
`sequential=True` Marconi's discipline: one shared byte budget, one request at
a time, each matched and then inserted with its output.

Everything runs on the core tree and the request lifecycle (`CacheManager`);
the state pool is a stand-in that holds nothing (only slot ids matter here).
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Any

from mambaradix.core.tree import MambaRadixCache
from mambaradix.lifecycle import CacheManager, Request
from mambaradix.pools import ReqToTokenTable, StateSlotAllocator, TokenKVAllocator
from mambaradix.replay.models import ModelProfile
from mambaradix.replay.policies import Policy, PolicyContext
from mambaradix.replay.trace import Trace, TraceRequest


@dataclass(frozen=True)
class ServingConfig:
    memory_gb: float
    state_fraction: float = 0.9 / 1.9  # SGLang --mamba-full-memory-ratio 0.9
    prefill_flops_per_s: float = 2.4e15  # 8 H100-class GPUs at ~30% of bf16 dense peak
    tpot_s: float = 0.02
    chunk_tokens: int = 8192  # SGLang's chunked prefill size
    max_running: int = 256
    rate: float | None = None  # requests/s instead of trace timestamps
    sequential: bool = False

    def __post_init__(self) -> None:
        if self.memory_gb <= 0 or not 0 < self.state_fraction < 1:
            raise ValueError("memory_gb must be > 0 and state_fraction in (0, 1)")


class NullStatePool:
    """State contents are irrelevant to hit rates: copies and clears are free."""

    def copy(self, src: Any, dst: Any) -> None:
        pass

    def clear(self, slots: Any) -> None:
        pass


class SharedBudget:
    """One byte budget for KV units and state slots (Marconi's simulator)."""

    def __init__(self, budget: int, kv_unit_bytes: int, state_bytes: int) -> None:
        self.budget, self.kv_unit_bytes, self.state_bytes = budget, kv_unit_bytes, state_bytes
        self.kv_used = self.states_used = 0

    def free_bytes(self) -> int:
        return self.budget - self.kv_used * self.kv_unit_bytes - self.states_used * self.state_bytes


class _BudgetedKV(TokenKVAllocator):
    def __init__(self, size: int, shared: SharedBudget) -> None:
        super().__init__(size)
        self.shared = shared

    def available_size(self) -> int:
        return min(super().available_size(), self.shared.free_bytes() // self.shared.kv_unit_bytes)

    def free_list_size(self) -> int:
        return super().available_size()

    def alloc(self, n: int) -> array[int] | None:
        if n > self.available_size():
            return None
        got = super().alloc(n)
        if got is not None:
            self.shared.kv_used += n
        return got

    def free(self, indices: Any) -> None:
        super().free(indices)
        self.shared.kv_used -= len(indices)


class _BudgetedSlots(StateSlotAllocator):
    def __init__(self, size: int, shared: SharedBudget) -> None:
        super().__init__(size)
        self.shared = shared

    def available_size(self) -> int:
        return min(super().available_size(), self.shared.free_bytes() // self.shared.state_bytes)

    def free_list_size(self) -> int:
        return super().available_size()

    def alloc(self, n: int) -> list[int] | None:
        if n > self.available_size():
            return None
        got = super().alloc(n)
        if got is not None:
            self.shared.states_used += n
        return got

    def free(self, slots: Any) -> None:
        slots = list(slots)
        super().free(slots)
        self.shared.states_used -= len(slots)


@dataclass
class Outcome:
    input_tokens: int
    hit_tokens: int
    ttft_s: float
    flops_saved: float


class Simulator:
    def __init__(self, trace: Trace, profile: ModelProfile, policy: Policy, cfg: ServingConfig):
        self.trace, self.profile, self.policy, self.cfg = trace, profile, policy, cfg
        self.unit = trace.unit_tokens
        self.kv_unit_bytes = profile.kv_bytes_per_token * self.unit
        self.now = 0.0
        self.mgr = self._build_manager()
        policy.attach(
            PolicyContext(
                profile,
                self.unit,
                max(1, cfg.chunk_tokens // self.unit),
                self.kv_unit_bytes,
                self.mgr.kv.capacity,
                self.mgr.slots.capacity,
                self.mgr.slots.available_size,
            )
        )
        self.outcomes: list[Outcome] = []
        self.admitted: list[TraceRequest] = []
        self._pending_stops: dict[int, list[int]] = {}  # decode-time checkpoints per request
        self.dropped = 0
        self.peak_kv = self.peak_states = 0

    def _build_manager(self) -> CacheManager:
        cfg, budget = self.cfg, int(self.cfg.memory_gb * 1e9)
        if cfg.sequential:
            shared = SharedBudget(budget, self.kv_unit_bytes, self.profile.state_bytes)
            kv: TokenKVAllocator = _BudgetedKV(max(1, budget // self.kv_unit_bytes), shared)
            slots: StateSlotAllocator = _BudgetedSlots(
                max(1, budget // self.profile.state_bytes), shared
            )
        else:
            kv_units = int(budget * (1 - cfg.state_fraction)) // self.kv_unit_bytes
            n_slots = int(budget * cfg.state_fraction) // self.profile.state_bytes
            if kv_units < 1 or n_slots < 2:
                raise ValueError(
                    f"{cfg.memory_gb} GB holds {kv_units} KV units and {n_slots} states: too small"
                )
            kv, slots = TokenKVAllocator(kv_units), StateSlotAllocator(n_slots)
        longest = max(len(r.input_units) + len(r.output_units) for r in self.trace.requests)
        rows = 1 if cfg.sequential else cfg.max_running
        tree = MambaRadixCache(page_size=1, chunk_size=1, compat=self.policy.compat)
        return CacheManager(
            tree,
            kv,
            slots,
            NullStatePool(),
            ReqToTokenTable(rows, longest),
            evictor=self.policy.evict,
        )

    # ---------------------------------------------------------------- events

    def run(self) -> None:
        reqs = self.trace.requests
        times = (
            [r.ts for r in reqs]
            if self.cfg.rate is None
            else [i / self.cfg.rate for i in range(len(reqs))]
        )
        events: list[tuple[float, int, int, Any]] = []  # (time, seq, kind, payload)
        seq = 0
        for i, t in enumerate(times):
            events.append((t, seq, 0, i))
            seq += 1
        heapq.heapify(events)
        queue: deque[int] = deque()
        server_free_at = 0.0
        running = 0
        arrival = dict(enumerate(times))
        while events:
            self.now, _, kind, payload = heapq.heappop(events)
            if kind == 0:
                queue.append(payload)
            elif kind == 1:
                self._finish(*payload)
                running -= 1
            while queue and self.now >= server_free_at and running < self._max_running():
                i = queue[0]
                started = self._admit(reqs[i])
                if started is None:
                    if running == 0:  # alone and still no room: it can never run
                        queue.popleft()
                        self.dropped += 1
                        continue
                    break  # wait for a finish to free memory
                queue.popleft()
                req, reserve, prefill_s = started
                server_free_at = self.now + prefill_s
                ttft = server_free_at - arrival[i]
                done = server_free_at + reqs[i].output_tokens * self.cfg.tpot_s
                if self.cfg.sequential:
                    done = server_free_at = self.now  # one at a time, no time model
                self._record(reqs[i], req, ttft)
                running += 1
                heapq.heappush(events, (done, seq, 1, (req, reserve, reqs[i])))
                seq += 1
                if server_free_at > self.now:  # wake up when the server is free again
                    heapq.heappush(events, (server_free_at, seq, 2, None))
                    seq += 1
                    break

    def _max_running(self) -> int:
        return 1 if self.cfg.sequential else self.cfg.max_running

    def _admit(self, tr: TraceRequest) -> tuple[Request, array[int], float] | None:
        mgr = self.mgr
        req = Request(tr.input_units, output_ids=list(tr.output_units))
        if not mgr.admit(req):
            return None
        self.policy.on_admit(mgr.tree, req)
        n_in = len(tr.input_units)
        committed = n_in + max(len(tr.output_units) - 1, 0)
        need = committed - req.computed
        if mgr.kv.available_size() + mgr.tree.full_evictable_size() < need:
            mgr.abort(req)
            return None
        stops = self.policy.stops(req, n_in, committed)
        for stop in (s for s in stops if s <= n_in):
            if not self._extend_to(req, stop):
                return None
            self._checkpoint(req, stop)
        if not self._extend_to(req, n_in):
            return None
        reserve = mgr.alloc_kv(committed - n_in) if committed > n_in else array("q")
        if reserve is None:
            mgr.abort(req)
            return None
        self._pending_stops[id(req)] = [s for s in stops if s > n_in]
        self.admitted.append(tr)
        self._track_peaks()
        hit_tokens = self._hit_tokens(tr, req.cached_len)
        flops = self.profile.prefill_flops(hit_tokens, tr.input_tokens - hit_tokens)
        return req, reserve, flops / self.cfg.prefill_flops_per_s

    def _extend_to(self, req: Request, end: int) -> bool:
        if end > req.computed and self.mgr.extend(req, end - req.computed) is None:
            self.mgr.abort(req)
            return False
        return True

    def _finish(self, req: Request, reserve: array[int], tr: TraceRequest) -> None:
        mgr = self.mgr
        if reserve:
            mgr.kv.free(reserve)
        for stop in self._pending_stops.pop(id(req), []):
            if not self._extend_to(req, stop):
                return
            self._checkpoint(req, stop)
        committed = len(tr.input_units) + max(len(tr.output_units) - 1, 0)
        if not self._extend_to(req, committed):
            return
        insert = self.policy.should_finish_insert(req)
        key = req.tokens[:committed]
        mgr.finish(req, insert=insert)
        if insert:
            node = mgr.tree.peek(key)
            if node is not None:
                self.policy.on_checkpoint(node, committed, True)
        self.policy.on_request_done(req)

    def _checkpoint(self, req: Request, position: int) -> None:
        self.mgr.cache_unfinished(req)
        assert req.lock is not None
        if req.lock.node.state is not None and req.prefix_len == position:
            self.policy.on_checkpoint(req.lock.node, position, False)

    def _hit_tokens(self, tr: TraceRequest, units: int) -> int:
        return min(units * self.unit, tr.input_tokens - 1) if units else 0

    def _record(self, tr: TraceRequest, req: Request, ttft: float) -> None:
        hit = self._hit_tokens(tr, req.cached_len)
        self.outcomes.append(
            Outcome(tr.input_tokens, hit, ttft, self.profile.flops_saved(hit, tr.input_tokens))
        )

    def _track_peaks(self) -> None:
        kv, slots = self.mgr.kv, self.mgr.slots
        self.peak_kv = max(self.peak_kv, kv.capacity - kv.available_size())
        self.peak_states = max(self.peak_states, slots.capacity - slots.available_size())
