"""Cache events, independent of any wire format.

Two groups, numbered as vLLM numbers hybrid KV cache groups:

* group 0, kind "full_attention": the attention KV of a block of `block_size` tokens;
* group 1, kind "mamba": a recurrent state sitting exactly at the end of a block.

A block is named by the chained hash of every token up to its end (`hashing.py`), so
the same hash in both groups means "the KV of this block" and "the state after it".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

KV_GROUP = 0
STATE_GROUP = 1
KV_KIND = "full_attention"
STATE_KIND = "mamba"
GPU = "GPU"

# vLLM's KVCacheSpecKind values whose blocks hold the attention KV of a whole prefix.
FULL_PREFIX_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})
# Kinds whose blocks hold a recurrent state at the block's end.
STATE_KINDS = frozenset({"mamba"})


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks `block_hashes` (consecutive, the first one a child of `parent_block_hash`,
    None at the start of a sequence) now hold `token_ids`, `block_size` per block."""

    block_hashes: Sequence[int]
    parent_block_hash: int | None
    token_ids: Sequence[int]
    block_size: int
    group: int | None = KV_GROUP
    kind: str | None = KV_KIND
    medium: str | None = GPU


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks `block_hashes` of `group` are gone (None: the only group there is)."""

    block_hashes: Sequence[int]
    group: int | None = KV_GROUP
    medium: str | None = GPU


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """Everything the worker held is gone."""


Event = BlockStored | BlockRemoved | AllBlocksCleared
