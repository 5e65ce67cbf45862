"""The L3 store interface (`Store`) and the base that backends build it on (`BlobStore`).

A store maps an `ObjectKey` (page hash, pool) to a bundle: named parts of bytes, e.g. a
recurrent state's conv and SSM tensors, or a KV page. Callers move bytes; the tree decides
what to write and load and keeps its own view of what the store holds (see
docs/tiers-stores.md, "The seam").

Outcomes, the same in every backend:

* an object is visible (to `get`, `exists`, `longest_prefix`, any process) only once all its
  parts are durably written (publish after write); a put interrupted at any point (crash,
  SIGKILL, full disk) leaves the previous object or nothing under its key, never a mix;
* `get` never returns wrong bytes: a blob that is truncated, altered or written under another
  name is a *counted miss* (`StoreStats.corrupt`), and the backend deletes it;
* a put the store has no room for, or that the server refuses, returns False and is counted
  (`StoreStats.put_rejected`); nothing else changes;
* a store that cannot be reached raises `StoreUnavailable` (a clear one-line error naming the
  store); puts acknowledged before it stay durable;
* bad arguments raise TypeError/ValueError naming the parameter before any object is touched.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

from mambaradix.tiers.bundle import BytesLike, CorruptObject, as_parts, decode, encode
from mambaradix.tiers.keys import Namespace, ObjectKey, check_key, check_page_hash
from mambaradix.tiers.prefix import PoolRule, PrefixHit, check_rules, usable_prefix

Bundle = Mapping[str, BytesLike]


class StoreError(RuntimeError):
    """A store operation failed for a reason other than a miss or a full store."""


class StoreUnavailable(StoreError):
    """The store's server or directory cannot be reached."""


class Blob(NamedTuple):
    """What a backend read: the blob, which version it was (for `_discard`), and its body
    checksum when the backend computed it while reading (`bundle.decode`)."""

    data: memoryview
    version: Any = None
    digest: bytes | None = None


class StoreStats(NamedTuple):
    """Counters since the store object was opened (this process only)."""

    puts: int  # objects written and acknowledged
    put_bytes: int  # their blob bytes
    put_rejected: int  # puts refused: store full, or the server said no
    gets: int  # objects asked for
    hits: int  # returned with verified bytes
    misses: int  # absent, plus corrupt
    corrupt: int  # found but failed verification (counted in misses too)
    get_bytes: int  # blob bytes of the hits
    deletes: int  # objects removed by delete()


@runtime_checkable
class Store(Protocol):
    """An L3 store of bundles, keyed by page hash and pool (SGLang HiCache v2 compatible).

    One store object is not thread-safe: use one per thread. Several processes may open the
    same backing store (directory, server) at once: each object is atomic across processes.
    Every method validates all its arguments before it touches any object.
    """

    @property
    def namespace(self) -> Namespace:
        """Model, rank and layout tag in every object's name (immutable)."""
        ...

    def put(self, items: Sequence[tuple[ObjectKey, Bundle]]) -> list[bool]:
        """Write each (key, bundle); one bool per item, True once it is durable and visible.

        Mutates the store. Each item is atomic (all parts or none) and replaces any object
        under its key; items are independent (no atomicity across items). The caller's
        buffers are only read, and may be reused once put returns. False: the store is full
        or refused it (counted). Raises StoreUnavailable when the store cannot be reached:
        items acknowledged by an earlier call stay, this call's may or may not be written.
        """
        ...

    def get(self, keys: Sequence[ObjectKey]) -> list[dict[str, memoryview] | None]:
        """Read each key's bundle: read-only views of a private copy, or None on a miss.

        Does not change what the store holds, except that a corrupt object is deleted (and
        counted). The returned views are the caller's: safe to keep, unaffected by later
        puts. Raises StoreUnavailable when the store cannot be reached.
        """
        ...

    def exists(self, keys: Sequence[ObjectKey]) -> list[bool]:
        """Whether each key has an object (read-only; a snapshot that may go stale at once).

        An object that exists may still miss on `get` (deleted meanwhile, or found corrupt).
        """
        ...

    def delete(self, keys: Sequence[ObjectKey]) -> int:
        """Remove the keys' objects (mutates); returns how many existed."""
        ...

    def longest_prefix(self, chain: Sequence[str], rules: Sequence[PoolRule]) -> PrefixHit:
        """The longest prefix of the page-hash `chain` the store can restore under `rules`.

        Read-only; one batched existence check. The answer is a plan, not a promise: the
        caller loads it with `get` and falls back to fewer pages on a miss.
        """
        ...

    def stats(self) -> StoreStats:
        """A snapshot of this object's counters (read-only)."""
        ...

    def close(self) -> None:
        """Release connections and handles (idempotent); objects stay in the store."""
        ...


