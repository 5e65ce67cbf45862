"""`Engine`: a reference serving loop for real hybrid models on the prefix cache.

Scheduling (deliberately simple; batch size 1 per forward):

* `generate(prompts)` queues one sequence per prompt. Up to `max_running`
  sequences run at once; they are admitted one per step (`CacheManager.admit`:
  match, lock, copy-on-write of the matched state into the sequence's running
  slot), so a sequence's first prefill chunk is checkpointed before the next
  one is matched and prompts submitted together reuse each other's prefixes.
* Round-robin over the running sequences: each step runs ONE forward for ONE
  sequence, either its next prefill chunk or one decode token. Sequences
  therefore arrive and finish independently, interleaved, but no two are
  batched into the same forward.
* Prefill stops (and checkpoints with `cache_unfinished`) at every chunk end,
  at the branch point `kv_hit_len` (where this prompt leaves a cached path,
  so a sibling prompt can reuse the state there), and at input - 1 (the
  lifecycle's default stop, so identical prompts hit; the last prompt token is
  fed by the first decode step).
* Greedy decode. A finished sequence is inserted whole (`finish`), donating its
  running slot to the tree.
* Memory: when `extend` cannot get KV even after evicting unlocked tree leaves,
  another running sequence is retracted (the most recently admitted one):
  `abort` frees its private KV and slot, its generated tokens are kept, and it
  is requeued at the head of the queue; when readmitted its prompt is
  input + generated-so-far and it continues where it stopped. After a
  retraction no new sequence is admitted until a running one finishes, so the
  running set shrinks until it fits (no livelock). A sequence that does not
  fit in the KV pool alone raises `RuntimeError`.

`prefix_cache=False` runs the same loop but never checkpoints and aborts
instead of finishing, so the tree stays empty and every match is empty.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from mambaradix.core.tree import MambaRadixCache
from mambaradix.engine.adapter import PoolAdapter
from mambaradix.engine.models import build_model
from mambaradix.lifecycle import CacheManager, Request
from mambaradix.pools import ReqToTokenTable, StateSlotAllocator, TokenKVAllocator

__all__ = ["Engine", "Result"]


@dataclass
class Result:
    """One prompt's outcome.

    `prompt_tokens` / `cached_tokens`: the prompt length and the prompt tokens
    served from the cache, of the admission that completed (a retracted
    sequence is admitted again with input + generated-so-far as its prompt).
    `logits[i]` are the fp32 logits that chose `output_ids[i]`."""

    output_ids: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    cached_tokens: int = 0
    prompt_tokens: int = 0
    retractions: int = 0
    ttft_s: float = 0.0
    latency_s: float = 0.0


@dataclass(eq=False)
class _Seq:
    index: int
    prompt: list[int]
    max_new: int
    result: Result
    req: Request | None = None
    stops: list[int] = field(default_factory=list)
    admitted_at: int = 0
    computed_prompt: int = 0  # prompt tokens run by this admission


class Engine:
    """Serve greedy generations of a hybrid `transformers` model on the cache.

    model: a preset (`"nemotron-h-tiny"`, `"qwen3-next-tiny"`) or a local
    checkpoint directory. kv_tokens / state_slots: pool sizes; chunk_size:
    prefill chunk; max_running: sequences admitted at once (also the rows of
    the request-to-token table); max_context: longest sequence.
    The cache (tree + pools) persists across `generate` calls.
    """

    def __init__(
        self,
        model: str = "nemotron-h-tiny",
        seed: int = 0,
        prefix_cache: bool = True,
        kv_tokens: int = 65536,
        state_slots: int = 64,
        chunk_size: int = 256,
        max_running: int = 8,
        max_context: int | None = None,
        dtype: torch.dtype = torch.float32,
        model_overrides: dict[str, Any] | None = None,
        net: Any = None,
    ) -> None:
        if chunk_size < 1 or max_running < 1:
            raise ValueError("chunk_size and max_running must be >= 1")
        self.model_name = model
        self.net = net if net is not None else build_model(model, seed, dtype, model_overrides)
        self.prefix_cache = prefix_cache
        self.chunk_size = chunk_size
        self.max_running = max_running
        self.adapter = PoolAdapter(self.net, kv_tokens, state_slots)
        self.mgr = CacheManager(
            MambaRadixCache(page_size=1, chunk_size=1),
            TokenKVAllocator(kv_tokens),
            StateSlotAllocator(state_slots),
            self.adapter.states,
            ReqToTokenTable(max_running, max_context or kv_tokens),
        )
        self._stats = {
            "requests": 0,
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "computed_prefill_tokens": 0,
            "decode_tokens": 0,
            "forwards": 0,
            "retractions": 0,
            "retracted_prefill_tokens": 0,
        }
        self._admissions = 0
        self._retracted: list[_Seq] = []

    @property
    def vocab_size(self) -> int:
        return self.adapter.vocab_size

    # ------------------------------------------------------------------ API

    def generate(self, prompts: list[list[int]], max_new_tokens: int = 16) -> list[Result]:
        """Greedy-decode `max_new_tokens` for every prompt (token id lists),
        interleaving them round-robin. Returns one `Result` per prompt."""
        if max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        for p in prompts:
            if not p:
                raise ValueError("every prompt needs at least one token")
            if any(not 0 <= t < self.vocab_size for t in p):
                raise ValueError(f"token ids must be in [0, {self.vocab_size})")
        t0 = time.perf_counter()
        seqs = [_Seq(i, list(p), max_new_tokens, Result()) for i, p in enumerate(prompts)]
        self._stats["requests"] += len(seqs)
        waiting: deque[_Seq] = deque(s for s in seqs if s.max_new > 0)
        running: deque[_Seq] = deque()
        hold = False  # after a retraction: admit nothing until a sequence finishes
        try:
            self._loop(waiting, running, hold, t0)
        except BaseException:
            self._retracted = []
            for seq in seqs:  # free what the failed call holds: the engine stays usable
                if seq.req is not None:
                    self.mgr.abort(seq.req)
                    seq.req = None
            raise
        return [s.result for s in seqs]

    def _loop(self, waiting: deque[_Seq], running: deque[_Seq], hold: bool, t0: float) -> None:
        while waiting or running:
            # Admit one sequence per step: the ones already running get a prefill
            # chunk in (and checkpoint it) before the next is matched, so requests
            # submitted together still reuse each other's shared prefixes.
            if waiting and len(running) < self.max_running and not (hold and running):
                if self._admit(waiting[0]):
                    running.append(waiting.popleft())
                elif not running:
                    raise RuntimeError("cannot admit a request into an idle engine")
            seq = running.popleft()
            outcome = self._step(seq, running)
            if outcome == "retracted_others":
                hold = True
                for victim in self._retracted:
                    waiting.appendleft(victim)
                self._retracted = []
            if seq.req is None:  # finished
                seq.result.latency_s = time.perf_counter() - t0
                hold = False
            else:
                running.append(seq)
            if seq.result.output_ids and seq.result.ttft_s == 0.0:
                seq.result.ttft_s = time.perf_counter() - t0

    def stats(self) -> dict[str, float]:
        """Counters since construction: requests; prompt_tokens, cached_tokens
        and computed_prefill_tokens (prompt tokens run through the model, the
        last one with the first decode step) over completed admissions, so
        computed_prefill_tokens == prompt_tokens - cached_tokens; decode_tokens,
        forwards, hit_rate (cached / prompt), evicted_kv_tokens, evicted_states,
        evictions (their sum), retractions, retracted_prefill_tokens (prompt
        tokens computed by admissions that were then retracted: wasted work)."""
        s: dict[str, float] = dict(self._stats)
        s["hit_rate"] = s["cached_tokens"] / s["prompt_tokens"] if s["prompt_tokens"] else 0.0
        s["evicted_kv_tokens"] = self.mgr.evictions["kv_tokens"]
        s["evicted_states"] = self.mgr.evictions["states"]
        s["evictions"] = s["evicted_kv_tokens"] + s["evicted_states"]
        return s

    def check(self) -> None:
        """Leak checks (raise AssertionError): conservation of KV indices and
        state slots, tree invariants, and with no request running, free + tree
        == capacity for both pools."""
        mgr = self.mgr
        mgr.check_conservation()
        mgr.tree.check_invariants()
        if not mgr.active:
            tree_kv = len(mgr.tree.all_kv_indices())
            tree_states = len(mgr.tree.all_states())
            assert mgr.kv.available_size() + tree_kv == mgr.kv.capacity
            assert mgr.slots.available_size() + tree_states == mgr.slots.capacity

    def reset_cache(self) -> None:
        """Drop everything the tree caches (no request may be running)."""
        if self.mgr.active:
            raise RuntimeError("requests are running")
        r = self.mgr.tree.reset()
        if r.freed_kv:
            self.mgr.kv.free(r.freed_kv)
        if r.freed_states:
            self.mgr.slots.free(r.freed_states)

    # ------------------------------------------------------------- internals

    def _admit(self, seq: _Seq) -> bool:
        req = Request(input_ids=_arr(seq.prompt + seq.result.output_ids))
        if not self.mgr.admit(req):
            return False
        seq.req = req
        self._admissions += 1
        seq.admitted_at = self._admissions
        end = len(req.input_ids) - 1
        stops = set(self.mgr.plan_prefill(req, self.chunk_size))
        if self.prefix_cache and req.computed < req.kv_hit_len < end:
            stops.add(req.kv_hit_len)
        seq.stops = sorted(stops)
        seq.computed_prompt = 0
        seq.result.prompt_tokens = len(req.input_ids)
        seq.result.cached_tokens = req.cached_len
        return True

    def _step(self, seq: _Seq, running: deque[_Seq]) -> str:
        """One forward for `seq`: its next prefill chunk or one decode token.
        Returns "retracted_others" if other sequences were retracted (listed
        in self._retracted) to make room."""
        req = seq.req
        assert req is not None and req.slot is not None and req.row is not None
        outcome = "ok"
        prefill = bool(seq.stops)
        n = seq.stops[0] - req.computed if prefill else 1
        start = req.computed
        new_kv = self.mgr.extend(req, n)
        while new_kv is None:
            victims = [s for s in running if s.req is not None]
            if not victims:
                raise RuntimeError(
                    f"a request of {len(req.tokens)} tokens does not fit in "
                    f"{self.mgr.kv.capacity} KV tokens"
                )
            victim = max(victims, key=lambda s: s.admitted_at)
            running.remove(victim)
            self._retract(victim)
            self._retracted = [*self._retracted, victim]
            outcome = "retracted_others"
            new_kv = self.mgr.extend(req, n)
        tokens = req.tokens[start : start + n]
        context = self.mgr.rows.read(req.row, 0, start)
        logits = self.adapter.forward(tokens, start, context, new_kv, req.slot)
        self._stats["forwards"] += 1
        if prefill:
            seq.stops.pop(0)
            seq.computed_prompt += n
            if self.prefix_cache:
                self.mgr.cache_unfinished(req)
            return outcome
        if req.computed == len(req.input_ids):  # the last prompt token came with this step
            seq.computed_prompt += 1
        else:
            self._stats["decode_tokens"] += 1
        token = int(torch.argmax(logits))
        req.output_ids.append(token)
        seq.result.output_ids.append(token)
        seq.result.logits.append(logits.clone())
        if len(seq.result.output_ids) >= seq.max_new:
            self.mgr.finish(req, insert=self.prefix_cache)
            seq.req = None
            self._stats["prompt_tokens"] += seq.result.prompt_tokens
            self._stats["cached_tokens"] += seq.result.cached_tokens
            self._stats["computed_prefill_tokens"] += seq.computed_prompt
        return outcome

    def _retract(self, seq: _Seq) -> None:
        assert seq.req is not None
        self.mgr.abort(seq.req)
        seq.req = None
        seq.stops = []
        seq.result.retractions += 1
        self._stats["retractions"] += 1
        self._stats["retracted_prefill_tokens"] += seq.computed_prompt


def _arr(tokens: list[int]) -> Any:
    from array import array

    return array("q", tokens)
