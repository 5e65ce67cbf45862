"""Cache events: block-hash events from a tree, for routers and indexers.

`EventEmitter` (standard library only) turns tree changes into `BlockStored` /
`BlockRemoved` / `AllBlocksCleared`; `releases` describes how each vLLM and SGLang
release puts them on the wire; `wire` encodes and decodes them per release (needs the
`events` extra: msgspec); `publisher` sends them over ZMQ (pyzmq). See docs/events.md.
"""

from mambaradix.events.emitter import EventEmitter
from mambaradix.events.hashing import block_digest, chain_hashes, digest_to_int64
from mambaradix.events.model import (
    DEVICE,
    DISK,
    HOST,
    KV_GROUP,
    STATE_GROUP,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
)
from mambaradix.events.releases import RELEASES, Release, release

__all__ = [
    "EventEmitter",
    "RELEASES",
    "Release",
    "release",
    "DEVICE",
    "HOST",
    "DISK",
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
