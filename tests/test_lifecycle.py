"""The request lifecycle (`CacheManager`) driven by the scheduler, over a stand-in
model: copy-on-write, checkpoints, donation, both strategies at page sizes 1,
16 and 64, eviction under pressure, aborts, retractions and injected failures,
without leaks (conservation and every state's fingerprint checked after every
step)."""

from __future__ import annotations

import random
from array import array

import numpy as np
import pytest

from driving import (
    CONFIGS,
    Job,
    check_everything,
    drive,
    make_manager,
    make_scheduler,
    multi_turn_jobs,
    sequence,
    tree_snapshot,
)
from mambaradix.lifecycle import CacheManager, Request
from mambaradix.pools import TokenKVAllocator


def serve(mgr, pool, prompt, answer=(7, 8, 9), chunk=16):  # type: ignore[no-untyped-def]
    """One request alone through the scheduler; its cached length."""
    sched = make_scheduler(mgr, pool, chunk=chunk)
    seq = sequence(Job(list(prompt), list(answer)))
    sched.submit(seq)
    sched.run()
    check_everything(mgr, pool)
    return seq.cached_tokens


@pytest.mark.parametrize(
    "compat,chunk,expected",
    [
        (None, 64, 39),
        ("sglang-0.5.15.post1", 64, 0),
        ("sglang-0.5.23", 64, 0),  # the single-output prompt-end rule is unchanged in 0.5.23
        (None, 16, 39),
        ("sglang-0.5.15.post1", 16, 32),
        ("sglang-0.5.23", 16, 32),
    ],
)
def test_identical_resent_prompt_hits(compat: str | None, chunk: int, expected: int) -> None:
    """#22935: upstream's input-1 lookup misses the prompt-end state, so an
    identical prompt falls back to the last chunk checkpoint (0 with one
    chunk, 32 = the second 16-token chunk end otherwise); ours checkpoints at
    input-1 and reuses all but the last token."""
    mgr, pool = make_manager(kv_tokens=1000, state_slots=16, compat=compat)
    prompt = list(range(100, 140))
    assert serve(mgr, pool, prompt, chunk=chunk) == 0
    assert serve(mgr, pool, prompt, chunk=chunk) == expected


def test_next_turn_reuses_prompt_and_answer() -> None:
    mgr, pool = make_manager(kv_tokens=1000, state_slots=16)
    prompt, answer = list(range(100, 140)), [7, 8, 9]
    serve(mgr, pool, prompt, answer)
    # The finished state sits after prompt + answer[:-1] (the last answer token
    # has no KV yet), so the next turn reuses exactly that much.
    assert serve(mgr, pool, prompt + answer + [1, 2, 3]) == len(prompt) + len(answer) - 1


def test_copy_on_write_leaves_cached_state_untouched() -> None:
    mgr, pool = make_manager(kv_tokens=1000, state_slots=16)
    prompt = list(range(50))
    serve(mgr, pool, prompt)
    req = Request(array("q", prompt + [1, 2]), output_ids=array("q", [5]))
    assert mgr.match(req, req.total_len - 1)
    mgr.lock(req)
    node = req.node
    # The first request cached its state at input - 1 = 49 (and its finished
    # sequence, which diverges at 50): the new prompt reuses 49.
    assert node is not None and node.state is not None and req.cached_len == 49
    src_fp = pool.fingerprint(node.state)
    assert mgr.alloc_extend([req], [req.total_len - req.computed])
    assert req.slot != node.state and pool.fingerprint(req.slot) == src_fp
    pool.advance(req.slot, req.tokens[49 : req.computed])
    assert pool.fingerprint(node.state) == src_fp  # the request advanced its own copy
    check_everything(mgr, pool)
    mgr.abort(req)
    check_everything(mgr, pool)


