"""Cached == uncached by construction: every prefill on one grid of positions.

In bf16 a prefix cache changes the answers when a cached run computes other
chunks than an uncached one: the uncached run prefills [0, 100) in one
forward, the cached one restores a state at 64 and runs [64, 100); the two
round differently. `deterministic=True` (an `Engine` option) removes that:

* the scheduler splits every prefill at every multiple of G (the chunk size):
  an extend never crosses a grid point and a truncated extend ends on one
  (`SchedulerConfig.truncation_align_size`, SGLang's knob of that name);
* `GridCheckpoints` caches a state only at grid positions reached by prefill
  (chunk ends, planned stops, a prompt end that falls on the grid): never a
  state produced by decode steps (DECODED) nor a finished sequence, since a
  decode step is not the chunk computation an uncached run performs there;
* so every state, and every KV position below it, in the tree came from the
  very cell computations an uncached run performs, and every match lands on
  the grid: a cached run computes the same cells, on the same inputs, as the
  uncached run, and the prompt's last cell (its first token's logits) is
  bitwise the same.

What it does not cover: decode. A decode step runs in a batch whose size and
padding depend on what else is running, which differs with the cache on and
off; batched kernels round differently for other shapes, so later tokens may
still diverge (see the README's table). A retracted sequence is prefilled
again over tokens it first decoded, also a different computation.
"""

from __future__ import annotations

from mambaradix.lifecycle import Request
from mambaradix.policies import Policy
from mambaradix.policies.kinds import CHUNK, PROMPT_END, STOP
from mambaradix.policies.wrap import PolicyWrapper

__all__ = ["GridCheckpoints"]


class GridCheckpoints(PolicyWrapper):
    """`inner`'s checkpoints, kept only at multiples of `grid` reached by
    prefill; no decode-time and no finish-time states; the rest is `inner`'s."""

    decode_interval: int | None = None

    def __init__(self, inner: Policy, grid: int) -> None:
        if isinstance(grid, bool) or not isinstance(grid, int) or grid < 1:
            raise ValueError(f"grid must be a positive int, got {grid!r}")
        super().__init__(inner)
        self.grid = grid

    def stops(self, req: Request) -> list[int]:
        return [s for s in self.inner.stops(req) if s % self.grid == 0]

    def cache_at(self, req: Request, kind: str) -> bool:
        on_grid = req.computed % self.grid == 0
        return kind in (CHUNK, STOP, PROMPT_END) and on_grid and self.inner.cache_at(req, kind)

    def insert_at_finish(self, req: Request) -> bool:
        return False
