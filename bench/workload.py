"""Seeded, serving-like operation sequence for a hybrid (KV + recurrent state) radix cache.

The generator plays an SGLang scheduler serving multi-turn chat:

* ``tenants`` system prompts of 512-2048 tokens; every session belongs to one tenant
  (Zipf-like popularity), so sessions share their tenant's prompt;
* a session is 1-``max_turns`` turns; turn ``t``'s prompt is the previous turn's finished
  sequence plus 50-600 new user tokens, and the finished sequence adds 50-600 output tokens;
* ``concurrency`` sessions are in flight at once and advance in random order, so the locks of
  different requests overlap;
* between request steps, matches of random cuts of sequences seen so far (prefix probes);
* now and then a request whose prompt is exactly a system prompt, so the state after the
  system prompt gets cached (SGLang checkpoints it at the branching point in practice).

Each turn is the op sequence SGLang's scheduler issues (page_size 1, no extra buffer):

    admit:      MATCH(prompt[:-1]) -> slot a      (max prefix = len - 1)
                LOCK(slot a) -> handle h1
                EVICT_CHECK                       (allocating the request's KV)
    prefilled:  INSERT(prompt, slot a)            (cache_unfinished_req: prev_prefix_len =
                                                   a.prefix_len, values = a's indices + fresh)
                MATCH(prompt) -> slot b           (the re-match of cache_unfinished_req)
                UNLOCK(h1); LOCK(slot b) -> h2
    finished:   INSERT(prompt + output, slot b)   (cache_finished_req)
                UNLOCK(h2)
                EVICT_CHECK

The op list is flat and data-only (tuples of ints), so every cache replays exactly the same
list. Results that depend on the cache (matched lengths and indices, nodes, lock receipts) live
in per-replay tables: ops name a match *slot* or a lock *handle* by index.

Op tuples (first field is the opcode):

    (MATCH, seq, length, slot)               key = seqs[seq][:length]; slot -1: result unused
    (LOCK, slot, handle)                     lock the node of the match in `slot`
    (UNLOCK, handle)
    (INSERT, seq, length, slot, kv_base, state)
        key = seqs[seq][:length]; prev_prefix_len = slot's prefix_len; values = the slot's
        matched indices, then kv_base + i for positions i >= prev_prefix_len; frees the slot
    (EVICT_CHECK,)                           if the cache holds more than kv_budget tokens or
                                             state_budget states, evict the excess

Keys are ``array('q')`` token sequences; ``seqs`` holds one growing stream per session (and
one per system prompt), and every key is a prefix of one stream.
"""

from __future__ import annotations

import random
from array import array
from dataclasses import dataclass, field

MATCH, LOCK, UNLOCK, INSERT, EVICT_CHECK = range(5)
OP_NAMES = ("match", "lock", "unlock", "insert", "evict")

VOCAB = 32_000


@dataclass
class WorkloadConfig:
    seed: int = 0
    n_ops: int = 40_000  # approximate: the last turn in flight is completed
    tenants: int = 8
    sys_min: int = 512
    sys_max: int = 2048
    turn_min: int = 50  # new user tokens per turn, and output tokens per turn
    turn_max: int = 600
    max_turns: int = 8
    concurrency: int = 16
    p_cut_match: float = 0.25  # per step: a random-cut prefix probe instead of a request step
    p_sys_checkpoint: float = 0.05  # per new session: first cache the system prompt's state
    kv_budget: int = 120_000  # tokens the simulated KV pool may keep in the tree
    state_budget: int = 192  # states the simulated state pool may keep in the tree


@dataclass
class Workload:
    config: WorkloadConfig
    seqs: list[array[int]]
    ops: list[tuple[int, ...]]
    n_slots: int
    n_handles: int
    stats: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        c = self.config
        s = self.stats
        return (
            f"seed={c.seed} ops={len(self.ops)} tenants={c.tenants} sys={c.sys_min}-{c.sys_max} "
            f"turn+={c.turn_min}-{c.turn_max} max_turns={c.max_turns} "
            f"concurrency={c.concurrency} cut_frac={c.p_cut_match} kv_budget={c.kv_budget} "
            f"state_budget={c.state_budget} sessions={s.get('sessions', 0)} "
            f"turns={s.get('turns', 0)} "
            f"max_key={s.get('max_key', 0)} mean_insert_key={s.get('mean_insert_key', 0)}"
        )


class _Session:
    __slots__ = ("seq", "bounds", "turn", "phase", "slot", "handle")

    def __init__(self, seq: int, bounds: list[tuple[int, int]]) -> None:
        self.seq = seq
        self.bounds = bounds  # per turn: (prompt length, finished length)
        self.turn = 0
        self.phase = 0  # 0: admit, 1: prefilled, 2: finished
        self.slot = -1
        self.handle = -1


class _Ids:
    """Small integer ids with reuse, so replay tables stay small."""

    def __init__(self) -> None:
        self.free: list[int] = []
        self.size = 0

    def take(self) -> int:
        if self.free:
            return self.free.pop()
        self.size += 1
        return self.size - 1

    def give(self, i: int) -> None:
        self.free.append(i)


