"""L3 store on a Mooncake distributed store (optional extra ``mambaradix[mooncake]``).

One Mooncake object per bundle, written with ``upsert_parts``: the master publishes an
object only after all its replicas are written (put start / put end), so readers see the
whole previous or the whole new object. SGLang's backend instead splits a Mamba state into
one object per tensor (``{key}_{rank}_temporal``, ``{key}_{rank}_conv_{i}``,
``storage/mooncake_store/mooncake_store.py:945-953``), which a crash can leave half written;
ours keeps the state's parts in one object, named as the file store names it.

Mooncake's transfer engine binds to the first non-loopback interface: `local_hostname` must be
that interface's address (docs/tiers-stores.md shows a veth pair in a network namespace).
Objects live in memory segments that clients mount; Mooncake evicts under pressure, so an
object may vanish at any time (a counted miss). A put it cannot place (no space, object larger
than the client's local buffer) returns a non-zero code: refused and counted.
"""

from __future__ import annotations

from typing import Any

from mambaradix.tiers.bundle import BytesLike
from mambaradix.tiers.keys import Namespace
from mambaradix.tiers.store import BlobStore, StoreUnavailable


class MooncakeStore(BlobStore):
    """`Store` on Mooncake: master at `master_server_address` ("host:port"), metadata server
    at `metadata_server` (an ``http://.../metadata`` URL), this client at `local_hostname`."""

    def __init__(
        self, namespace: Namespace, *, local_hostname: str, metadata_server: str,
        master_server_address: str, global_segment_size: int = 256 << 20,
        local_buffer_size: int = 128 << 20, protocol: str = "tcp", device_name: str = "",
    ) -> None:
        super().__init__(namespace)
        for name, size in (("global_segment_size", global_segment_size),
                           ("local_buffer_size", local_buffer_size)):
            if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
                raise ValueError(f"{name} must be a positive int, got {size!r}")
        try:
            from mooncake.store import MooncakeDistributedStore
        except ImportError as e:
            raise ImportError(
                f"MooncakeStore needs Mooncake: pip install 'mambaradix[mooncake]' ({e})"
            ) from None
        self._where = f"mooncake store (master {master_server_address})"
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
        if rc != 0:
            self.last_refusal = rc
        return bool(rc == 0)

    def _read(self, name: str) -> tuple[memoryview, Any] | None:
        value = self._client().get(name)
        return (memoryview(value), None) if value else None  # b"": absent

    def _exists(self, names: list[str]) -> list[bool]:
        if not names:
            return []
        codes = self._client().batch_is_exist(names)
        if any(c < 0 for c in codes):
            raise StoreUnavailable(f"{self._where}: batch_is_exist returned {min(codes)}")
        return [c == 1 for c in codes]

    def _delete(self, names: list[str]) -> int:
        return sum(self._client().remove(name) == 0 for name in names)
