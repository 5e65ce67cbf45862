"""The same ``Scheduler`` over two caches, in lockstep: ``CacheManager`` on
``MambaRadixCache(compat=<release>)`` (ours) and that release's own code (``UpstreamLifecycle``:
SGLang 0.5.15.post1, see ``upstream_lifecycle``; ``UpstreamLifecycle0523``: 0.5.23, see
``upstream_lifecycle_0523``), fed the same seeded request stream.

After every scheduler step both sides must agree on: what the step did, the queues (waiting,
part-way through prefill, decoding), every in-flight request's computed / protected / cached
lengths, the tree's full and state evictable and protected sizes, and the free KV indices, state
slots and rows; every request that finishes or is aborted must report the same cached length
(``Sequence.cached_tokens``). The first difference raises ``AssertionError`` naming the config,
the seed, the step and the request.

A stream (``StreamShape``) mixes multi-turn sessions that share a few system prompts, single
requests that share only a system prompt, identical re-sends of a recent prompt, requests that
finish with their first token, and aborts of a request part-way through its chunked prefill,
while decoding (under SGLang's rules it then runs one more step and finishes, cached) and while
waiting. Pool sizes (``Config``) are small so that KV and state eviction and decode retraction
happen.
"""

from __future__ import annotations

import dataclasses
import operator
import random
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lifecycle_oracle import DriverMismatch
from mambaradix.core.tree import MambaRadixCache
from mambaradix.lifecycle import CacheManager
from mambaradix.policies import SGLang
from mambaradix.pools import (
    FingerprintStatePool,
    PagedKVAllocator,
    ReqToTokenTable,
    StateSlotAllocator,
    TokenKVAllocator,
)
from mambaradix.scheduler import (
    SchedulerConfig,
    ScriptedForward,
    Sequence,
)
from mambaradix.scheduler.loop import STALLED, Scheduler
from mambaradix.scheduler.sequence import ABORTED, FINISHED
from upstream_lifecycle import UpstreamLifecycle


@dataclass(frozen=True)
class Config:
    """One cache and scheduler setup (SGLang server arguments of the same meaning)."""

    name: str
    strategy: str = "no_buffer"
    page: int = 1
    chunk: int = 64  # mamba_cache_chunk_size (the tree's chunk_size)
    chunk_tokens: int | None = 61  # --chunked-prefill-size
    kv_tokens: int = 2400
    state_slots: int = 14
    rows: int = 6  # --max-running-requests and the request table
    track_slots: int = 2  # ping-pong size (2: SGLang with its overlap scheduler)
    track_interval: int = 64  # --mamba-track-interval
    max_prefill_tokens: int = 16384
    max_context: int = 2048


@dataclass(frozen=True)
class StreamShape:
    """How a seeded request stream looks."""

    requests: int = 1200
    sessions: int = 10
    systems: int = 3
    vocab: int = 5000
    system_len: tuple[int, int] = (20, 180)
    user_len: tuple[int, int] = (5, 120)
    answer_len: tuple[int, int] = (2, 40)
    first_token_finish: float = 0.15  # share of requests with max_new_tokens == 1
    single: float = 0.25  # share of one-off requests (system prompt + user text)
    resend: float = 0.1  # share of identical re-sends of a recent prompt
    arrivals: tuple[int, ...] = (0, 0, 0, 1, 1, 2, 3)  # new requests per step, drawn
    abort_prefill: float = 0.04  # per step: abort one request part-way through its prefill
    abort_decode: float = 0.02  # per step: abort one decoding request
    abort_waiting: float = 0.01  # per step: abort one waiting request
    history_cap: int = 1200  # a session restarts when its history grows past this
    wait_for_sessions: bool = False  # no session idle: no arrival (else a one-off request)
    namespaced: float = 0.2  # share of sessions and one-off requests with an extra key


@dataclass
class Side:
    name: str
    cache: Any
    sched: Scheduler
    seqs: dict[int, Sequence] = field(default_factory=dict)
    done: list[Sequence] = field(default_factory=list)  # finished in the current step


SGLANG_0_5_15, SGLANG_0_5_23 = "sglang-0.5.15.post1", "sglang-0.5.23"


