"""Cache events, independent of any wire format.

Two groups, numbered as vLLM numbers hybrid KV cache groups:

* group 0, kind "full_attention": the attention KV of a block of `block_size` tokens;
* group 1, kind "mamba": a recurrent state sitting exactly at the end of a block.

A block is named by the chained hash of every token up to its end (`hashing.py`), so
the same hash in both groups means "the KV of this block" and "the state after it".

Every event names the medium its blocks live on: `DEVICE` (L1, accelerator memory),
`HOST` (L2, host memory) or `DISK` (L3, any store below host memory), as vLLM's `medium`
field does; `wire.py` spells them as each release does ("GPU", "CPU", "CPU_PINNED",
"STORAGE", ...). A name no release uses is kept as sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

KV_GROUP = 0
STATE_GROUP = 1
KV_KIND = "full_attention"
STATE_KIND = "mamba"
DEVICE, HOST, DISK = "device", "host", "disk"
MEDIA = (DEVICE, HOST, DISK)

# vLLM's KVCacheSpecKind values whose blocks hold the attention KV of a whole prefix.
FULL_PREFIX_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})
# Kinds whose blocks hold a recurrent state at the block's end.
STATE_KINDS = frozenset({"mamba"})


def check_block_size(block_size: object) -> int:
    """Tokens per block, for whoever makes or reads events (the emitter, the indexer):
    ValueError naming `block_size` unless a positive int (not a bool)."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    return block_size


@dataclass(frozen=True, slots=True)
class BlockStored:
    """`token_ids` (whole blocks of `block_size`, the first a child of
    `parent_block_hash`, None at the start of a sequence) are now stored.

    For the attention KV (a full-prefix kind, or no kind) `block_hashes` names each
    block, in order. For a state group (vLLM's align mode) it names only the blocks
    whose state was kept, in order, possibly none: the blocks between hold nothing.
    `block_size` 0 with no tokens is a placeholder (vLLM's offload connector): blocks
    named by hash alone.

    `namespace` says what else the block hashes depend on ("lora", "cache_salt"), which
    a query by token ids cannot name. `lookahead` (vLLM 0.33 with EAGLE) holds, per
    hash, the tokens after its block that its hash covers.
    """

    block_hashes: Sequence[int]
    parent_block_hash: int | None
    token_ids: Sequence[int]
    block_size: int
    group: int | None = KV_GROUP
    kind: str | None = KV_KIND
    medium: str | None = DEVICE
    namespace: str | None = None
    lookahead: Sequence[Sequence[int]] | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks `block_hashes` of `group` are gone (None: the only group there is)."""

    block_hashes: Sequence[int]
    group: int | None = KV_GROUP
    medium: str | None = DEVICE


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """Everything the worker held is gone."""


Event = BlockStored | BlockRemoved | AllBlocksCleared
