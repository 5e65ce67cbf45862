"""SGLang 0.5.15.post1's three scheduler rules that live outside its cache class (issue 9), each
on a small scenario whose expected pool and tree contents are worked out by hand in the comments
(and, for contrast, what the project's own rules do on the same scenario).

1. State head-room: before every prefill batch, later chunks of a chunked request included,
   ``alloc_req_slots`` evicts states until 3 x (requests in the batch) slots are free.
2. KV eviction amount: when n tokens do not fit, ``evict_from_tree_cache`` evicts n tokens'
   worth (the whole allocation, paged: plus a page per request), not the shortfall.
3. A request finished by its first token gets no prompt-end checkpoint (only
   ``cache_finished_req``); one that goes on decoding gets ``cache_unfinished_req`` there.
"""

from __future__ import annotations

from array import array

from mambaradix.core.node import TreeNode
from mambaradix.core.tree import MambaRadixCache
from mambaradix.lifecycle import CacheManager, Request
from mambaradix.policies import FINISH, PROMPT_END, SGLang
from mambaradix.pools import (
    FingerprintStatePool,
    PagedKVAllocator,
    ReqToTokenTable,
    StateSlotAllocator,
    TokenKVAllocator,
)
from mambaradix.scheduler import (
    PREFILL,
    SchedulerConfig,
    ScriptedForward,
    Sequence,
)
from mambaradix.scheduler.loop import Scheduler


def tokens(start: int, n: int) -> array[int]:
    """n distinct tokens; different starts give prompts that share nothing."""
    return array("q", range(start, start + n))


def manager(
    compat: str | None,
    kv: int,
    slots: int,
    rows: int = 4,
    page: int = 1,
    strategy: str = "no_buffer",
) -> CacheManager:
    allocator = TokenKVAllocator(kv) if page == 1 else PagedKVAllocator(kv, page)
    return CacheManager(
        MambaRadixCache(page_size=page, chunk_size=max(16, page), compat=compat),
        allocator,
        StateSlotAllocator(slots),
        FingerprintStatePool(slots),
        ReqToTokenTable(rows, 512),
        strategy=strategy,
    )


def scheduler(mgr: CacheManager, chunk: int | None, running: int, policy=None) -> Scheduler:  # type: ignore[no-untyped-def]
    cfg = SchedulerConfig(chunk_tokens=chunk, max_running=running)
    return Scheduler(mgr, ScriptedForward(), policy or SGLang(), cfg, lambda: 0.0)


def one_token(prompt: array[int], sid: int = 0) -> Sequence:
    return Sequence(prompt, 1, script=array("q", [7]), id=sid)


def states(mgr: CacheManager) -> int:
    return mgr.tree.total_size()[1]


def has_state(mgr: CacheManager, key: array[int]) -> bool:
    node = mgr.tree.peek(key)
    return node is not None and node.state is not None


# --------------------------------------------------------------------------- 1. head-room


def _four_cached_prompts(sched: Scheduler) -> list[array[int]]:
    """Four one-token requests served one after the other; each leaves the state at its prompt
    end in the tree (cache_finished_req donates the running slot)."""
    prompts = [tokens(100 * (i + 1), 10) for i in range(4)]
    for i, p in enumerate(prompts):
        sched.submit(one_token(p, i))
        sched.run()
    return prompts


def test_headroom_before_an_admission_batch_is_three_slots_per_request() -> None:
    # 6 slots. Four one-token requests, each alone: 3 free before each batch (6, 5, 4, 3 free:
    # no eviction), each takes a running slot that the tree keeps -> 4 states, 2 free.
    # Then two requests in one batch: SGLang wants 3 x 2 = 6 free, has 2 -> evicts 4 states
    # (all of them, LRU first) -> 6 free, takes 2 -> 4 free; both finish: 2 states, 4 free.
    mgr = manager("sglang-0.5.15.post1", kv=1000, slots=6)
    sched = scheduler(mgr, chunk=None, running=2)
    old = _four_cached_prompts(sched)
    assert (states(mgr), mgr.slots.available_size()) == (4, 2)
    new = [tokens(1000, 10), tokens(2000, 10)]
    for i, p in enumerate(new):
        sched.submit(one_token(p, 10 + i))
    assert sched.step() == PREFILL
    assert (states(mgr), mgr.slots.available_size()) == (2, 4)
    assert not any(has_state(mgr, p) for p in old)
    assert all(has_state(mgr, p) for p in new)