def lead_side(cfg: Config, release: str = SGLANG_0_5_15) -> Side:
    tree = MambaRadixCache(page_size=cfg.page, chunk_size=cfg.chunk, compat=release)
    kv: Any = TokenKVAllocator(cfg.kv_tokens)
    if cfg.page > 1:
        kv = PagedKVAllocator(cfg.kv_tokens, cfg.page)
    cache = CacheManager(
        tree,
        kv,
        StateSlotAllocator(cfg.state_slots),
        FingerprintStatePool(cfg.state_slots),
        ReqToTokenTable(cfg.rows, cfg.max_context),
        strategy=cfg.strategy,
        track_slots=cfg.track_slots,
    )
    return _side("ours", cache, cfg)


def upstream_side(cfg: Config, release: str = SGLANG_0_5_15) -> Side:
    oracle: Any = UpstreamLifecycle
    if release == SGLANG_0_5_23:
        from upstream_lifecycle_0523 import UpstreamLifecycle0523

        oracle = UpstreamLifecycle0523
    cache = oracle(
        kv_tokens=cfg.kv_tokens,
        state_slots=cfg.state_slots,
        rows=cfg.rows,
        max_context=cfg.max_context,
        page_size=cfg.page,
        chunk_size=cfg.chunk,
        strategy=cfg.strategy,
        track_slots=cfg.track_slots,
        track_interval=cfg.track_interval,
    )
    return _side("sglang", cache, cfg)


def _side(name: str, cache: Any, cfg: Config) -> Side:
    sched_cfg = SchedulerConfig(
        chunk_tokens=cfg.chunk_tokens,
        max_running=cfg.rows,
        max_prefill_tokens=cfg.max_prefill_tokens,
        track_interval=cfg.track_interval,
    )
    side = Side(name, cache, None)  # type: ignore[arg-type]
    side.sched = Scheduler(
        cache, ScriptedForward(), SGLang(), sched_cfg, lambda: 0.0, side.done.append
    )
    return side


# --------------------------------------------------------------------------- the stream


@dataclass
class _Session:
    system: array[int]
    history: array[int]
    extra_key: str | None  # a namespace (LoRA adapter, cache salt): hits only within it
    busy: int | None = None  # id of the turn in flight


@dataclass(frozen=True)
class Arrival:
    prompt: array[int]
    max_new: int
    script: array[int]
    extra_key: str | None
    id: int = -1


class Stream:
    """Seeded request arrivals: each call to ``arrivals()`` gives the requests of one step."""

    def __init__(self, shape: StreamShape, seed: int) -> None:
        self.shape, self.rng = shape, random.Random(seed)
        self.systems = [self._tokens(*shape.system_len) for _ in range(shape.systems)]
        self.sessions = [
            _Session(self.rng.choice(self.systems), array("q"), self._namespace())
            for _ in range(shape.sessions)
        ]
        self.recent: list[Arrival] = []
        self.submitted = 0
        self.turn_of: dict[int, tuple[_Session, int]] = {}  # id -> session, answer length

    def _tokens(self, lo: int, hi: int) -> array[int]:
        n = self.rng.randint(lo, hi)
        return array("q", (self.rng.randrange(self.shape.vocab) for _ in range(n)))

    def _namespace(self) -> str | None:
        if self.rng.random() < self.shape.namespaced:
            return self.rng.choice(("adapter-a", "adapter-b"))
        return None

    @property
    def exhausted(self) -> bool:
        return self.submitted >= self.shape.requests

    def arrivals(self) -> list[Arrival]:
        out = []
        for _ in range(self.rng.choice(self.shape.arrivals)):
            if self.exhausted:
                break
            got = self._next()
            if got is None:
                continue
            out.append(dataclasses.replace(got, id=self.submitted))
            self.recent = (self.recent + [got])[-8:]
            self.submitted += 1
        return out

    def _next(self) -> Arrival | None:
        s, rng = self.shape, self.rng
        max_new = 1 if rng.random() < s.first_token_finish else rng.randint(*s.answer_len)
        script = self._tokens(max_new, max_new)
        roll = rng.random()
        if roll < s.resend and self.recent:
            return rng.choice(self.recent)
        idle = [x for x in self.sessions if x.busy is None]
        if not idle and s.wait_for_sessions:
            return None
        if roll < s.resend + s.single or not idle:
            prompt = rng.choice(self.systems) + self._tokens(*s.user_len)
            return Arrival(prompt, max_new, script, self._namespace())
        sess = rng.choice(idle)
        if len(sess.history) > s.history_cap:
            sess.system, sess.history = rng.choice(self.systems), array("q")
        prompt = sess.system + sess.history + self._tokens(*s.user_len)
        sess.busy = self.submitted
        self.turn_of[self.submitted] = (sess, max_new)
        sess.history = prompt[len(sess.system) :] + script[:max_new]
        return Arrival(prompt, max_new, script, sess.extra_key)

    def ended(self, seq_id: int, finished: bool) -> None:
        """A request left the system; its session may send the next turn."""
        turn = self.turn_of.pop(seq_id, None)
        if turn is not None:
            sess, answer = turn
            sess.busy = None
            if not finished:  # the answer never came: the next turn follows the prompt only
                sess.history = sess.history[: len(sess.history) - answer]