def test_abort_after_admission_leaks_nothing() -> None:
    """#12693 / #16067 / #21404: a request dropped between match and the end
    of its prefill gives back its slot, its private KV and its lock."""
    mgr, pool = make_manager(kv_tokens=500, state_slots=8)
    serve(mgr, pool, list(range(60)))
    free_kv, free_slots = mgr.kv.available_size(), mgr.slots.available_size()
    for stage in ("matched", "locked", "admitted"):
        req = Request(array("q", list(range(60)) + [1, 2, 3, 4]))
        assert mgr.match(req, req.total_len - 1) and req.slot is not None
        if stage != "matched":
            mgr.lock(req)
        if stage == "admitted":
            assert mgr.alloc_extend([req], [3])
        mgr.abort(req)
        check_everything(mgr, pool)
        assert (mgr.kv.available_size(), mgr.slots.available_size()) == (free_kv, free_slots)
        assert mgr.tree.full_protected_size() == 0 and mgr.tree.state_protected_size() == 0
        assert req.row is None and req.slot is None and req.lock is None


def test_refused_admission_holds_nothing() -> None:
    """A request matched but refused (no row left) gives its staged slot back."""
    mgr, pool = make_manager(kv_tokens=500, state_slots=4, rows=1)
    serve(mgr, pool, list(range(10)))
    a = Request(array("q", list(range(10)) + [1]))
    b = Request(array("q", list(range(10)) + [2]))
    for req in (a, b):
        assert mgr.match(req, req.total_len - 1)
        mgr.lock(req)
    assert mgr.alloc_extend([a], [1])
    assert not mgr.alloc_extend([b], [1])  # no row left: nothing taken
    assert b.row is None and b.lock is not None and b.slot is not None
    mgr.abort(b)
    mgr.abort(a)
    check_everything(mgr, pool)
    assert mgr.slots.available_size() + mgr.tree.total_size()[1] == 4


def test_failed_kv_allocation_gives_back_rows_and_slots() -> None:
    """alloc_extend is all or nothing: when KV cannot be had after eviction,
    the rows and slots it took for the batch go back."""
    mgr, pool = make_manager(kv_tokens=40, state_slots=8)
    reqs = [Request(array("q", range(i * 100, i * 100 + 30))) for i in range(2)]
    for req in reqs:
        assert mgr.match(req, 29)
        mgr.lock(req)
    before = (mgr.kv.available_size(), mgr.slots.available_size(), mgr.rows.available_size())
    assert not mgr.alloc_extend(reqs, [30, 30])  # 60 tokens > 40
    after = (mgr.kv.available_size(), mgr.slots.available_size(), mgr.rows.available_size())
    assert before == after
    assert all(r.row is None and r.slot is None for r in reqs)
    for req in reqs:
        mgr.abort(req)
    check_everything(mgr, pool)


class FlakyKV(TokenKVAllocator):
    """Fails a seeded random share of allocations: injected allocation failures."""

    def __init__(self, size: int, rate: float, seed: int) -> None:
        super().__init__(size)
        self.rate, self.rng, self.failures = rate, random.Random(seed), 0

    def alloc(self, n: int) -> array[int] | None:
        if self.rng.random() < self.rate:
            self.failures += 1
            return None
        return super().alloc(n)


@pytest.mark.parametrize("seed", [0, 1])
def test_injected_allocation_failures_leak_nothing(seed: int) -> None:
    mgr, pool = make_manager(kv_tokens=600, state_slots=12, rows=6)
    mgr.kv = flaky = FlakyKV(600, 0.15, seed)
    mgr.tree.attach_kv_owner(flaky)  # the pool that owns the slots answers for them
    sched = make_scheduler(mgr, pool, chunk=32, running=6)
    seqs = drive_with_stall_retry(sched, pool, multi_turn_jobs(3, sessions=5, turns=3))
    assert flaky.failures > 0 and all(s.status == "finished" for s in seqs)
    check_everything(mgr, pool)
    assert not mgr.active and not mgr.staged


def drive_with_stall_retry(sched, pool, jobs):  # type: ignore[no-untyped-def]
    """Like `drive`, without random aborts; a stalled head (a refused batch
    with nothing running) is retried, as the failures are transient."""
    seqs = []
    for i, job in enumerate(jobs):
        seqs.append(sequence(job, i))
        sched.submit(seqs[-1])
    for _ in range(100_000):
        if not sched.busy:
            return seqs
        sched.step()
        check_everything(sched.cache, pool)
    raise AssertionError("no progress")


