"""`PrefillBudget`: which requests join the next prefill batch, and how much of
each (SGLang 0.5.15.post1's `PrefillAdder`, the no-mixed-chunk, no-SWA path).

Budgets, in KV tokens:

* total: free KV + evictable tree KV, minus what the running requests may
  still generate (remaining `max_new_tokens`, clipped at 4096, times the
  new-token ratio), minus what each request added to this batch needs
  (its paged extend + its `max_new_tokens` + one page);
* current: the same without the future outputs;
* chunk: `chunk_tokens` per batch; a request that does not fit is truncated
  to what remains (page aligned) and continues in the next batch;
* input: `max_prefill_tokens` per batch.

A request is refused (NO_TOKEN) when `extend + remaining output + one page`
reaches the total budget, checked before and after locking its matched path
(locking makes that path unevictable). Our departure: a request may also stop
early at a checkpoint stop its policy planned (no_buffer), and then continues
like a truncated one.

With `align` (SchedulerConfig.truncation_align_size, SGLang's
`truncation_align_size` for deterministic inference) positions are cut on a
grid of `align` tokens: a truncated extend ends on a multiple of `align`, and
a request that would get less than that waits for the next batch (SGLang:
`trunc_len < truncation_align_size` -> OTHER). Departures, so that a cached
and an uncached run compute the same chunks: the grid is on absolute
positions (SGLang aligns the extend length, the same when the prefix is
aligned), it applies to continuing requests and to planned stops too (a stop
off the grid is ignored), and an extend never crosses a grid point (it ends
at the first multiple of `align` after its start, or at the prompt end).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from mambaradix.lifecycle import CacheManager
from mambaradix.names import Names
from mambaradix.scheduler.config import CLIP_MAX_NEW_TOKENS
from mambaradix.scheduler.sequence import Sequence, outputs_left


class Added(Names):
    """What adding a request left of the budget (SGLang's `AddReqResult`): room to go
    on, no KV tokens left (the batch is full), or another limit reached (chunk, input,
    the grid)."""

    CONTINUE = "continue"
    NO_TOKEN = "no_token"
    OTHER = "other"


CONTINUE, NO_TOKEN, OTHER = Added


def admission_need(extend: int, max_new: int, page: int) -> int:
    """What a request must stay strictly below the total budget with: the
    tokens it extends, its remaining output (clipped at 4096) and one page."""
    return extend + min(max(max_new, 0), CLIP_MAX_NEW_TOKENS) + page


def fits_alone(prompt: int, max_new: int, page: int, kv_capacity: int) -> bool:
    """Whether a request of `prompt` tokens generating `max_new` more can run
    at all in a KV pool of `kv_capacity` tokens: alone, with everything cached
    evictable (its matched prefix is locked, so it drops out of both sides of
    the admission test), and its last token's page held when decoding ends
    (which only binds when `max_new` exceeds the 4096 clip)."""
    last = prompt + max(max_new, 1) - 1
    held = -(-last // page) * page
    return admission_need(prompt, max_new, page) < kv_capacity and held <= kv_capacity


def kv_needed_alone(prompt: int, max_new: int, page: int) -> int:
    """The least KV pool (whole pages) in which `fits_alone` holds: above the
    admission need, and holding the finished sequence's last token."""
    admit = -(-(admission_need(prompt, max_new, page) + 1) // page) * page
    held = -(-(prompt + max(max_new, 1) - 1) // page) * page
    return max(admit, held)


def slots_alone(track_slots: int, reuses: bool = True) -> int:
    """State slots a request holds while it runs alone: its running state,
    extra_buffer's `track_slots` and, when it reuses a cached state, that
    state too (locked while its copy is staged)."""
    return 1 + track_slots + reuses


class PrefillBudget:
    def __init__(
        self,
        cache: CacheManager,
        running: Seq[Sequence],
        ratio: float,
        chunk_tokens: int | None,
        max_prefill_tokens: int,
        align: int | None = None,
    ) -> None:
        self.cache = cache
        self.page = cache.page_size
        self.align = align
        self.rem_chunk = chunk_tokens
        self.rem_input = max_prefill_tokens
        self.total_offset = outputs_left(running, CLIP_MAX_NEW_TOKENS) * ratio
        self.cur_offset = 0.0
        self.batch: list[tuple[Sequence, int]] = []  # (sequence, tokens to extend)
        self.truncated: list[Sequence] = []  # continue in a later batch

    # ---------------------------------------------------------------- budgets

    def _free(self) -> int:
        kv = self.cache.kv
        if kv.reclaims_cache:  # its available size counts the cache
            return kv.available_size()
        return kv.available_size() + self.cache.tree.full_evictable_size()

    def rem_total(self) -> float:
        return self._free() - self.total_offset

    def cur_rem(self) -> float:
        return self._free() - self.cur_offset

    def state(self) -> Added:
        if self.rem_total() <= 0 or self.cur_rem() <= 0:
            return NO_TOKEN
        if self.rem_input <= 0 or (self.rem_chunk is not None and self.rem_chunk <= 0):
            return OTHER
        return CONTINUE

    def _paged(self, n: int) -> int:
        return -(-n // self.page) * self.page

    def _charge(self, extend: int, max_new: int) -> None:
        extend = self._paged(extend)
        self.total_offset += extend + max_new + self.page
        self.cur_offset += extend + self.page
        self.rem_input -= extend
        if self.rem_chunk is not None:
            self.rem_chunk -= extend

    def _cap(self, seq: Sequence, n: int) -> int:
        """n, cut at the sequence's next planned stop, and on the grid."""
        req = seq.req
        a = self.align
        for stop in seq.stops:
            if stop > req.computed and (a is None or stop % a == 0):
                n = min(n, stop - req.computed)
                break
        if a is None:
            return n
        end = min(req.computed + n, (req.computed // a + 1) * a)  # never cross a grid point
        if end < req.total_len:
            end = end // a * a  # a truncated extend ends on the grid
        return max(end - req.computed, 0)

    # ---------------------------------------------------------------- adding

    def add_continuing(self, seq: Sequence) -> bool:
        """A request that is part-way through its prefill (SGLang's chunked
        request, `add_chunked_req`), up to what the budgets allow. SGLang has
        at most one; with planned stops there may be several, and one that
        finds the chunk budget spent waits for the next batch (False)."""
        req = seq.req
        if self.batch and self.rem_chunk is not None and self.rem_chunk <= 0:
            return False
        rem = int(self.rem_total())
        if self.rem_chunk is not None:
            rem = min(self.rem_chunk, rem)
        if rem <= 0:
            rem = self.rem_chunk if self.rem_chunk is not None else req.total_len
        want = req.total_len - req.computed
        # Also never more than can be had now: SGLang's one chunked request
        # runs out of memory there; ours may be one of several and waits.
        fits = int(self.cur_rem()) - self.page
        n = self._cap(seq, min(want, rem, fits))
        if n <= 0:
            return False
        self._add(seq, n, min(seq.max_new_tokens, CLIP_MAX_NEW_TOKENS) if n == want else 0)
        return True

    def add_new(self, seq: Sequence) -> Added:
        """A matched waiting request (`add_one_req`). Returns CONTINUE, NO_TOKEN
        or OTHER; the request was added iff it is the last of `self.batch`."""
        req = seq.req
        want = req.total_len - req.computed
        need = admission_need(want, seq.remaining_new, self.page)
        if need >= self.rem_total():
            return NO_TOKEN
        if self.rem_chunk is None and self.batch and self._paged(want) >= self.rem_input:
            return OTHER
        self.cache.lock(req)
        if need >= self.rem_total():  # the lock made the matched path unevictable
            self.cache.unlock(req)
            return NO_TOKEN
        paged = self._paged(want)
        if self.rem_chunk is None or paged <= self.rem_chunk:
            n = self._cap(seq, want)
            self._add(seq, n, min(seq.max_new_tokens, CLIP_MAX_NEW_TOKENS) if n == want else 0)
            return self.state()
        trunc = self.rem_chunk // self.page * self.page
        if trunc <= 0:
            self.cache.unlock(req)
            return OTHER
        trunc = (trunc + req.computed) // self.page * self.page - req.computed
        n = self._cap(seq, trunc)
        if n <= 0:  # only with a grid: less than reaches the next grid point
            self.cache.unlock(req)
            return OTHER
        self._add(seq, n, 0)
        return self.state()

    def _add(self, seq: Sequence, n: int, max_new: int) -> None:
        self.batch.append((seq, n))
        self._charge(n, max_new)
        if seq.req.computed + n < seq.req.total_len:
            self.truncated.append(seq)
