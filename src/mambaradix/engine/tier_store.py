"""The engine's store tier (L3): what the host tier drops is written to a `tiers.FileStore`
through `pools.store_io.StoreIO` (durable: write, fsync, rename), loaded back from there
into the device pools. The decisions are `lifecycle.tiers`'; a key's prefix hash becomes the
store's page key (`store_hash`), one object per KV token and per state (HiCache's pools
`kv` and `mamba`), in a namespace tagged with the pools' layout, so another model or layout
misses. A refused write or a missing or corrupt object is a counted miss (`StoreIO`): the
entry is forgotten and the load fails, never a wrong state.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from mambaradix.lifecycle.tiers import Key
from mambaradix.pools.store_io import StoreIO, cache_namespace
from mambaradix.pools.transfer import Group, Mover, Transfer
from mambaradix.tiers import KV, MAMBA, FileStore, ObjectKey

__all__ = ["StoreTier", "layer_key", "store_hash"]


def store_hash(h: object) -> str:
    """A layer key's prefix hash (a Python int) as the store's 64-hex page key."""
    assert isinstance(h, int)
    return f"{h % 2**64:064x}"


def layer_key(base: str) -> Key | None:
    """The layer key an object name (without its namespace suffix) stands for: the
    inverse of `store_hash` (the prefix hash back in Python's signed 64-bit range) and
    of HiCache's pool suffix; None for a name that is not one of ours."""
    page, dot, pool = base.partition(".")
    if len(page) != 64 or (dot and pool != MAMBA):
        return None
    try:
        value = int(page, 16)
    except ValueError:
        return None
    if value >= 2**64:
        return None
    h = value - 2**64 if value >= 2**63 else value
    return ("st", h, 0) if dot else ("kv", h)


class StoreTier:
    """A file store below the host tier, for pools shaped like `states` and `kv`."""

    def __init__(
        self, root: str | os.PathLike[str], model: str, states: Group, kv: Group, mover: Mover
    ) -> None:
        self.store = FileStore(root, cache_namespace(model, states, kv, 1))
        self.io = StoreIO(self.store, states, kv, page_size=1, mover=mover)
        # prefetches: reads into host pools on a worker thread, with their own CPU mover
        self.ahead = StoreIO(self.store, states, kv, page_size=1, background=True)

    def save(self, key: Key, src: Group, unit: int) -> bool:
        """Write `key`'s bytes from unit `unit` of `src` (a host pool); whether acknowledged."""
        h = store_hash(key[1])
        if key[0] == "st":
            return self.io.save_states([(h, unit)], src).wait()[0]
        return self.io.save_kv([(h, [unit])], src).wait()[0]

    def read_ahead(self, key: Key, dst: Group, unit: int) -> Transfer[list[bool]]:
        """Start reading `key` into unit `unit` of `dst` (a host pool) on the worker."""
        h = store_hash(key[1])
        if key[0] == "st":
            return self.ahead.load_states([(h, unit)], dst)
        return self.ahead.load_kv([(h, [unit])], dst)

    def load(self, kind: str, pieces: Sequence[tuple[Key, int]], dst: Group) -> list[Key]:
        """Read each (key, unit of `dst`); the keys the store missed."""
        if not pieces:
            return []
        if kind == "st":
            got = self.io.load_states([(store_hash(k[1]), u) for k, u in pieces], dst).wait()
        else:
            got = self.io.load_kv([(store_hash(k[1]), [u]) for k, u in pieces], dst).wait()
        return [k for (k, _), ok in zip(pieces, got, strict=True) if not ok]

    def delete(self, key: Key) -> None:
        self.store.delete([self.object_key(key)])

    def objects(self) -> int:
        """Objects of this model and layout in the store's directory (its ``.bin`` files
        with this namespace's suffix)."""
        return len(self.found())

    def found(self) -> list[Key]:
        """The layer keys of this namespace's objects in the directory, least recently
        written first (a store another engine, maybe another process, wrote: the cache
        survives a restart). Objects of another model or layout, or of names not ours, are
        passed over."""
        tail = self.store.namespace.suffix + ".bin"
        seen = []
        with os.scandir(self.store.root) as entries:
            for entry in entries:
                key = layer_key(entry.name[: -len(tail)]) if entry.name.endswith(tail) else None
                if key is not None and entry.is_file(follow_symlinks=False):
                    seen.append((entry.stat().st_mtime_ns, entry.name, key))
        return [key for _, _, key in sorted(seen)]

    def holds(self, keys: Sequence[Key]) -> list[bool]:
        return self.store.exists([self.object_key(k) for k in keys])

    @staticmethod
    def object_key(key: Key) -> ObjectKey:
        return ObjectKey(store_hash(key[1]), MAMBA if key[0] == "st" else KV)

    def close(self) -> None:
        self.ahead.close()  # joins the worker
        self.io.close()
        self.store.close()
