"""A hybrid-aware KV indexer: what each worker holds of a prompt, and what it can reuse.

`Indexer` (standard library only) is fed events in-process; `feed.WorkerFeed`,
`subscriber.ZmqSubscriber` and `server.IndexServer` (the `events` extra: msgspec, pyzmq)
take them off the wire and answer over HTTP; `mambaradix index` runs them as a process.
"""

from mambaradix.index.indexer import Indexer, Overlap, TierOverlap

__all__ = ["Indexer", "Overlap", "TierOverlap"]