class ExplodingForward:
    """Raises on the n-th forward (after memory was allocated for it)."""

    def __init__(self, inner, n: int) -> None:  # type: ignore[no-untyped-def]
        self.inner, self.n = inner, n

    def _tick(self) -> None:
        self.n -= 1
        if self.n == 0:
            raise RuntimeError("injected forward failure")

    def pass_steps(self, n: int) -> None:
        self.inner.pass_steps(n)

    def prefill(self, batch):  # type: ignore[no-untyped-def]
        self._tick()
        return self.inner.prefill(batch)

    def decode(self, batch):  # type: ignore[no-untyped-def]
        self._tick()
        return self.inner.decode(batch)


@pytest.mark.parametrize("strategy,page", CONFIGS)
@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_exception_from_the_forward_then_abort_leaks_nothing(
    strategy: str, page: int, n: int
) -> None:
    mgr, pool = make_manager(kv_tokens=2048, state_slots=24, strategy=strategy, page=page)
    sched = make_scheduler(mgr, pool, chunk=max(32, page))
    sched.forward = ExplodingForward(sched.forward, n)
    seqs = [sequence(j, i) for i, j in enumerate(multi_turn_jobs(5, sessions=4, turns=2))]
    for seq in seqs:
        sched.submit(seq)
    with pytest.raises(RuntimeError, match="injected"):
        sched.run()
    for seq in seqs:  # what a caller (the engine) does after a failed call
        sched.abort(seq)
    check_everything(mgr, pool)
    assert not mgr.active and not mgr.staged and not sched.busy
    assert mgr.tree.full_protected_size() == 0 and mgr.tree.state_protected_size() == 0


@pytest.mark.parametrize("compat", [None, "sglang-0.5.15.post1"])  # 0.5.23: its differential
@pytest.mark.parametrize("strategy,page", CONFIGS)
def test_randomized_runs_conserve_memory_at_every_step(
    compat: str | None, strategy: str, page: int
) -> None:
    """Interleaved multi-turn requests through pools small enough to force KV
    eviction, state tombstoning and leaf deletion, with random aborts
    (waiting, mid-prefill, decoding); checked after every step."""
    totals = {"kv_tokens": 0, "states": 0, "cached": 0, "aborted": 0, "finished": 0}
    for seed in range(3):
        kv = 1024 if page < 64 else 2048
        mgr, pool = make_manager(kv, 16, rows=5, compat=compat, strategy=strategy, page=page)
        sched = make_scheduler(mgr, pool, chunk=48 if page == 1 else 64, running=4)
        seqs = drive(sched, pool, multi_turn_jobs(seed, sessions=5, turns=4), seed)
        assert not mgr.active and not mgr.staged
        assert mgr.kv.available_size() + mgr.tree.total_size()[0] == kv
        assert mgr.slots.available_size() + mgr.tree.total_size()[1] == 16
        totals["kv_tokens"] += mgr.evictions["kv_tokens"]
        totals["states"] += mgr.evictions["states"]
        totals["cached"] += sum(s.cached_tokens for s in seqs)
        totals["aborted"] += sum(s.status == "aborted" for s in seqs)
        totals["finished"] += sum(s.status == "finished" for s in seqs)
    assert all(v > 0 for v in totals.values()), f"a path was never exercised: {totals}"


def test_retraction_requeues_and_recomputes() -> None:
    """Long outputs admitted optimistically (the new-token ratio reserves 70%
    of them) run out of KV while decoding: requests are retracted, their
    memory returned, and served again later with their outputs kept."""
    mgr, pool = make_manager(kv_tokens=400, state_slots=16, rows=8)
    sched = make_scheduler(mgr, pool, chunk=64, running=8)
    jobs = [Job(list(range(i * 1000, i * 1000 + 30)), list(range(90))) for i in range(6)]
    seqs = [sequence(j, i) for i, j in enumerate(jobs)]
    for seq in seqs:
        sched.submit(seq)
    while sched.busy:
        sched.step()
        check_everything(mgr, pool)
    assert sum(s.retractions for s in seqs) > 0
    assert all(s.status == "finished" and list(s.outputs) == list(range(90)) for s in seqs)


def test_default_hits_more_than_sglang_on_multi_turn() -> None:
    rates = {}
    for compat in (None, "sglang-0.5.15.post1"):
        mgr, pool = make_manager(kv_tokens=5000, state_slots=64, rows=4, compat=compat)
        sched = make_scheduler(mgr, pool, chunk=64, running=2)
        seqs = drive(sched, pool, multi_turn_jobs(1, sessions=4, turns=6), 1, abort_rate=0.0)
        rates[compat] = sum(s.cached_tokens for s in seqs) / sum(s.prompt_tokens for s in seqs)
    assert rates[None] > rates["sglang-0.5.15.post1"] > 0


