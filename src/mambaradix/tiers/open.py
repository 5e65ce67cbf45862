"""Open a store from one string, for command lines and configs.

* ``file:PATH`` or a plain path: `FileStore` (the default);
* ``redis://HOST:PORT[/DB]``: `RedisStore`;
* ``mooncake://MASTER_HOST:PORT?local=ADDR&metadata=URL``: `MooncakeStore` (``local`` is this
  host's non-loopback address, ``metadata`` the HTTP metadata server's URL).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from mambaradix.tiers.keys import Namespace
from mambaradix.tiers.store import Store


def open_store(spec: str, namespace: Namespace, **options: Any) -> Store:
    """The store `spec` names; `options` go to its constructor (e.g. ``capacity_bytes``)."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"spec must be a non-empty string, got {spec!r}")
    scheme = spec.split("://", 1)[0] if "://" in spec else ""
    if scheme == "redis":
        from mambaradix.tiers.redis_store import RedisStore

        url = urlsplit(spec)
        db = url.path.strip("/") or "0"
        if not url.hostname or not db.isdigit():
            raise ValueError(f"spec must look like redis://HOST:PORT[/DB], got {spec!r}")
        return RedisStore(namespace, host=url.hostname, port=url.port or 6379, db=int(db),
                          **options)
    if scheme == "mooncake":
        from mambaradix.tiers.mooncake_store import MooncakeStore

        url = urlsplit(spec)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if not url.netloc or "local" not in query or "metadata" not in query:
            raise ValueError(
                f"spec must look like mooncake://HOST:PORT?local=ADDR&metadata=URL, got {spec!r}"
            )
        return MooncakeStore(namespace, local_hostname=query["local"],
                             metadata_server=query["metadata"],
                             master_server_address=url.netloc, **options)
    if scheme not in ("", "file"):
        raise ValueError(f"spec: unknown store scheme {scheme!r} (file:, redis://, mooncake://)")
    from mambaradix.tiers.file_store import FileStore

    path = spec.removeprefix("file://").removeprefix("file:")
    return FileStore(path, namespace, **options)