# --------------------------------------------------------------------------- lockstep


@dataclass
class Outcome:
    requests: int = 0
    steps: int = 0
    finished: int = 0
    aborted: Counter[str] = field(default_factory=Counter)
    retractions: int = 0
    cached_tokens: int = 0
    prompt_tokens: int = 0
    crashes: Counter[str] = field(default_factory=Counter)
    worked_around: Counter[str] = field(default_factory=Counter)


CACHED, PREFILL_ABORTS, RETRACTIONS = "cached", "prefill aborts", "retractions"


def check_outcome(out: Outcome, shape: StreamShape, expects: tuple[str, ...]) -> None:
    """A run of ``shape`` served every request, SGLang would not have stopped (no crashes),
    and it held what it is there to test (``expects``) plus aborts while decoding and waiting."""
    assert out.requests == shape.requests
    assert out.finished + sum(out.aborted.values()) == shape.requests
    assert not out.crashes, f"SGLang itself would have stopped: {dict(out.crashes)}"
    seen = {
        CACHED: out.cached_tokens,
        PREFILL_ABORTS: out.aborted["prefill"],
        RETRACTIONS: out.retractions,
        "decode aborts": out.aborted["decode"],
        "waiting aborts": out.aborted["waiting"],
    }
    for what in (*expects, "decode aborts", "waiting aborts"):
        assert seen[what] > 0, f"the stream has no {what}: {seen}"


def run_lockstep(
    cfg: Config,
    shape: StreamShape,
    seed: int,
    check_every: int = 64,
    release: str = SGLANG_0_5_15,
) -> Outcome:
    """Serve one seeded stream on both sides (``release``: our compat and the oracle), comparing
    after every step."""
    a, b = lead_side(cfg, release), upstream_side(cfg, release)
    stream, rng = Stream(shape, seed), random.Random(seed ^ 0x5EED)
    out = Outcome()
    where = f"{release} config {cfg.name} seed {seed}"
    while not stream.exhausted or a.sched.busy or b.sched.busy:
        for new in stream.arrivals():
            for side in (a, b):
                seq = Sequence(
                    array("q", new.prompt),
                    new.max_new,
                    new.extra_key,
                    script=array("q", new.script),
                    id=new.id,
                )
                side.seqs[new.id] = seq
                side.sched.submit(seq)
        _maybe_abort(a, b, shape, rng, stream, out)
        try:
            kinds = (a.sched.step(), b.sched.step())
        except DriverMismatch as e:
            who = [i for i, q in b.seqs.items() if q.req is e.req]
            raise AssertionError(f"{where} step {out.steps + 1}, request {who}: {e}") from e
        out.steps += 1
        _compare(a, b, kinds, f"{where} step {out.steps}")
        for seq in a.done:  # finished, or aborted while decoding (then finished a step later)
            stream.ended(seq.id, finished=seq.status == FINISHED)
            out.finished += seq.status == FINISHED
            out.cached_tokens += seq.cached_tokens
            out.prompt_tokens += seq.prompt_tokens
        a.done.clear()
        b.done.clear()
        if out.steps % check_every == 0:
            _check_conservation(a, b, f"{where} step {out.steps}")
        if kinds[0] == STALLED:
            raise AssertionError(f"{where} step {out.steps}: stalled (pools too small)")
    _check_conservation(a, b, f"{where} end")
    out.requests = stream.submitted
    out.retractions = sum(s.retractions for s in a.seqs.values())
    out.crashes = b.cache.crashes
    out.worked_around = b.cache.worked_around
    return out