def test_lifecycle_misuse_raises_and_changes_nothing() -> None:
    mgr, pool = make_manager(kv_tokens=100, state_slots=4)
    req = Request(array("q", [1, 2, 3]))
    with pytest.raises(ValueError, match="not admitted"):
        mgr.finish(req)
    with pytest.raises(ValueError, match="key_len"):
        mgr.match(req, 4)
    assert mgr.match(req, 2)
    with pytest.raises(ValueError, match="already matched"):
        mgr.match(req, 2)
    with pytest.raises(ValueError, match="locked"):
        mgr.alloc_extend([req], [1])  # not locked yet
    mgr.lock(req)
    with pytest.raises(ValueError, match="tokens left"):
        mgr.alloc_extend([req], [10])
    with pytest.raises(ValueError, match="distinct"):
        mgr.alloc_extend([req, req], [1, 1])
    assert mgr.kv.available_size() == 100 and mgr.rows.available_size() == 8
    mgr.abort(req)
    with pytest.raises(ValueError, match="not admitted"):
        mgr.cache_unfinished(req)
    check_everything(mgr, pool)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"strategy": "eager"}, "strategy"),
        ({"strategy": "no_buffer", "page": 16}, "page_size must be 1"),
    ],
)
def test_bad_setup_is_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_manager(kv_tokens=64, state_slots=4, **kwargs)  # type: ignore[arg-type]


def test_track_slots_must_be_one_or_two() -> None:
    mgr, pool = make_manager(kv_tokens=64, state_slots=4, strategy="extra_buffer")
    with pytest.raises(ValueError, match="track_slots"):
        CacheManager(
            mgr.tree, mgr.kv, mgr.slots, pool, mgr.rows, strategy="extra_buffer", track_slots=3
        )


# ----------------------------------------------- bad input: refused before any work


def manager_snapshot(mgr: CacheManager, *reqs: Request) -> tuple[object, ...]:
    """The tree, every pool's free count and the requests' cache fields."""
    fields = [
        (r.row, r.slot, r.track_slots, r.next_track, r.last_track_len, r.lock, r.node)
        + (r.cow_src, r.prefix_len, r.computed, list(r.prefix_kv))
        for r in reqs
    ]
    pools = (mgr.kv.available_size(), mgr.slots.available_size(), mgr.rows.available_size())
    return tree_snapshot(mgr.tree), pools, fields, set(mgr.active), set(mgr.staged)


def conserved(mgr: CacheManager) -> None:
    """Tree invariants and conservation (no forward runs here, so no fingerprints)."""
    mgr.tree.check_invariants()
    mgr.check_conservation()


def admitted(mgr: CacheManager, tokens: list[int], outputs: tuple[int, ...] = ()) -> Request:
    req = Request(array("q", tokens), output_ids=array("q", outputs))
    assert mgr.match(req, len(tokens))
    mgr.lock(req)
    assert mgr.alloc_extend([req], [len(tokens) - req.computed])
    return req


def test_extend_past_the_request_table_is_refused_before_any_work() -> None:
    """A request longer than a row of the request table: alloc_extend used to take
    the row, a slot and 31 KV indices, then fail writing the row, holding them."""
    mgr, _ = make_manager(kv_tokens=100, state_slots=8, rows=2, max_context=16)
    req = Request(array("q", range(1, 32)))
    assert mgr.match(req, 31)
    mgr.lock(req)
    before = manager_snapshot(mgr, req)
    with pytest.raises(ValueError, match="max_context"):
        mgr.alloc_extend([req], [31])
    assert manager_snapshot(mgr, req) == before
    assert mgr.alloc_extend([req], [16])  # what fits still runs
    mgr.abort(req)
    conserved(mgr)
    assert mgr.kv.available_size() == 100 and mgr.slots.available_size() == 8