def test_headroom_default_rules_evict_only_what_the_batch_takes() -> None:
    # Same scenario, project rules: the batch takes 2 slots and 2 are free -> nothing evicted;
    # both finish and the tree keeps their running slots: 6 states, 0 free.
    mgr = manager(None, kv=1000, slots=6)
    sched = scheduler(mgr, chunk=None, running=2)
    old = _four_cached_prompts(sched)
    for i in range(2):
        sched.submit(one_token(tokens(1000 * (i + 1), 10), 10 + i))
    sched.step()
    assert (states(mgr), mgr.slots.available_size()) == (6, 0)
    assert all(has_state(mgr, p) for p in old)


def test_headroom_is_taken_again_before_every_later_chunk() -> None:
    # 6 slots, one request at a time, chunks of 10 tokens. Three one-token requests (8 tokens)
    # leave Q1, Q2, Q3 in the tree: 3 states, 3 free. Then X, 25 tokens, one output token:
    # step 1: batch [X 0..10): 3 free >= 3, no eviction; X's running slot -> 2 free. (3, 2)
    # step 2: the chunk end is cached (no_buffer: a new slot, copy) -> 4 states, 1 free, X's lock
    #   moves to X@10. Batch [X 10..20): 1 free < 3 -> evict 2, LRU unlocked: Q1, Q2 -> (2, 3).
    # step 3: X@20 cached -> (3 states, 2 free); the insert and re-match of X[:20] refresh X@10,
    #   so Q3 is the LRU unlocked state. Batch [X 20..25): 2 free < 3 -> evict Q3 -> (2, 3).
    #   X's prompt completes, its one token finishes it: its running slot goes to the tree at
    #   X@25 -> 3 states (X@10, X@20, X@25), 3 free.
    mgr = manager("sglang-0.5.15.post1", kv=1000, slots=6, rows=1)
    sched = scheduler(mgr, chunk=10, running=1)
    qs = [tokens(100 * (i + 1), 8) for i in range(3)]
    for i, q in enumerate(qs):
        sched.submit(one_token(q, i))
        sched.run()
    assert (states(mgr), mgr.slots.available_size()) == (3, 3)
    x = tokens(5000, 25)
    sched.submit(one_token(x, 9))
    seen = []
    for _ in range(3):
        assert sched.step() == PREFILL
        seen.append((states(mgr), mgr.slots.available_size()))
    assert seen == [(3, 2), (2, 3), (3, 3)]
    assert not any(has_state(mgr, q) for q in qs)
    assert all(has_state(mgr, x[:n]) for n in (10, 20, 25))


def test_later_chunks_take_no_headroom_under_default_rules() -> None:
    # Project rules, same scenario: a continuing request takes no new slot, so nothing is
    # evicted: step 1 (3, 2); step 2 X@10 cached (4, 1); step 3 X@20 cached (5, 0), and at the
    # finish X@25 keeps the running slot: 6 states, 0 free; Q1..Q3 survive.
    mgr = manager(None, kv=1000, slots=6, rows=1)
    sched = scheduler(mgr, chunk=10, running=1)
    qs = [tokens(100 * (i + 1), 8) for i in range(3)]
    for i, q in enumerate(qs):
        sched.submit(one_token(q, i))
        sched.run()
    sched.submit(one_token(tokens(5000, 25), 9))
    seen = []
    for _ in range(3):
        sched.step()
        seen.append((states(mgr), mgr.slots.available_size()))
    assert seen == [(3, 2), (4, 1), (6, 0)]
    assert all(has_state(mgr, q) for q in qs)


# --------------------------------------------------------------------------- 2. KV eviction


def _serve(mgr: CacheManager, prompt: array[int], track: bool = False) -> None:
    """Admit, prefill and finish one request with one output token, straight on the manager
    (as the scheduler would); extra_buffer: the forward tracks the state at the prompt end."""
    req = Request(prompt)
    assert mgr.match(req, len(prompt) - 1)
    mgr.lock(req)
    assert mgr.alloc_extend([req], [len(prompt) - req.computed])
    if track:
        mgr.track(req, len(prompt))
    req.output_ids.append(7)
    mgr.finish(req)


def _admit(mgr: CacheManager, prompt: array[int]) -> Request:
    req = Request(prompt)
    assert mgr.match(req, len(prompt) - 1)
    mgr.lock(req)
    assert mgr.alloc_extend([req], [len(prompt)])
    return req


def test_kv_eviction_takes_the_whole_allocation() -> None:
    # 60 KV tokens. Four 10-token requests each leave a 10-token leaf: tree 40, free 20.
    # A 25-token prompt does not fit in 20: SGLang evicts 25 tokens' worth, whole LRU leaves:
    # L1, L2 (20 < 25), L3 (30 >= 25) -> free 50; the prompt takes 25 -> free 25, tree 10 (L4).
    mgr = manager("sglang-0.5.15.post1", kv=60, slots=20)
    leaves = [tokens(100 * (i + 1), 10) for i in range(4)]
    for leaf in leaves:
        _serve(mgr, leaf)
    assert (mgr.kv.available_size(), mgr.tree.full_evictable_size()) == (20, 40)
    _admit(mgr, tokens(5000, 25))
    assert (mgr.kv.available_size(), mgr.tree.full_evictable_size()) == (25, 10)
    assert [has_state(mgr, leaf) for leaf in leaves] == [False, False, False, True]


