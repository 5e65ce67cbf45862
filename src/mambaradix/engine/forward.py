"""`TorchForward`: the scheduler's forward (`mambaradix.scheduler.Forward`) on
a `PoolAdapter`.

A prefill batch runs one model forward per extend (one sequence; two when an
extra_buffer track position splits it). A decode batch runs ONE model forward
for every decoding sequence together (`batch_decode=True`, the default; the
sequences may have any lengths), or one per sequence (`batch_decode=False`,
for comparison). Sampling is greedy.
"""

from __future__ import annotations

import numpy as np
import torch

from mambaradix.engine.adapter import PoolAdapter
from mambaradix.lifecycle import CacheManager, Request
from mambaradix.pools import ReqToTokenTable
from mambaradix.scheduler import DecodeStep, Extend, Sequence

__all__ = ["TorchForward"]


def _token_at(req: Request, pos: int) -> int:
    n = len(req.input_ids)
    return int(req.input_ids[pos] if pos < n else req.output_ids[pos - n])


def _slot(req: Request) -> int:
    assert req.slot is not None, "an admitted request holds a running slot"
    return req.slot


class TorchForward:
    """One model forward per prefill extend and one per decode step (or per
    decoding sequence with `batch_decode=False`); greedy sampling. With
    `keep_logits` the fp32 logits that chose every token are kept per
    sequence (`logits[id(seq)]`, on the CPU), for exactness checks."""

    def __init__(
        self,
        adapter: PoolAdapter,
        cache: CacheManager,
        batch_decode: bool = True,
        keep_logits: bool = True,
    ) -> None:
        if not isinstance(cache.rows, ReqToTokenTable):
            raise TypeError("the cache's rows must be a ReqToTokenTable (read in bulk)")
        self.adapter, self.cache, self.table = adapter, cache, cache.rows.table
        self.batch_decode, self.keep_logits = batch_decode, keep_logits
        self.logits: dict[int, list[torch.Tensor]] = {}
        self.forwards = 0
        self.decode_forwards = 0

    def pass_steps(self, n: int) -> None:
        """Quiet decode steps: nothing to compute."""

    def _extend(self, req: Request, start: int, end: int) -> torch.Tensor:
        assert req.row is not None and req.slot is not None
        row = self.table[req.row : req.row + 1, :end]
        self.forwards += 1
        tokens = [req.tokens[start:end].tolist()]
        return self.adapter.forward(tokens, [start], row, [req.slot])[0]

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
        """Greedy tokens for `logits` [B, vocab] (one device sync)."""
        if self.keep_logits:
            for seq, row in zip(seqs, logits.cpu(), strict=True):
                self.logits.setdefault(id(seq), []).append(row.clone())
        return [int(t) for t in torch.argmax(logits, dim=-1).tolist()]

    def prefill(self, batch: list[Extend]) -> list[int | None]:
        out: list[int | None] = []
        for e in batch:
            req = e.seq.req
            if e.track_at is not None and e.track_slot is not None:
                logits = self._extend(req, e.start, e.track_at)
                assert req.slot is not None
                self.adapter.states.copy([req.slot], [e.track_slot])
                if e.track_at < e.end:
                    logits = self._extend(req, e.track_at, e.end)
            else:
                logits = self._extend(req, e.start, e.end)
            done = e.end == req.total_len
            out.append(self._sample([e.seq], logits[None])[0] if done else None)
        return out

    def decode(self, batch: list[DecodeStep]) -> list[int]:
        groups = [batch] if self.batch_decode else [[d] for d in batch]
        out: list[int] = []
        for group in groups:
            out += self._decode(group)
        tracked = [d for d in batch if d.track_slot is not None]
        if tracked:  # extra_buffer: the state after this step goes to the track slot too
            src = [_slot(d.seq.req) for d in tracked]
            self.adapter.states.copy(
                src, [d.track_slot for d in tracked if d.track_slot is not None]
            )
        return out

    def _decode(self, group: list[DecodeStep]) -> list[int]:
        """One forward: the token at position computed - 1 of every sequence."""
        reqs = [d.seq.req for d in group]
        rows = np.array([r.row for r in reqs], dtype=np.int64)
        starts = [r.computed - 1 for r in reqs]
        kv_index = self.table[rows, : max(starts) + 1]
        tokens = [[_token_at(r, s)] for r, s in zip(reqs, starts, strict=True)]
        slots = [_slot(r) for r in reqs]
        self.forwards += 1
        self.decode_forwards += 1
        logits = self.adapter.forward(tokens, starts, kv_index, slots)
        return self._sample([d.seq for d in group], logits)
