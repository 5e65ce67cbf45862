"""`Request`: what the cache needs to know about one request while it holds memory.

The fields mirror SGLang's `Req` where the cache reads or writes them:

    row            req_pool_idx             its row of the request-to-token table
    slot           mamba_pool_idx           its running state slot
    track_slots    ping-pong track buffer   extra_buffer: slots the forward writes
                                            tracked states into
    next_track     mamba_next_track_idx     which track slot the next track writes
    last_track_len mamba_last_track_seqlen  position of the newest tracked state
    node / lock    last_node                the matched node and its lock receipt
    cow_src        mamba_cow_src_index      state to copy into `slot` before the
                                            first forward (deferred copy-on-write)
    prefix_len     cache_protected_len      positions below it are tree-owned
    computed       kv_committed_len         tokens whose KV exists (and that the
                                            running state has consumed)

Ownership (reference doc I9/I10): row positions below `prefix_len` hold the
tree's KV indices, positions in [prefix_len, computed) are the request's own.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable
from dataclasses import dataclass, field

from mambaradix.core.node import TreeNode
from mambaradix.core.tree import LockReceipt


@dataclass(eq=False)
class Request:
    """One request's cache bookkeeping. `tokens` is input + output so far."""

    input_ids: array[int]
    extra_key: Hashable | None = None
    output_ids: array[int] = field(default_factory=lambda: array("q"))
    row: int | None = None
    slot: int | None = None
    track_slots: list[int] | None = None
    next_track: int = 0
    last_track_len: int | None = None
    node: TreeNode | None = None
    lock: LockReceipt | None = None
    cow_src: int | None = None
    needs_clear: bool = False
    prefix_len: int = 0
    computed: int = 0
    cached_len: int = 0  # tokens reused by the last match (the prompt's hit)
    kv_hit_len: int = 0  # KV matched by the last match, also past its last state
    branching_len: int | None = None  # chunk-aligned divergence point (extra_buffer)
    prefix_kv: array[int] = field(default_factory=lambda: array("q"))  # matched KV

    @property
    def tokens(self) -> array[int]:
        return self.input_ids + self.output_ids

    @property
    def total_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def admitted(self) -> bool:
        """Holds a row (and so KV, a slot and a lock)."""
        return self.row is not None

    def keep_track_index(self) -> int:
        """Index into `track_slots` of the newest tracked state (SGLang's
        get_mamba_ping_pong_keep_idx: the slot before `next_track`)."""
        assert self.track_slots is not None
        n = len(self.track_slots)
        return (self.next_track - 1) % n