def test_kv_eviction_default_rules_take_the_shortfall() -> None:
    # Same scenario, project rules: 5 tokens short -> evict L1 (10) -> free 30 -> take 25:
    # free 5, tree 30 (L2..L4).
    mgr = manager(None, kv=60, slots=20)
    leaves = [tokens(100 * (i + 1), 10) for i in range(4)]
    for leaf in leaves:
        _serve(mgr, leaf)
    _admit(mgr, tokens(5000, 25))
    assert (mgr.kv.available_size(), mgr.tree.full_evictable_size()) == (5, 30)
    assert [has_state(mgr, leaf) for leaf in leaves] == [False, True, True, True]


def test_paged_kv_eviction_adds_a_page_per_request() -> None:
    # Page 16, 192 KV tokens (12 pages). Four 32-token requests leave 2-page leaves: tree 128,
    # free 64. A 56-token prompt: SGLang over-estimates 56 + 16 (a page per request) = 72 > 64,
    # so it evicts 72 tokens' worth: L1, L2 (64 < 72), L3 (96) -> free 160; 56 tokens take
    # 4 pages -> free 96, tree 32 (L4). Project rules and SGLang 0.5.23 (evict_to_free_tokens:
    # the shortfall): 8 short -> L1 only -> free 96 - 64 = 32.
    for compat, free, tree, kept in (
        ("sglang-0.5.15.post1", 96, 32, [0, 0, 0, 1]),
        ("sglang-0.5.23", 32, 96, [0, 1, 1, 1]),
        (None, 32, 96, [0, 1, 1, 1]),
    ):
        mgr = manager(compat, kv=192, slots=30, page=16, strategy="extra_buffer")
        leaves = [tokens(100 * (i + 1), 32) for i in range(4)]
        for leaf in leaves:
            _serve(mgr, leaf, track=True)
        assert (mgr.kv.available_size(), mgr.tree.full_evictable_size()) == (64, 128)
        _admit(mgr, tokens(5000, 56))
        assert (mgr.kv.available_size(), mgr.tree.full_evictable_size()) == (free, tree), compat
        assert [int(has_state(mgr, leaf)) for leaf in leaves] == kept, compat


# --------------------------------------------------------------------------- 3. first token


class Recording(SGLang):
    """SGLang's checkpoints, recording (kind, position) of each one taken: where the request
    stood (a finished one has given everything back: where the tree now holds its state)."""

    def __init__(self) -> None:
        self.taken: list[tuple[str, int]] = []

    def on_cached(self, req: Request, node: TreeNode | None, kind: str) -> None:
        if kind == FINISH:
            assert node is not None, "the finished state is new in the tree"
            self.taken.append((kind, node.depth_tokens()))
        else:
            self.taken.append((kind, req.computed))


def test_no_prompt_end_checkpoint_for_a_request_finished_by_its_first_token() -> None:
    # 20-token prompt, chunks of 8: chunk ends 8 and 16 are checkpointed when the next chunk is
    # scheduled; the prompt completes at 20 and its only token finishes it: cache_finished_req
    # at 20 (committed = input + output - 1), no prompt-end checkpoint.
    policy = Recording()
    sched = scheduler(
        manager("sglang-0.5.15.post1", kv=500, slots=12), chunk=8, running=2, policy=policy
    )
    sched.submit(one_token(tokens(100, 20)))
    sched.run()
    assert policy.taken == [("chunk", 8), ("chunk", 16), (FINISH, 20)]


def test_a_request_that_goes_on_decoding_is_checkpointed_at_its_prompt_end() -> None:
    # Same prompt, three output tokens: prompt-end checkpoint at 20 after the first token, two
    # decode steps (KV for positions 20, 21), finish at 22.
    policy = Recording()
    sched = scheduler(
        manager("sglang-0.5.15.post1", kv=500, slots=12), chunk=8, running=2, policy=policy
    )
    sched.submit(Sequence(tokens(100, 20), 3, script=array("q", [7, 8, 9])))
    sched.run()
    assert policy.taken == [("chunk", 8), ("chunk", 16), (PROMPT_END, 20), (FINISH, 22)]


# --------------------------------------------------------------------------- abort (decoding)