def _maybe_abort(
    a: Side, b: Side, shape: StreamShape, rng: random.Random, stream: Stream, out: Outcome
) -> None:
    """Abort at most one request per queue, chosen the same way on both sides."""
    queues: list[tuple[str, float, Callable[[Scheduler], list[Sequence]]]] = [
        ("prefill", shape.abort_prefill, lambda s: s.prefilling),
        ("decode", shape.abort_decode, lambda s: s.running),
        ("waiting", shape.abort_waiting, lambda s: s.waiting),
    ]
    for kind, p, queue in queues:
        # the draw first, as before (one draw per queue per step), the candidates only when
        # it hits: sorting a long waiting queue every step was a quarter of the run
        if rng.random() >= p:
            continue
        candidates = sorted(s.id for s in queue(a.sched) if not s.to_finish)
        if not candidates:
            continue
        victim = rng.choice(candidates)
        for side in (a, b):
            side.sched.abort(side.seqs[victim])
        if a.seqs[victim].status == ABORTED:  # a decoding one finishes after one more step
            stream.ended(victim, finished=False)
        out.aborted[kind] += 1
        got = (a.seqs[victim].cached_tokens, b.seqs[victim].cached_tokens)
        if got[0] != got[1]:
            raise AssertionError(f"aborted request {victim}: cached tokens {got}")


_ID = operator.attrgetter("id")  # ids of a queue: map() is about 2x a comprehension


def _state(side: Side) -> dict[str, Any]:
    s, c = side.sched, side.cache
    return {
        "waiting": list(map(_ID, s.waiting)),
        "prefilling": list(map(_ID, s.prefilling)),
        "running": list(map(_ID, s.running)),
        "full evictable": c.tree.full_evictable_size(),
        "full protected": c.tree.full_protected_size(),
        "state evictable": c.tree.state_evictable_size(),
        "state protected": c.tree.state_protected_size(),
        "free KV": c.kv.available_size(),
        "free state slots": c.slots.available_size(),
        "free rows": c.rows.available_size(),
    }


def _requests(side: Side) -> dict[int, tuple[int, ...]]:
    """Per in-flight request: computed, protected and cached lengths, outputs, retractions."""
    s = side.sched
    return {
        q.id: (q.req.computed, q.req.prefix_len, q.req.cached_len, len(q.outputs), q.retractions)
        for q in s.prefilling + s.running
    }


def _compare(a: Side, b: Side, kinds: tuple[str, str], where: str) -> None:
    if kinds[0] != kinds[1]:
        raise AssertionError(f"{where}: ours ran {kinds[0]}, SGLang {kinds[1]}")
    for seq in a.done:
        other = b.seqs[seq.id]
        got = (seq.cached_tokens, seq.prompt_tokens, seq.retractions)
        want = (other.cached_tokens, other.prompt_tokens, other.retractions)
        if got != want or other.status != seq.status:
            raise AssertionError(
                f"{where}: request {seq.id} finished with (cached, prompt, retractions) "
                f"{got}, SGLang {want}"
            )
    sa, sb = _state(a), _state(b)
    for key in sa:
        if sa[key] != sb[key]:
            raise AssertionError(f"{where}: {key} ours {sa[key]}, SGLang {sb[key]}")
    ra, rb = _requests(a), _requests(b)
    for sid in ra:
        if ra[sid] != rb[sid]:
            raise AssertionError(
                f"{where}: request {sid} (computed, protected, cached, outputs, retractions) "
                f"ours {ra[sid]}, SGLang {rb[sid]}"
            )


def _check_conservation(a: Side, b: Side, where: str) -> None:
    for side in (a, b):
        try:
            side.cache.check_conservation()
        except AssertionError as e:
            raise AssertionError(f"{where}: {side.name} conservation: {e}") from e
