"""vLLM 0.20.0's hybrid prefix caching with ``mamba_cache_mode="all"`` (its default for
models that support it), the replay's `vllm-0.20-all` row. 0.33.0 has no "all" mode
(``MambaCacheMode = Literal["align", "none"]``); the current release is the `vllm` row
(`mambaradix.policies.vllm`).

States are kept only at attention-block boundaries and no partial block is cached. The
block is vLLM's unified block, computed per layer as vLLM does
(`ModelProfile.vllm_all_block_tokens`), and a state costs what vLLM holds: a padded page
per recurrent layer (`vllm_state_bytes`). For an architecture 0.20.0 does not mark
``SupportsMambaPrefixCaching`` vLLM fell back to its "align" mode; the row then runs the
replay's earlier model of align mode (`VLLM020Align`: a state at the end of every
block-aligned prefill step and every block boundary passed while decoding), which was
not checked against 0.20.0's code.

Departures from vLLM 0.20.0:

* Memory: the same pools as every other row (the split, or Marconi's shared
  budget with `--sequential`), so rows differ only in policy. vLLM draws KV
  blocks and state pages from one block pool.
* Eviction: the tree's LRU (leaves first; states tombstoned, LRU first).
  vLLM evicts free blocks in the order they were freed (a request's blocks
  tail first), KV and state blocks alike.
* A prefill chunk that our scheduler cuts short because the batch's token
  budget ran out (several requests in one batch) is not re-aligned; the
  positions planned at admission (`stops`) are. No EAGLE one-block back-off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mambaradix.geometry.vllm import ALL_MODE_ARCHITECTURES
from mambaradix.lifecycle import Request
from mambaradix.policies.base import BasePolicy, PolicyContext
from mambaradix.policies.kinds import STOP

if TYPE_CHECKING:
    from mambaradix.geometry.profile import ModelProfile


class VLLM020Align(BasePolicy):
    """The replay's earlier model of vLLM's "align" mode, kept as `vllm-0.20-all`'s
    fallback (not a row of its own; vLLM 0.33.0's align mode is `VLLM`).

    Admission: a prefill step is cut to a multiple of the block while it ends
    before the last block boundary of the sequence, `n - n % block` (n: the
    tokens to prefill: prompt, and outputs of a resumed request), and the
    step that would cross that boundary stops at it. A state is cached at the
    end of every step that ends on a block boundary: every full chunk (the
    chunk floored to whole blocks), the last boundary, the prompt end if it
    is one, and every boundary reached while decoding. The partial last block
    is never cached (no insert at finish). Eviction: LRU."""

    name = "vllm-0.20-align"
    finish_insert = False

    def block_tokens(self, profile: ModelProfile) -> int:
        return profile.vllm_block_tokens

    def attach(self, ctx: PolicyContext) -> None:
        super().attach(ctx)
        tokens = self.block_tokens(ctx.profile)
        self.block_units = max(1, -(-tokens // ctx.unit_tokens))
        self.decode_interval = self.block_units

    def state_bytes(self, profile: ModelProfile) -> int:
        return profile.vllm_state_bytes

    def stops(self, req: Request) -> list[int]:
        """The block-aligned ends of vLLM's prefill steps before the sequence end."""
        b, n = self.block_units, req.total_len
        chunk = max(b, self.ctx.chunk_units // b * b)  # vLLM needs a budget of one block
        last, pos, out = n - n % b, req.computed, []
        while pos < n:
            step = min(n - pos, chunk)
            if pos + step < last:
                step = step // b * b
            elif pos < last < pos + step:
                step = last - pos
            pos += step
            if pos < n and pos % b == 0:
                out.append(pos)
        return out

    def cache_at(self, req: Request, kind: str) -> bool:
        return kind == STOP or req.computed % self.block_units == 0


class VLLM020All(VLLM020Align):
    """vLLM 0.20.0 `mamba_cache_mode="all"`: the kernels write a state at every
    block boundary the prefill or the decode passes; all are cached, the
    partial last block is not. The block is 0.20.0's, aligned to the Mamba
    chunk (`vllm_all_block_tokens`). For an architecture 0.20.0 does not mark
    `SupportsMambaPrefixCaching` (Qwen3-Next, and the `marconi-7b` simulator
    profile) vLLM falls back to "align", and so does this policy. Departures:
    the module docstring's."""

    name = "vllm-0.20-all"

    def attach(self, ctx: PolicyContext) -> None:
        geom = ctx.profile.geometry
        self.all_mode = geom is None or geom.architecture in ALL_MODE_ARCHITECTURES
        super().attach(ctx)

    def block_tokens(self, profile: ModelProfile) -> int:
        return profile.vllm_all_block_tokens if self.all_mode else profile.vllm_block_tokens

    def stops(self, req: Request) -> list[int]:
        if not self.all_mode:
            return super().stops(req)
        b = self.block_units
        return list(range((req.computed // b + 1) * b, req.total_len, b))