def test_decode_past_the_request_table_is_refused_before_any_work() -> None:
    mgr, _ = make_manager(kv_tokens=100, state_slots=8, rows=2, max_context=16)
    req = admitted(mgr, list(range(1, 17)), (40, 41))
    before = manager_snapshot(mgr, req)
    with pytest.raises(ValueError, match="max_context"):
        mgr.alloc_decode([req])
    assert manager_snapshot(mgr, req) == before
    mgr.finish(req)
    conserved(mgr)


def test_decode_refuses_a_repeated_request() -> None:
    """alloc_decode([r, r]) used to decode two tokens for r, past its last token
    (a later finish then raised half-way, leaking its row, slot and lock)."""
    mgr, _ = make_manager(kv_tokens=100, state_slots=8)
    req = admitted(mgr, list(range(1, 9)), (50,))
    before = manager_snapshot(mgr, req)
    with pytest.raises(ValueError, match="distinct"):
        mgr.alloc_decode([req, req])
    assert manager_snapshot(mgr, req) == before
    assert mgr.alloc_decode([req]) and req.computed == req.total_len == 9
    mgr.finish(req)
    conserved(mgr)
    assert mgr.tree.total_size() == (9, 1)  # the whole sequence is cached, nothing leaked


@pytest.mark.parametrize(
    "position,exc,says",
    [
        (8.0, TypeError, "position must be an int, got float"),
        (True, TypeError, "position must be an int, got bool"),
        (16, ValueError, "cannot track position 16"),  # beyond what is computed
        (4, ValueError, "below the cached prefix"),  # before the request's first token
    ],
)
def test_track_refuses_a_position_it_cannot_cache(position: object, exc: type, says: str) -> None:
    """A float, or a position inside the prefix the request reused (the forward
    never computed a state there), used to be recorded; the next checkpoint or
    finish then failed half-way and leaked a slot or freed the tree's KV."""
    mgr, _ = make_manager(kv_tokens=100, state_slots=12, strategy="extra_buffer")
    first = admitted(mgr, list(range(1, 9)))
    mgr.track(first, 8)
    mgr.finish(first)
    req = admitted(mgr, list(range(1, 9)) + [20, 21, 22, 23])
    assert req.prefix_len == 8 and req.computed == 12
    before = manager_snapshot(mgr, req)
    with pytest.raises(exc, match=says):
        mgr.track(req, position)  # type: ignore[arg-type]
    assert manager_snapshot(mgr, req) == before
    mgr.track(req, 12)
    mgr.finish(req)
    conserved(mgr)
    assert mgr.tree.total_size() == (12, 2)


def test_abort_refuses_a_request_staged_by_another_manager() -> None:
    """A request matched (its copy-on-write slot staged) by one manager, aborted
    through another, used to free that slot id in the other's pool, where the
    tree held it."""
    m1, _ = make_manager(kv_tokens=100, state_slots=4)
    m2, _ = make_manager(kv_tokens=100, state_slots=4)
    m1.finish(admitted(m1, [1, 2, 3]))
    m2.finish(admitted(m2, [7, 8, 9]))
    m2.finish(admitted(m2, [4, 5, 6]))
    req = Request(array("q", [1, 2, 3, 4]))
    assert m1.match(req, 4) and req.slot is not None
    assert req.slot in m2.tree.all_states()  # the same slot id, held by m2's tree
    before = manager_snapshot(m2, req)
    with pytest.raises(ValueError, match="another"):
        m2.abort(req)
    assert manager_snapshot(m2, req) == before
    m1.abort(req)
    conserved(m1)
    conserved(m2)


@pytest.mark.parametrize("key_len", [2.0, True, "2", None])
def test_match_refuses_a_key_len_that_is_not_an_int(key_len: object) -> None:
    """A float used to pass the range check and fail slicing the tokens, with a
    message that named nothing."""
    mgr, _ = make_manager(kv_tokens=100, state_slots=4)
    mgr.finish(admitted(mgr, [1, 2, 3]))
    req = Request(array("q", [1, 2, 3, 4]))
    before = manager_snapshot(mgr, req)
    with pytest.raises(TypeError, match="^key_len must be an int"):
        mgr.match(req, key_len)  # type: ignore[arg-type]
    assert manager_snapshot(mgr, req) == before
    assert mgr.match(req, np.int64(3)) and req.prefix_len == 3  # numpy ints are ints
    mgr.abort(req)
    conserved(mgr)
