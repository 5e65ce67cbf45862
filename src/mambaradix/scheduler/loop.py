"""`Scheduler`: the one request driver of the engine, the replay and the tests.

One `step()` is one forward, chosen as SGLang 0.5.15.post1's event loop
(non-overlap; `get_next_batch_to_run`) chooses it:

1. A request part-way through its prefill is stashed: its chunk end is
   checkpointed (`cache_unfinished`, if its policy wants one there).
2. A prefill batch is formed (`PrefillBudget`): the part-way requests first,
   then waiting requests first come first served, each matched (input + output
   so far, minus one token) and locked, until a budget, the running limit or
   the request table runs out. A refused request gives its staged state slot
   back. A refusal for lack of memory marks the batch full: no admission is
   tried again until a running request finishes or is retracted.
3. If there is a prefill batch it runs (memory first: `alloc_extend`); a
   request whose prompt completed gets its first token, and either finishes
   (cached by `finish`) or is checkpointed at its prompt end and joins the
   decode batch. Prefill has priority over decode.
4. Otherwise the running requests decode one token each. When one more token
   per request does not fit, requests are retracted (fewest outputs first,
   longest input first among equals; SGLang's order), their memory returned,
   and requeued; they are prefilled again later, outputs included.

What is injected: the cache (`CacheManager`: tree, pools, strategy, eviction
policy), the forward (`Forward`), where checkpoints go (`mambaradix.policies.Policy`)
and the clock (only for statistics).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from mambaradix.core.compat import SGLANG_0_5_23, is_sglang
from mambaradix.lifecycle import CacheManager
from mambaradix.names import Names
from mambaradix.policies import Policy, default_policy
from mambaradix.policies.kinds import CHUNK, DECODED, FINISH, PROMPT_END, STOP
from mambaradix.scheduler.budget import CONTINUE, NO_TOKEN, PrefillBudget
from mambaradix.scheduler.config import RETRACT_DECODE_STEPS, NewTokenRatio, SchedulerConfig
from mambaradix.scheduler.forward import DecodeStep, Extend, Forward
from mambaradix.scheduler.sequence import (
    ABORTED,
    FINISHED,
    PREFILLING,
    RUNNING,
    WAITING,
    Sequence,
)
from mambaradix.validate import check_page_multiple


class Step(Names):
    """What one `Scheduler.step` did (a `Names`: `Step.PREFILL == "prefill"`)."""

    PREFILL = "prefill"
    DECODE = "decode"
    PREEMPTED = "preempted"
    IDLE = "idle"
    STALLED = "stalled"


PREFILL, DECODE, PREEMPTED, IDLE, STALLED = Step


class Scheduler:
    def __init__(
        self,
        cache: CacheManager,
        forward: Forward,
        checkpoints: Policy | None = None,
        config: SchedulerConfig | None = None,
        clock: Callable[[], float] = time.perf_counter,
        on_finish: Callable[[Sequence], None] | None = None,
        on_abort: Callable[[Sequence], None] | None = None,
    ) -> None:
        self.cache, self.forward, self.clock = cache, forward, clock
        self.config = config or SchedulerConfig()
        if checkpoints is None:  # the policy the tree implies (`policies.default_policy`)
            checkpoints = default_policy(cache.tree.compat, cache.strategy)
        self.checkpoints = checkpoints
        self.on_finish = on_finish
        self.on_abort = on_abort  # a sequence stopped without finishing (`abort`, or out of memory)
        _check_config(cache, self.config)
        self.waiting: list[Sequence] = []
        self.prefilling: list[Sequence] = []  # part-way through their prefill
        self.running: list[Sequence] = []  # decoding
        self.batch_is_full = False
        self._finished_since_decode = False
        self.ratio = NewTokenRatio(self.config.conservativeness)
        self.max_running = running_limit(cache, self.config.max_running)
        self.track_grid = track_grid(cache, self.config.track_interval)
        self.forwards = {PREFILL: 0, DECODE: 0}

    # ------------------------------------------------------------------ API

    def submit(self, seq: Sequence) -> None:
        """Queue a new sequence (once: a retracted one is queued again by the scheduler)."""
        if seq.submitted or seq.status != WAITING or seq.req.admitted:
            raise ValueError("sequence already submitted: submit a new one")
        context = self.cache.rows.max_context
        need = len(seq.req.input_ids) + seq.max_new_tokens - 1  # the last token has no KV
        if context is not None and need > context:
            raise ValueError(
                f"sequence {seq.id} needs {need:,} positions ({len(seq.req.input_ids):,} "
                f"prompt + {seq.max_new_tokens} new - 1) but the request table holds "
                f"{context:,} (max_context)"
            )
        seq.submitted = True
        seq.arrival = self.clock() if seq.arrival == 0.0 else seq.arrival
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        """Stop a sequence wherever it is; everything it holds is given back.

        On an SGLang compat tree a decoding sequence stops as in SGLang (0.5.15.post1 and
        0.5.23, `Scheduler.abort_request`, "abort method 3": `req.to_finish`): it runs one
        more decode step and then finishes like any other, its tokens cached
        (`cache_finished_req` with is_insert=True / `release_kv_cache` with checkpoint=True);
        its status becomes ABORTED then.
        A sequence that already ended holds nothing: aborting it changes nothing."""
        if seq.status in (FINISHED, ABORTED):
            return
        if seq.status == RUNNING and is_sglang(self.cache.tree.compat):
            seq.to_finish = True
            return
        self._drop(seq)

    def _drop(self, seq: Sequence) -> None:
        """Abort now: give back everything, cache nothing (release_kv_cache, is_insert=False)."""
        for queue in (self.waiting, self.prefilling, self.running):
            if seq in queue:
                queue.remove(seq)
        self._on_abort(seq)
        if seq.req.admitted or seq.req.node is not None:
            self.cache.abort(seq.req)
        seq.status = ABORTED
        if self.on_abort is not None:
            self.on_abort(seq)

    def _on_abort(self, seq: Sequence) -> None:
        """Tell the policy (see `checkpoints`)."""
        self.checkpoints.on_abort(seq.req)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    def step(self) -> Step:
        """Run one forward. PREFILL or DECODE; PREEMPTED when requests
        part-way through their prefill hold the memory their next chunks need
        and nothing else runs (SGLang would run out of memory there: the last
        admitted goes back to the queue instead, memory returned); IDLE if
        nothing is queued; STALLED if requests wait but nothing can run (the
        head does not fit even with nothing else held: also a lone part-way
        request, put back at the head, whose next chunk finds no memory)."""
        self._stash()
        batch = self._form_prefill()
        if batch:
            self._run_prefill(batch)
            return PREFILL
        if self.running:
            self._run_decode()
            return DECODE
        if self.prefilling:  # part-way requests hold the memory the next chunk needs
            alone = len(self.prefilling) == 1  # it had all memory and still cannot go on
            self._requeue(self.prefilling[-1])
            return STALLED if alone else PREEMPTED
        if self.waiting and self.batch_is_full:
            self.batch_is_full = False  # an empty running batch is never full
            batch = self._form_prefill()
            if batch:
                self._run_prefill(batch)
                return PREFILL
        return STALLED if self.waiting else IDLE

    def run(self) -> None:
        """Step until every submitted sequence finished; RuntimeError if one
        can never run."""
        while self.busy:
            if self.step() == STALLED:
                head = self.waiting[0]
                raise RuntimeError(
                    f"sequence {head.id} ({head.req.total_len} tokens) does not fit in "
                    f"{self.cache.kv.capacity} KV tokens even with nothing else running"
                )

    # -------------------------------------------------------------- prefill

    def _stash(self) -> None:
        """Checkpoint the part-way requests at their chunk end or stop."""
        for seq in self.prefilling:
            req = seq.req
            kind = STOP if req.computed in seq.stops else CHUNK
            if req.computed > req.prefix_len and self.checkpoints.cache_at(req, kind):
                self._checkpoint(seq, kind)

    def _checkpoint(self, seq: Sequence, kind: str) -> None:
        req = seq.req
        node = self.cache.cache_unfinished(req)
        self.checkpoints.on_cached(req, node, kind)

    def _allocatable(self) -> int:
        free_rows = self.cache.rows.available_size()
        return min(self.max_running - len(self.running), free_rows)

    def _form_prefill(self) -> list[tuple[Sequence, int]]:
        if (self.batch_is_full or not self.waiting) and not self.prefilling:
            return []
        if self._allocatable() <= 0 and not self.prefilling:
            self.batch_is_full = True
            return []
        cfg = self.config
        budget = PrefillBudget(
            self.cache,
            self.running,
            self.ratio.current,
            cfg.chunk_tokens,
            cfg.max_prefill_tokens,
            cfg.truncation_align_size,
        )
        waiting_turn = [seq for seq in self.prefilling if not budget.add_continuing(seq)]
        for seq in list(self.waiting):
            if len(budget.batch) >= self._allocatable():
                self.batch_is_full = True
            if self.batch_is_full or not self._admit_one(budget, seq):
                break
        return self._take(budget, waiting_turn)

    def _admit_one(self, budget: PrefillBudget, seq: Sequence) -> bool:
        """Match and add one waiting request; False to stop adding."""
        req = seq.req
        self.checkpoints.before_match(req)
        if not self.cache.match(req, req.total_len - 1):
            self.batch_is_full = True  # no slot for its state copy: wait for a finish
            self._on_abort(seq)
            return False
        seq.stops = [] if self.cache.extra_buffer else self.checkpoints.stops(req)
        result = budget.add_new(seq)
        added = bool(budget.batch) and budget.batch[-1][0] is seq
        if result == NO_TOKEN:
            self.batch_is_full = True
        if not added:
            self._on_abort(seq)
            self.cache.unmatch(req)
            seq.stops = []
        return result == CONTINUE

    def _take(
        self, budget: PrefillBudget, waiting_turn: list[Sequence]
    ) -> list[tuple[Sequence, int]]:
        """Allocate the batch's memory; part-way requests not in this batch
        (`waiting_turn`) stay part-way."""
        batch = budget.batch
        if not batch:
            return []
        seqs = [s for s, _ in batch]
        if not self.cache.alloc_extend([s.req for s in seqs], [n for _, n in batch]):
            self._refuse(seqs)
            return []
        for seq in seqs:
            if seq.status == WAITING:
                self.waiting.remove(seq)
                seq.admitted_len = seq.req.total_len
                seq.admission_prefill = 0
                self.checkpoints.on_admitted(seq.req)
            seq.status = PREFILLING
        self.prefilling = waiting_turn + budget.truncated
        return batch

    def _refuse(self, seqs: list[Sequence]) -> None:
        """The batch's memory could not be had after all: new requests go back
        to waiting (nothing held), part-way ones stay part-way."""
        for seq in seqs:
            if seq.status == WAITING:
                self._on_abort(seq)
                self.cache.abort(seq.req)
                seq.stops = []
        self.batch_is_full = True

    def _run_prefill(self, batch: list[tuple[Sequence, int]]) -> None:
        items = [self._extend_item(seq, n) for seq, n in batch]
        tokens = self.forward.prefill(items)
        self.forwards[PREFILL] += 1
        for item, token in zip(items, tokens, strict=True):
            seq = item.seq
            seq.prefill_tokens += item.end - item.start
            seq.admission_prefill += item.end - item.start
            if item.track_at is not None:
                self.cache.track(seq.req, item.track_at)
            if item.end == seq.req.total_len:
                self._prompt_done(seq, token)
        if any(s.status != RUNNING for s, _ in batch):
            self.batch_is_full = False  # the batch shrank (finished or part-way requests)

    def _extend_item(self, seq: Sequence, n: int) -> Extend:
        """The forward's work for seq: positions [computed - n, computed), and
        with extra_buffer the position to track (SGLang's prepare_for_extend:
        the last chunk-aligned position of the extend, or the branching point
        when it falls inside the extend on the chunk grid)."""
        req = seq.req
        end = req.computed
        start = end - n
        if not self.cache.extra_buffer:
            return Extend(seq, start, end)
        c = self.cache.tree.chunk_size
        if n < c:
            return Extend(seq, start, end)
        at = start + n // c * c
        b = req.branching_len
        if b is not None and start < b < end and (b - start) % c == 0:
            at = b
        return Extend(seq, start, end, at, self.cache.track_slot(req))

    def _prompt_done(self, seq: Sequence, token: int | None) -> None:
        req = seq.req
        seq.cached_tokens, seq.prompt_tokens = req.cached_len, seq.admitted_len
        seq.kv_hit_tokens = req.kv_hit_len
        retried = len(req.output_ids) > 0  # a prefill after a retraction
        if seq.remaining_new > 0:  # none left: retracted in its quiet steps (`decode_steps`)
            assert token is not None, "the forward must return a token for a completed prompt"
            req.output_ids.append(token)
        if retried:
            # A prefill after a retraction makes the token a decode step would
            # have made: count it as that step, so the sequence ends (and its
            # next token is due) exactly as it would have without the retraction.
            seq.steps_done += 1
        if seq.first_token_time is None:
            seq.first_token_time = self.clock()
        if seq.done:
            self._finish(seq)
            return
        if self.checkpoints.cache_at(req, PROMPT_END):
            self._checkpoint(seq, PROMPT_END)
        seq.status = RUNNING
        self.running.append(seq)

    def _finish(self, seq: Sequence) -> None:
        req = seq.req
        insert = self.checkpoints.insert_at_finish(req)
        node = self.cache.finish(req, insert=insert)
        if insert:
            self.checkpoints.on_cached(req, node, FINISH)
        seq.status = ABORTED if seq.to_finish else FINISHED
        seq.finish_time = self.clock()
        if self.on_finish is not None:
            self.on_finish(seq)

    # --------------------------------------------------------------- decode

    def _run_decode(self) -> None:
        if self._finished_since_decode:
            self._finished_since_decode = False
            self.batch_is_full = False
        if self._skip_quiet_steps():
            return
        # Whether a sequence's next step makes a token depends on it alone: asked once.
        due = [s for s in self.running if s.token_due()]
        if not self.cache.decode_fits([s.req for s in due]):
            self._retract()
            kept = set(self.running)
            due = [s for s in due if s in kept]
        else:
            self.ratio.decay_step()
        if not self.running:
            return
        if due and not self.cache.alloc_decode([s.req for s in due]):
            # Not after a fitting check_decode_mem in SGLang (it would crash);
            # here (an allocator failing) the step is skipped and one request
            # goes back to the queue, so memory is returned and nothing leaks.
            self._retract_one()
            return
        steps = [DecodeStep(s, self._decode_track_slot(s)) for s in due]
        tokens = self.forward.decode(steps) if steps else self._pass_steps(1)
        self.forwards[DECODE] += 1
        for step, token in zip(steps, tokens, strict=True):
            if step.track_slot is not None:
                self.cache.track(step.seq.req, step.seq.req.computed)
            step.seq.req.output_ids.append(token)
        checkpoints = bool(self.checkpoints.decode_interval) and not self.cache.extra_buffer
        made = set(due) if checkpoints else ()
        for seq in list(self.running):
            seq.steps_done += 1
            if seq.done:
                self.running.remove(seq)
                self._finish(seq)
                self._finished_since_decode = True
            elif seq in made and self._decode_checkpoint(seq):
                self._checkpoint(seq, DECODED)

    def _skip_quiet_steps(self) -> bool:
        """Steps in which no running sequence generates a token or ends (only
        when `decode_steps` exceeds the tokens to generate) pass at once, as
        one step of their own: the caller may act (admit, prefill) at any token
        boundary inside them before the next step that generates. True if
        steps passed."""
        quiet = min([s.steps_to_event() for s in self.running]) - 1
        if quiet <= 0:
            return False
        for seq in self.running:
            seq.steps_done += quiet
        self.ratio.decay_steps(quiet)
        self._pass_steps(quiet)
        return True

    def _pass_steps(self, n: int) -> list[int]:
        """Tell the forward that n decode steps passed with no token to compute
        (a virtual clock advances; a real model has nothing to run)."""
        self.forward.pass_steps(n)
        return []

    def _decode_checkpoint(self, seq: Sequence) -> bool:
        every = self.checkpoints.decode_interval
        if not every or self.cache.extra_buffer or seq.req.computed % every:
            return False
        return self.checkpoints.cache_at(seq.req, DECODED)

    def _decode_track_slot(self, seq: Sequence) -> int | None:
        req = seq.req
        if self.cache.extra_buffer and req.computed % self.track_grid == 0:
            return self.cache.track_slot(req)
        return None

    def _retract(self) -> None:
        """SGLang's retract_decode: retract until one more token each fits."""
        order = sorted(
            self.running, key=lambda s: (len(s.outputs), -len(s.req.input_ids)), reverse=True
        )
        first = True
        while first or not self.cache.decode_fits([s.req for s in order if s.token_due()]):
            if len(order) == 1:
                break
            first = False
            self._requeue(order.pop())
            self.cache.evict_kv_for(len(order) * RETRACT_DECODE_STEPS)
        if len(order) == 1 and not self.cache.decode_fits([s.req for s in order if s.token_due()]):
            self._drop(order.pop())  # out of memory even alone (SGLang aborts it)
        self.running = [s for s in self.running if s in order]
        decoded = sum(len(s.outputs) for s in self.running)
        max_new = sum(s.max_new_tokens for s in self.running)
        self.ratio.after_retract(decoded, max_new, len(self.running))
        self.batch_is_full = False

    def _retract_one(self) -> None:
        if len(self.running) > 1:
            order = sorted(self.running, key=lambda s: (len(s.outputs), -len(s.req.input_ids)))
            self._requeue(order[0])
            self.batch_is_full = False

    def _requeue(self, seq: Sequence) -> None:
        """Retract: give the memory back and queue the sequence again (its
        outputs so far are kept and prefilled again with its prompt)."""
        seq.retracted_tokens += seq.admission_prefill
        self._on_abort(seq)
        self.cache.abort(seq.req)
        seq.retractions += 1
        seq.stops = []
        if seq.status == PREFILLING:  # admitted before everything waiting: first again
            self.prefilling.remove(seq)
            self.waiting.insert(0, seq)
        else:
            self.running.remove(seq)
            self.waiting.append(seq)
        seq.status = WAITING