@dataclass
class _Counters:
    puts: int = 0
    put_bytes: int = 0
    put_rejected: int = 0
    gets: int = 0
    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    get_bytes: int = 0
    deletes: int = 0

    def snapshot(self) -> StoreStats:
        return StoreStats(*astuple(self))


class BlobStore(ABC):
    """`Store` built on four whole-blob primitives a backend implements.

    The base validates arguments, frames and checks bundles (`bundle.py`), counts outcomes and
    answers `longest_prefix`; a backend only stores named blobs, writing each atomically.
    """

    def __init__(self, namespace: Namespace) -> None:
        if not isinstance(namespace, Namespace):
            raise TypeError(f"namespace must be a Namespace, got {type(namespace).__name__}")
        self._namespace = namespace
        self._counts = _Counters()

    # ------------------------------------------------------------------ backend primitives

    @abstractmethod
    def _write(self, name: str, chunks: list[BytesLike], nbytes: int) -> bool:
        """Store the blob `b"".join(chunks)` under `name` atomically; False when refused."""

    @abstractmethod
    def _read(self, name: str) -> Blob | None:
        """The blob under `name`, or None."""

    @abstractmethod
    def _exists(self, names: list[str]) -> list[bool]:
        """Whether each name holds a blob."""

    @abstractmethod
    def _delete(self, names: list[str]) -> int:
        """Remove the names' blobs; how many existed."""

    def _discard(self, name: str, version: Any) -> None:
        """Remove a corrupt blob (the `version` read, where a backend can tell)."""
        self._delete([name])

    @abstractmethod
    def close(self) -> None:
        """Release connections and handles (idempotent)."""

    # ------------------------------------------------------------------ Store

    @property
    def namespace(self) -> Namespace:
        return self._namespace

    def put(self, items: Sequence[tuple[ObjectKey, Bundle]]) -> list[bool]:
        checked = []
        for i, item in enumerate(_sequence(items, "items")):
            key, parts = _item(item, i)
            checked.append((self._name(key, f"items[{i}][0]"), as_parts(parts, f"items[{i}][1]")))
        done = []
        for name, parts in checked:
            chunks, nbytes = encode(name, parts)
            ok = self._write(name, chunks, nbytes)
            self._counts.puts += ok
            self._counts.put_bytes += nbytes if ok else 0
            self._counts.put_rejected += not ok
            done.append(ok)
        return done

    def get(self, keys: Sequence[ObjectKey]) -> list[dict[str, memoryview] | None]:
        names = self._names(keys)
        return [self._get_one(name) for name in names]

    def _get_one(self, name: str) -> dict[str, memoryview] | None:
        self._counts.gets += 1
        blob = self._read(name)
        if blob is None:
            self._counts.misses += 1
            return None
        try:
            parts = decode(blob.data, name, blob.digest)
        except CorruptObject:
            self._counts.misses += 1
            self._counts.corrupt += 1
            self._discard(name, blob.version)
            return None
        self._counts.hits += 1
        self._counts.get_bytes += blob.data.nbytes
        return parts

    def exists(self, keys: Sequence[ObjectKey]) -> list[bool]:
        return self._exists(self._names(keys))

    def delete(self, keys: Sequence[ObjectKey]) -> int:
        removed = self._delete(self._names(keys))
        self._counts.deletes += removed
        return removed

    def longest_prefix(self, chain: Sequence[str], rules: Sequence[PoolRule]) -> PrefixHit:
        pages = list(_sequence(chain, "chain"))
        for i, page_hash in enumerate(pages):
            check_page_hash(page_hash, f"chain[{i}]")
        checked = check_rules(rules)
        names = [self._name(ObjectKey(h, r.pool), "chain") for r in checked for h in pages]
        flags = self._exists(names) if names else []
        n = len(pages)
        present = {r.pool: flags[j * n : (j + 1) * n] for j, r in enumerate(checked)}
        return usable_prefix(n, present, checked)

    def stats(self) -> StoreStats:
        return self._counts.snapshot()

    # ------------------------------------------------------------------ helpers

    def _name(self, key: object, what: str) -> str:
        return self._namespace.object_name(check_key(key, what))

    def _names(self, keys: Sequence[ObjectKey]) -> list[str]:
        if isinstance(keys, ObjectKey):
            raise TypeError("keys must be a sequence of ObjectKey, got one ObjectKey")
        return [self._name(k, f"keys[{i}]") for i, k in enumerate(_sequence(keys, "keys"))]


def _sequence(value: object, name: str) -> Sequence[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence, got {type(value).__name__}")
    return value


def _item(item: object, i: int) -> tuple[object, object]:
    if not isinstance(item, tuple) or len(item) != 2:
        raise TypeError(f"items[{i}] must be a (key, bundle) pair, got {type(item).__name__}")
    return item[0], item[1]