def test_a_decoding_request_aborted_runs_one_more_step_and_is_cached() -> None:
    # SGLang's abort of a running request only sets `to_finish`: 10-token prompt, 5 tokens
    # wanted. Step 1 prefills (first token, prompt-end checkpoint at 10), step 2 decodes the
    # second token. Abort: still running; step 3 decodes a third token and finishes it as
    # aborted, cached (cache_finished_req) at 10 + 3 - 1 = 12.
    mgr = manager("sglang-0.5.15.post1", kv=500, slots=12)
    sched = scheduler(mgr, chunk=None, running=2)
    prompt = tokens(100, 10)
    seq = Sequence(prompt, 5, script=array("q", [1, 2, 3, 4, 5]))
    sched.submit(seq)
    sched.step()
    sched.step()
    sched.abort(seq)
    assert (seq.status, list(seq.outputs)) == ("running", [1, 2])
    sched.step()
    assert (seq.status, list(seq.outputs), sched.busy) == ("aborted", [1, 2, 3], False)
    assert has_state(mgr, (prompt + array("q", [1, 2, 3]))[:12])
    assert has_state(mgr, prompt)


def test_a_decoding_request_aborted_under_default_rules_stops_at_once() -> None:
    # Project rules: given back at once, nothing more cached: only the prompt-end state at 10.
    mgr = manager(None, kv=500, slots=12)
    sched = scheduler(mgr, chunk=None, running=2)
    prompt = tokens(100, 10)
    seq = Sequence(prompt, 5, script=array("q", [1, 2, 3, 4, 5]))
    sched.submit(seq)
    sched.step()
    sched.step()
    sched.abort(seq)
    assert (seq.status, sched.busy, states(mgr)) == ("aborted", False, 1)
    assert has_state(mgr, prompt)


# --------------------------------------------------------------------------- retraction


def test_a_retracted_request_finished_by_its_prefill_gets_no_prompt_end_checkpoint() -> None:
    # 10-token prompt, 3 tokens wanted. Step 1 prefills (token 1, prompt-end checkpoint at 10),
    # step 2 decodes token 2. Retracted then (SGLang's retract_decode keeps the outputs), it
    # prefills input + outputs again (12 tokens) and that prefill makes token 3, its last:
    # SGLang's process_batch_result_prefill finishes it there (cache_finished_req at
    # 10 + 3 - 1 = 12), with no second prompt-end checkpoint and no further decode step.
    policy = Recording()
    sched = scheduler(
        manager("sglang-0.5.15.post1", kv=500, slots=12), chunk=None, running=2, policy=policy
    )
    seq = Sequence(tokens(100, 10), 3, script=array("q", [1, 2, 3]))
    sched.submit(seq)
    sched.step()
    sched.step()
    sched._requeue(seq)  # what _retract does to the sequence it picks
    sched.step()
    assert (seq.status, list(seq.outputs), sched.busy) == ("finished", [1, 2, 3], False)
    assert policy.taken == [(PROMPT_END, 10), (FINISH, 12)]


def test_after_a_retraction_every_decode_step_makes_a_token() -> None:
    # Same prompt, 5 tokens: prefill (1), decode (2), retracted, prefill again (3); then two
    # decode steps make tokens 4 and 5 (none is skipped as if the sequence were ahead of its
    # steps): 5 forwards in all after the retraction's 2.
    sched = scheduler(manager("sglang-0.5.15.post1", kv=500, slots=12), chunk=None, running=2)
    seq = Sequence(tokens(100, 10), 5, script=array("q", [1, 2, 3, 4, 5]))
    sched.submit(seq)
    sched.step()
    sched.step()
    sched._requeue(seq)
    made = []
    while sched.busy:
        sched.step()
        made.append(len(seq.outputs))
    assert made == [3, 4, 5]
    assert seq.status == "finished"


def test_a_request_retracted_in_its_quiet_steps_makes_no_token_beyond_its_script() -> None:
    # A block-trace request (the replay's): one output block, then 4 decode steps that
    # generate none (they stand for the rest of its tokens). Retracted right after its
    # prefill, all its outputs already made: the prefill again of 10 + 1 tokens has no
    # token left to make (before the fix: IndexError asking the script for a second one).
    # It counts as one of the 4 steps, so the request ends after 4 steps in all, as
    # without the retraction, with its one output.
    sched = scheduler(manager("sglang-0.5.15.post1", kv=500, slots=12), chunk=None, running=2)
    seq = Sequence(tokens(100, 10), 1, script=array("q", [1]), decode_steps=4)
    sched.submit(seq)
    sched.step()
    sched._requeue(seq)
    sched.run()
    assert (seq.status, list(seq.outputs), seq.steps_done) == ("finished", [1], 4)
