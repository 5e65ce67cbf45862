"""Cache events: block-hash events from a tree, for routers and indexers.

`EventEmitter` (standard library only) turns tree changes into `BlockStored` /
`BlockRemoved` / `AllBlocksCleared`; `wire` encodes them as vLLM or SGLang send them
(needs the `events` extra: msgspec); `publisher` sends them over ZMQ (pyzmq).
"""

from mambaradix.events.emitter import EventEmitter
from mambaradix.events.hashing import block_digest, chain_hashes, digest_to_int64
from mambaradix.events.model import (
    KV_GROUP,
    STATE_GROUP,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
)

__all__ = [
    "EventEmitter",
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "Event",
    "KV_GROUP",
    "STATE_GROUP",
    "block_digest",
    "chain_hashes",
    "digest_to_int64",
]