def _tokens(rng: random.Random, n: int) -> array[int]:
    return array("q", [rng.randrange(VOCAB) for _ in range(n)])


def generate(config: WorkloadConfig | None = None) -> Workload:
    c = config or WorkloadConfig()
    rng = random.Random(c.seed)
    seqs: list[array[int]] = []
    ops: list[tuple[int, ...]] = []
    slots, handles = _Ids(), _Ids()
    kv_next = 1 << 20
    state_next = 1
    stats = {"sessions": 0, "turns": 0, "max_key": 0, "insert_tokens": 0, "inserts": 0}

    sys_seq = []
    for _ in range(c.tenants):
        seqs.append(_tokens(rng, rng.randint(c.sys_min, c.sys_max)))
        sys_seq.append(len(seqs) - 1)
    weights = [1.0 / (i + 1) for i in range(c.tenants)]  # Zipf-like tenant popularity
    recent: list[int] = []  # streams probed by random-cut matches

    def insert(seq: int, length: int, slot: int) -> None:
        nonlocal kv_next, state_next
        ops.append((INSERT, seq, length, slot, kv_next, state_next))
        kv_next += length
        state_next += 1
        slots.give(slot)
        stats["inserts"] += 1
        stats["insert_tokens"] += length
        stats["max_key"] = max(stats["max_key"], length)

    def sys_checkpoint(tenant: int) -> None:
        seq = sys_seq[tenant]
        n = len(seqs[seq])
        s, h = slots.take(), handles.take()
        ops.append((MATCH, seq, n - 1, s))
        ops.append((LOCK, s, h))
        ops.append((EVICT_CHECK,))
        insert(seq, n, s)
        ops.append((UNLOCK, h))
        handles.give(h)

    def new_session() -> _Session:
        tenant = rng.choices(range(c.tenants), weights)[0]
        if rng.random() < c.p_sys_checkpoint:
            sys_checkpoint(tenant)
        stream = array("q", seqs[sys_seq[tenant]])
        bounds = []
        for _ in range(rng.randint(1, c.max_turns)):
            stream += _tokens(rng, rng.randint(c.turn_min, c.turn_max))
            prompt = len(stream)
            stream += _tokens(rng, rng.randint(c.turn_min, c.turn_max))
            bounds.append((prompt, len(stream)))
        seqs.append(stream)
        recent.append(len(seqs) - 1)
        if len(recent) > 256:
            recent.pop(0)
        stats["sessions"] += 1
        return _Session(len(seqs) - 1, bounds)

    def step(s: _Session) -> bool:
        """Advance one request step; True when the session has finished its last turn."""
        prompt, finished = s.bounds[s.turn]
        if s.phase == 0:  # admit
            s.slot, s.handle = slots.take(), handles.take()
            ops.append((MATCH, s.seq, prompt - 1, s.slot))
            ops.append((LOCK, s.slot, s.handle))
            ops.append((EVICT_CHECK,))
            s.phase = 1
            return False
        if s.phase == 1:  # prefill done: cache_unfinished_req
            insert(s.seq, prompt, s.slot)
            s.slot, h2 = slots.take(), handles.take()
            ops.append((MATCH, s.seq, prompt, s.slot))
            ops.append((UNLOCK, s.handle))
            handles.give(s.handle)
            ops.append((LOCK, s.slot, h2))
            s.handle = h2
            s.phase = 2
            return False
        insert(s.seq, finished, s.slot)  # cache_finished_req
        ops.append((UNLOCK, s.handle))
        handles.give(s.handle)
        ops.append((EVICT_CHECK,))
        s.slot = s.handle = -1
        s.phase = 0
        s.turn += 1
        stats["turns"] += 1
        return s.turn == len(s.bounds)

    for t in range(c.tenants):  # tenants' first requests warm the tree
        sys_checkpoint(t)
    active = [new_session() for _ in range(c.concurrency)]
    while len(ops) < c.n_ops or any(s.phase for s in active):
        if len(ops) >= c.n_ops:  # drain: finish the turns in flight, start nothing new
            busy = [i for i, s in enumerate(active) if s.phase]
            i = rng.choice(busy)
            step(active[i])
            continue
        if recent and rng.random() < c.p_cut_match:
            seq = rng.choice(recent)
            ops.append((MATCH, seq, rng.randint(1, len(seqs[seq])), -1))
            continue
        i = rng.randrange(len(active))
        if step(active[i]):
            active[i] = new_session()

    stats["mean_insert_key"] = stats["insert_tokens"] // max(1, stats["inserts"])
    return Workload(c, seqs, ops, slots.size, handles.size, stats)


def op_counts(ops: list[tuple[int, ...]]) -> dict[str, int]:
    counts = dict.fromkeys(OP_NAMES, 0)
    for op in ops:
        counts[OP_NAMES[op[0]]] += 1
    return counts


if __name__ == "__main__":
    import time

    t0 = time.perf_counter()
    w = generate()
    print(f"generated in {time.perf_counter() - t0:.2f}s: {w.describe()}")
    print(op_counts(w.ops), "slots", w.n_slots, "handles", w.n_handles)