def running_limit(cache: CacheManager, max_running: int) -> int:
    """Requests that may run at once: SGLang caps --max-running-requests at
    the state pool size divided by the slots a request may need (3 for the
    running state and the tree's copy-on-write head-room, plus the ping-pong
    track slots; MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO). Ours: the slots
    a request holds (1 + track slots), plus one for its checkpoints."""
    per_request = cache.track_slots + (3 if cache.sglang else 2)
    return max(1, min(max_running, cache.slots.capacity // per_request))


def track_grid(cache: CacheManager, interval: int) -> int:
    """extra_buffer: a decode step tracks a state when the length is a multiple of this:
    `track_interval`, or with SGLang 0.5.23's rules lcm(chunk grid, interval)
    (`mamba_track_grid`, runtime_context.py:1974-1979; 0.5.23 asks only that the interval
    be whole pages)."""
    if cache.rules == SGLANG_0_5_23:
        return math.lcm(cache.tree.chunk_size, interval)
    return interval


def _check_config(cache: CacheManager, cfg: SchedulerConfig) -> None:
    page, page_name = cache.page_size, "the page size"
    if cfg.chunk_tokens is not None:
        check_page_multiple(cfg.chunk_tokens, "chunk_tokens", page, page_name)
    if cfg.truncation_align_size is not None:
        check_page_multiple(cfg.truncation_align_size, "truncation_align_size", page, page_name)
    if cache.extra_buffer:
        check_page_multiple(cfg.track_interval, "track_interval", page, page_name)


__all__ = ["DECODE", "IDLE", "PREEMPTED", "PREFILL", "STALLED", "Scheduler", "Step"]
