"""L3 store on a Redis server (extra ``mambaradix[redis]``: ``redis`` + ``hiredis``).

One Redis string per object, set with one SET: Redis applies a command whole or not at all,
so a client killed mid-send leaves the previous value (the server drops the partial
command). A server at ``maxmemory`` with ``noeviction`` answers OOM: the put is refused and
counted. With an evicting ``maxmemory-policy`` objects can vanish at any time: `exists` and
`longest_prefix` are snapshots and a `get` may miss. Durability is the server's (RDB/AOF
settings); a server that persists nothing loses the cache on restart.
"""

from __future__ import annotations

from typing import Any

from mambaradix.tiers.bundle import BytesLike
from mambaradix.tiers.keys import Namespace
from mambaradix.tiers.store import Blob, BlobStore, StoreError, StoreUnavailable


class RedisStore(BlobStore):
    """`Store` on a Redis server at `host`:`port` (database `db`)."""

    def __init__(
        self, namespace: Namespace, *, host: str = "127.0.0.1", port: int = 6379, db: int = 0,
        timeout_s: float = 5.0,
    ) -> None:
        super().__init__(namespace)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"port must be an int in 1..65535, got {port!r}")
        if not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number, got {timeout_s!r}")
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise ImportError(
                "RedisStore needs the redis client: pip install 'mambaradix[redis]'"
            ) from None
        self._errors = redis.exceptions
        self._where = f"redis store at {host}:{port}/{db}"
        self._client: Any = redis.Redis(  # fail within timeout_s: no retries
            host=host, port=port, db=db, socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0),
        )
        self._call(self._client.ping)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _call(self, fn: Any, *args: Any) -> Any:
        """Run one client call; connection trouble becomes StoreUnavailable."""
        if self._client is None:
            raise StoreUnavailable(f"{self._where} is closed")
        try:
            return fn(*args)
        except (self._errors.ConnectionError, self._errors.TimeoutError) as e:
            raise StoreUnavailable(f"{self._where} unreachable: {e}") from None

    def _write(self, name: str, chunks: list[BytesLike], nbytes: int) -> bool:
        try:
            self._call(self._client.set, name, b"".join(chunks))
        except self._errors.OutOfMemoryError:  # maxmemory reached, noeviction
            return False
        except self._errors.ResponseError as e:
            raise StoreError(f"{self._where}: SET {name}: {e}") from None
        return True

    def _read(self, name: str) -> Blob | None:
        value = self._call(self._client.get, name)
        return None if value is None else Blob(memoryview(value))

    def _exists(self, names: list[str]) -> list[bool]:
        pipe = self._call(self._client.pipeline, False)
        for name in names:
            pipe.exists(name)
        return [bool(n) for n in self._call(pipe.execute)]

    def _delete(self, names: list[str]) -> int:
        return int(self._call(self._client.delete, *names)) if names else 0
