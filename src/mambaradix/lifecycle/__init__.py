"""The request lifecycle on top of the tree and the pools: `CacheManager`
(match, lock, allocate, checkpoint, finish, abort; strategies `no_buffer` and
`extra_buffer`, any page size) and its `Request` record."""

from __future__ import annotations

from mambaradix.lifecycle.manager import (
    SGLANG_STATE_HEADROOM,
    CacheManager,
    Evictor,
    lru_evictor,
)
from mambaradix.lifecycle.request import Request
from mambaradix.lifecycle.strategy import STRATEGIES, Strategy

__all__ = [
    "SGLANG_STATE_HEADROOM",
    "STRATEGIES",
    "CacheManager",
    "Evictor",
    "Request",
    "Strategy",
    "lru_evictor",
]
