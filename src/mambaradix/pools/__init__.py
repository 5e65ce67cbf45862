"""Memory pools for a hybrid-model prefix cache.

The radix tree decides what is cached but never frees memory: it returns KV
indices (`array('q')`) and state slot ids (`int`) that the caller frees into
these pools.

    kv            TokenKVAllocator, PagedKVAllocator   KV token indices
    state         StateSlotAllocator                   recurrent-state slot ids
                  FingerprintStatePool                 pure-Python state stand-in
    req_to_token  ReqToTokenTable                      request row -> KV indices
    geometry      StateGeometry                        shape/bytes of one state slot
    torch_state   TorchStatePool                       real state tensors (needs torch;
                                                       import it explicitly)
    host          HostStatePool, HostKVPool            host-memory (L2) copies (torch)
    transfer      Mover, Transfer                      device <-> host copies (torch)
    store_io      StoreIO                              slots and KV pages <-> an L3 store
                                                       (torch, mambaradix.tiers)

All allocators are LIFO and deterministic; every method either succeeds or
raises ValueError / TypeError leaving the pool unchanged.
"""

from __future__ import annotations

from mambaradix.pools.geometry import StateGeometry
from mambaradix.pools.kv import PagedKVAllocator, TokenKVAllocator
from mambaradix.pools.req_to_token import ReqToTokenTable
from mambaradix.pools.state import (
    EMPTY_FINGERPRINT,
    FingerprintStatePool,
    StateSlotAllocator,
    advance_fingerprint,
    fingerprint_of,
)

__all__ = [
    "EMPTY_FINGERPRINT",
    "FingerprintStatePool",
    "PagedKVAllocator",
    "ReqToTokenTable",
    "StateGeometry",
    "StateSlotAllocator",
    "TokenKVAllocator",
    "advance_fingerprint",
    "fingerprint_of",
]
