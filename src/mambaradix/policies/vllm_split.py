"""Where vLLM 0.33.0 ends a hybrid model's prefill steps and where it has a state to keep.

Our own code for three rules of vLLM 0.33.0 (align mode, no speculative decoding, no KV
connector, no ``prefix_match_unit``; file:line in the wheel
``vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl``), tested against vLLM's functions called
directly (``tests/test_vllm_split.py``):

* `checkpoint_position`: ``get_mamba_prefill_checkpoint_position`` without EAGLE
  (``v1/kv_cache_interface.py:1169-1186``): the last block boundary before ``tokens``;
* `exports_checkpoint`: ``is_mamba_prefill_checkpoint_valid``
  (``v1/kv_cache_interface.py:1189-1210``): whether the forward of a step can write the
  state at a checkpoint strictly inside it (Mamba2 and FlashInfer GDN layers can; the step
  need not end there);
* `aligned_split`: ``Scheduler._mamba_block_aligned_split`` (``v1/core/sched/
  scheduler.py:546-662``): a prefill step ends on a block boundary unless it ends the
  prefill, never runs past the last cacheable boundary mid-step (unless the forward exports
  that checkpoint), and stops at a shared-prefix junction.

`prefill_steps` plays the split forward for a request served alone (each step asks for
``min(remaining, chunk)`` tokens, scheduler.py:1250-1300 and 829-860), and `step_checkpoint`
is the state a step's forward exports (``MambaManager.get_num_blocks_to_allocate``,
``v1/core/single_type_kv_cache_manager.py:1761-1776`` with ``_needs_internal_checkpoint``,
1659-1690).
"""

from __future__ import annotations

__all__ = [
    "aligned_split",
    "checkpoint_position",
    "exports_checkpoint",
    "prefill_steps",
    "step_checkpoint",
]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def checkpoint_position(tokens: int, block: int) -> int:
    """The last block boundary strictly before `tokens` (0 if none): the state a later
    request can resume from, since a full hit is cut to ``tokens - 1``."""
    return max((tokens - 1) // block * block, 0)


def exports_checkpoint(
    start: int, end: int, checkpoint: int, block: int, alignment: int | None
) -> bool:
    """Whether the forward of a step over ``[start, end)`` can export the state at
    `checkpoint` (`alignment`: the Mamba layers' checkpoint alignment, None where they
    cannot export one)."""
    if alignment is None:
        return False
    initial_column = (start - 1) // block
    column = _cdiv(end, block) - 2
    return (
        start % block == 0
        and column > initial_column
        and start + block <= checkpoint
        and start < checkpoint < end
        and (checkpoint - start) % alignment == 0
    )


def aligned_split(
    start: int,
    new_tokens: int,
    prompt: int,
    tokens: int,
    block: int,
    chunk: int,
    junction: int,
    alignment: int | None,
) -> int:
    """How many of `new_tokens` a step starting at `start` schedules, for a request of
    `tokens` tokens (`prompt` of them prompt) with shared-prefix junction `junction` (0:
    none), at most `chunk` tokens a step, Mamba checkpoint alignment `alignment`."""
    prefill_end = max(prompt, tokens - 1)
    if start >= prefill_end:
        return new_tokens
    last_cache = checkpoint_position(tokens, block)
    end = start + new_tokens
    internal = end >= prefill_end and exports_checkpoint(
        start, end, checkpoint_position(prefill_end, block), block, alignment
    )
    if internal:
        last_cache = 0
    if end < prefill_end:
        aligned_end = end // block * block
        if aligned_end > start or block <= chunk:
            end = aligned_end
    next_boundary = (start // block + 1) * block
    junction_stop = start + (junction - start) // block * block
    stops = (
        next_boundary if start % block and not internal else 0,
        last_cache,
        junction_stop if start < junction < end else 0,
    )
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)


def step_checkpoint(
    start: int,
    end: int,
    prompt: int,
    tokens: int,
    block: int,
    alignment: int | None,
    sparse: bool,
) -> int:
    """The checkpoint the forward of the step ``[start, end)`` exports (0: none): the last
    block boundary before `end`. With sparse retention (interval 0) only the step that
    reaches the prefill end exports one; otherwise every step may."""
    prefill_end = max(prompt, tokens - 1) if sparse else 0
    checkpoint = checkpoint_position(end, block)
    if end < prefill_end or not exports_checkpoint(start, end, checkpoint, block, alignment):
        return 0
    return checkpoint


def prefill_steps(
    start: int,
    prompt: int,
    tokens: int,
    block: int,
    chunk: int,
    junction: int,
    alignment: int | None,
) -> list[int]:
    """The ends of vLLM's prefill steps for a request served alone from `start` to
    `tokens` (its last step ends at `tokens`)."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    ends, pos = [], start
    while pos < tokens:
        n = aligned_split(
            pos, min(tokens - pos, chunk), prompt, tokens, block, chunk, junction, alignment
        )
        if n <= 0:
            raise AssertionError(f"vLLM's split schedules nothing at {pos} of {tokens}")
        pos += n
        ends.append(pos)
    return ends
