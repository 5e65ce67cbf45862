"""L3 store on a Mooncake distributed store (optional extra ``mambaradix[mooncake]``).

One Mooncake object per bundle, written with ``upsert_parts``: the master publishes an
object only after all its replicas are written (put start / put end) and hides it while an
upsert rewrites it, so `get` returns the whole previous or the whole new object, or a miss
(a torn read, below). SGLang's backend instead splits a Mamba state into one object per tensor
(``{key}_{rank}_temporal``, ``{key}_{rank}_conv_{i}``,
``storage/mooncake_store/mooncake_store.py:945-953``), which a crash can leave half written;
ours keeps the state's parts in one object, named as the file store names it.

Mooncake's transfer engine binds to the first non-loopback interface: `local_hostname` must be
that interface's address (docs/tiers-stores.md shows a veth pair in a network namespace).
Objects live in memory segments that clients mount (a client may mount none:
``global_segment_size=0``); Mooncake evicts under pressure, so an object may vanish at any time
(a counted miss). A put it cannot place (-200 when no segment has room, -600 when the object
exceeds the client's local buffer) is refused and counted; -900 (RPC_FAIL: the master is
gone) raises StoreUnavailable. A `get` cannot tell an unreachable master from a miss (the
client returns empty bytes for both): a counted miss. An object read in the last few seconds
holds a lease and `delete` leaves it (counted as not removed).

A read can be torn: an upsert of an object of the same size rewrites its buffers in place,
and a read that got the object's location before the upsert started copies whatever is there
(readers hold no reference the upsert waits for; the slow test's driver saw 44 torn of 1,453
reads of one key rewritten in a loop). The bundle's checksum makes that a counted corrupt
miss. The object is removed (``force``, past a reader's lease) only when a second read
returns the very bytes that failed: the master serves a read only from a finished write, so a
torn read is not repeated, and a torn read never deletes the version just written (and
acknowledged). A put landing between that second read and the remove is lost with the
corrupt object: Mooncake has no conditional remove.
"""

from __future__ import annotations

import socket
from typing import Any

from mambaradix.tiers.bundle import BytesLike
from mambaradix.tiers.keys import Namespace
from mambaradix.tiers.store import Blob, BlobStore, StoreUnavailable

_RPC_FAIL = -900


class MooncakeStore(BlobStore):
    """`Store` on Mooncake: master at `master_server_address` ("host:port"), metadata server
    at `metadata_server` (an ``http://.../metadata`` URL), this client at `local_hostname`."""

    def __init__(
        self, namespace: Namespace, *, local_hostname: str, metadata_server: str,
        master_server_address: str, global_segment_size: int = 256 << 20,
        local_buffer_size: int = 128 << 20, protocol: str = "tcp", device_name: str = "",
        connect_timeout_s: float = 5.0,
    ) -> None:
        super().__init__(namespace)
        for name, size, low in (("global_segment_size", global_segment_size, 0),
                                ("local_buffer_size", local_buffer_size, 1)):
            if isinstance(size, bool) or not isinstance(size, int) or size < low:
                raise ValueError(f"{name} must be an int >= {low}, got {size!r}")
        host, _, port = master_server_address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"master_server_address must be host:port, got "
                             f"{master_server_address!r}")
        try:
            from mooncake.store import MooncakeDistributedStore
        except ImportError as e:
            raise ImportError(
                f"MooncakeStore needs Mooncake: pip install 'mambaradix[mooncake]' ({e})"
            ) from None
        self._where = f"mooncake store (master {master_server_address})"
        try:  # setup() retries an absent master for about 90 s: refuse within the timeout
            socket.create_connection((host, int(port)), connect_timeout_s).close()
        except OSError as e:
            raise StoreUnavailable(f"{self._where} unreachable: {e}") from None
        self._store: Any = MooncakeDistributedStore()
        rc = self._store.setup(
            local_hostname, metadata_server, global_segment_size, local_buffer_size, protocol,
            device_name, master_server_address,
        )
        if rc != 0:
            raise StoreUnavailable(f"{self._where}: setup returned {rc}")
        self.last_refusal = 0  # Mooncake's code for the last refused put

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def _client(self) -> Any:
        if self._store is None:
            raise StoreUnavailable(f"{self._where} is closed")
        return self._store

    def _write(self, name: str, chunks: list[BytesLike], nbytes: int) -> bool:
        rc = self._client().upsert_parts(name, *chunks)
        if rc == _RPC_FAIL:
            raise StoreUnavailable(f"{self._where} unreachable: upsert returned {rc}")
        if rc != 0:
            self.last_refusal = rc
        return bool(rc == 0)

    def _read(self, name: str) -> Blob | None:
        value = self._client().get(name)
        return Blob(memoryview(value), value) if value else None  # b"": absent

    def _exists(self, names: list[str]) -> list[bool]:
        if not names:
            return []
        codes = self._client().batch_is_exist(names)
        if any(c < 0 for c in codes):
            raise StoreUnavailable(f"{self._where}: batch_is_exist returned {min(codes)}")
        return [c == 1 for c in codes]

    def _delete(self, names: list[str]) -> int:
        return sum(self._client().remove(name) == 0 for name in names)

    def _discard(self, name: str, token: Any) -> None:
        if self._client().get(name) == token:  # not a torn read: the same bytes again
            self._client().remove(name, True)  # force: past a reader's lease
