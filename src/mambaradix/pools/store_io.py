"""State slots and KV pages to and from an L3 store (`mambaradix.tiers.Store`).

One store object per state and per KV page, keyed as SGLang HiCache v2 keys them (the tree
gives the page hashes, `tiers.page_hashes`): a state under the hash of the last KV page it
covers, pool ``mamba``; a KV page under its own hash, pool ``kv``. An object is a bundle of
named parts, one per tensor of the group, holding that object's units of every layer:

    state object   conv0: [layers, 1, *conv_shape]   ...   ssm: [layers, 1, *ssm_shape]
    KV page        k: [layers, page_size, heads, head_dim]   v: (the same)

Parts are raw bytes (bitwise, every dtype). The store's namespace carries a layout tag
(`cache_layout`: every part's dtype and shape) so that objects written for another dtype or
shape have other names and miss; on top of that every part's size is checked on load, and an
object whose parts do not fit is a counted miss (`malformed`) that writes nothing. A missing
or corrupt object (the store counts `corrupt`) is a miss too: the destination units of a miss
keep what they held, so a miss is never a wrong state.

Every method returns a `transfer.Transfer`: with ``background=True`` the store I/O runs on
one worker thread that this object owns (the only thread that touches the store, as the
`Store` contract asks), so a load or a save is asynchronous to the caller; else it runs
inside the call. Copies to and from a CUDA group are asynchronous as `Mover.copy` describes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple, TypeVar

import numpy as np
import torch

from mambaradix.pools._checks import as_index_array, as_positive
from mambaradix.pools.transfer import Group, Mover, Transfer, bitwise_view, done, group_layout
from mambaradix.tiers import KV, MAMBA, Namespace, ObjectKey, Store, layout_tag
from mambaradix.tiers.keys import check_page_hash

__all__ = ["StoreIO", "StoreIOStats", "cache_layout", "cache_namespace"]

T = TypeVar("T")
Layout = dict[str, tuple[torch.dtype, tuple[int, ...]]]


def _spec(layout: Layout, units: int, prefix: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {
        f"{prefix}.{part}": (str(dtype).removeprefix("torch."), (shape[0], units, *shape[1:]))
        for part, (dtype, shape) in layout.items()
    }


def cache_layout(states: Group, kv: Group, page_size: int) -> str:
    """The layout tag of a cache's objects: every part's dtype and per-object shape (states
    one slot, KV `page_size` tokens), for `Namespace(layout=...)`."""
    spec = _spec(group_layout(states, "states"), 1, MAMBA)
    spec |= _spec(group_layout(kv, "kv"), as_positive(page_size, "page_size"), KV)
    return layout_tag(spec)


def cache_namespace(
    model: str, states: Group, kv: Group, page_size: int, tp_rank: int = 0, tp_size: int = 1
) -> Namespace:
    """The namespace a store needs for `StoreIO(store, states, kv, page_size)`."""
    return Namespace(model, tp_rank, tp_size, cache_layout(states, kv, page_size))


class StoreIOStats(NamedTuple):
    """Objects (states and KV pages together) since the StoreIO was made."""

    saved: int  # acknowledged by the store
    refused: int  # the store was full or said no
    loaded: int  # read and written to their destination units
    missed: int  # absent, corrupt (the store's `corrupt`) or malformed
    malformed: int  # verified by the store but with parts of another layout (also in missed)
    bytes_saved: int  # payload bytes (parts), not the store's framing
    bytes_loaded: int


class _Pool(NamedTuple):
    name: str  # the store pool: MAMBA or KV
    layout: Layout
    units: int  # units per object


class StoreIO:
    """Saves and loads state slots and KV pages of tensor groups shaped like `states` and
    `kv` (device or host groups; only their layouts are kept) through `store`, whose
    namespace must carry `cache_layout(states, kv, page_size)` (ValueError otherwise)."""

    def __init__(
        self,
        store: Store,
        states: Group,
        kv: Group,
        page_size: int = 1,
        *,
        mover: Mover | None = None,
        background: bool = False,
    ) -> None:
        if not isinstance(store, Store):
            raise TypeError(f"store must implement tiers.Store, got {type(store).__name__}")
        want = cache_layout(states, kv, page_size)
        if store.namespace.layout != want:
            raise ValueError(
                f"store: its namespace has layout {store.namespace.layout!r}, these pools need "
                f"{want!r} (open it with cache_namespace(...))"
            )
        if mover is not None and not isinstance(mover, Mover):
            raise TypeError(f"mover must be a Mover, got {type(mover).__name__}")
        self.store = store
        self._states = _Pool(MAMBA, group_layout(states, "states"), 1)
        self._kv = _Pool(KV, group_layout(kv, "kv"), page_size)
        self._mover = mover or Mover()
        self._worker = ThreadPoolExecutor(1, "store-io") if background else None
        self._counts = dict.fromkeys(StoreIOStats._fields, 0)

    # ------------------------------------------------------------------ API

    def save_states(self, items: Sequence[tuple[str, int]], src: Group) -> Transfer[list[bool]]:
        """Write each (page hash, slot of `src`) as a state object; the result has one bool
        per item: True once the store acknowledged it (durable and visible)."""
        return self._submit(self._save, self._states, _items(items, "items"), src)

    def load_states(self, items: Sequence[tuple[str, int]], dst: Group) -> Transfer[list[bool]]:
        """Read each (page hash, slot of `dst`) state object into that slot; the result has
        one bool per item, False for a miss (the slot is left as it was)."""
        return self._submit(self._load, self._states, _items(items, "items"), dst)

    def save_kv(
        self, items: Sequence[tuple[str, Sequence[int]]], src: Group
    ) -> Transfer[list[bool]]:
        """Write each (page hash, the page's `page_size` KV units of `src`) as a KV object."""
        return self._submit(self._save, self._kv, _items(items, "items"), src)

    def load_kv(
        self, items: Sequence[tuple[str, Sequence[int]]], dst: Group
    ) -> Transfer[list[bool]]:
        """Read each (page hash, `page_size` KV units of `dst`) KV object into those units."""
        return self._submit(self._load, self._kv, _items(items, "items"), dst)

    def stats(self) -> StoreIOStats:
        """A snapshot of the counters (reads them after the worker's last finished call)."""
        return StoreIOStats(**self._counts)

    def close(self) -> None:
        """Finish queued work and stop the worker (idempotent); the store stays open."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None

    # ------------------------------------------------------------------ work

    def _submit(
        self,
        work: Callable[[_Pool, list[tuple[str, list[int]]], Group], tuple[T, Transfer[None]]],
        pool: _Pool,
        items: list[tuple[str, list[int]]],
        group: Group,
    ) -> Transfer[T]:
        _check_group(group, pool, items)  # before anything runs, in the caller's thread
        if self._worker is None:
            result, copy = work(pool, items, group)
            return Transfer(copy.done, lambda: _then(result, copy))
        future: Future[tuple[T, Transfer[None]]] = self._worker.submit(work, pool, items, group)

        def finish() -> T:
            result, copy = future.result()
            return _then(result, copy)

        return Transfer(lambda: future.done() and future.result()[1].done(), finish)

    def _save(
        self, pool: _Pool, items: list[tuple[str, list[int]]], src: Group
    ) -> tuple[list[bool], Transfer[None]]:
        n = len(items) * pool.units
        staged = _staging(pool.layout, n)
        units = [u for _, us in items for u in us]
        self._mover.copy(src, units, staged, range(n)).wait()
        objects = []
        for k, (page_hash, _) in enumerate(items):
            span = slice(k * pool.units, (k + 1) * pool.units)
            parts = {
                p: bitwise_view(t[:, span].contiguous()).numpy().data for p, t in staged.items()
            }
            objects.append((ObjectKey(page_hash, pool.name), parts))
        acked = self.store.put(objects)
        payload = sum(t[:, : pool.units].nbytes for t in staged.values())  # one object's
        self._counts["saved"] += sum(acked)
        self._counts["refused"] += len(acked) - sum(acked)
        self._counts["bytes_saved"] += payload * sum(acked)
        return acked, done(None)

    def _load(
        self, pool: _Pool, items: list[tuple[str, list[int]]], dst: Group
    ) -> tuple[list[bool], Transfer[None]]:
        got = self.store.get([ObjectKey(h, pool.name) for h, _ in items])
        fits = [g is not None and self._fits(g, pool) for g in got]
        hits = [k for k, ok in enumerate(fits) if ok]
        self._counts["missed"] += len(items) - len(hits)
        self._counts["loaded"] += len(hits)
        if not hits:
            return fits, done(None)
        staged = _staging(pool.layout, len(hits) * pool.units)
        for j, k in enumerate(hits):
            parts = got[k]
            assert parts is not None
            span = slice(j * pool.units, (j + 1) * pool.units)
            for part, t in staged.items():
                rows = bitwise_view(t)[:, span].numpy()
                rows[...] = np.frombuffer(parts[part], dtype=rows.dtype).reshape(rows.shape)
                self._counts["bytes_loaded"] += rows.nbytes
        units = [u for k in hits for u in items[k][1]]
        return fits, self._mover.copy(staged, range(len(units)), dst, units)

    def _fits(self, parts: dict[str, memoryview], pool: _Pool) -> bool:
        """Whether a verified object has exactly the parts and sizes of `pool`'s layout."""
        ok = set(parts) == set(pool.layout) and all(
            parts[p].nbytes == _object_bytes(dtype, shape, pool.units)
            for p, (dtype, shape) in pool.layout.items()
        )
        self._counts["malformed"] += not ok
        return ok

    def __repr__(self) -> str:
        return f"StoreIO(store={self.store!r}, background={self._worker is not None})"


def _then(result: T, copy: Transfer[None]) -> T:
    copy.wait()
    return result


def _object_bytes(dtype: torch.dtype, shape: tuple[int, ...], units: int) -> int:
    return int(np.prod(shape, dtype=np.int64)) * units * torch.empty((), dtype=dtype).element_size()


def _staging(layout: Layout, n: int) -> dict[str, torch.Tensor]:
    """CPU tensors [layers, n, ...] for `layout` (a CUDA copy stages through pinned memory
    of its own, `Mover`)."""
    return {
        part: torch.empty((shape[0], n, *shape[1:]), dtype=dtype)
        for part, (dtype, shape) in layout.items()
    }


def _items(items: object, name: str) -> list[tuple[str, list[int]]]:
    """[(page hash, units)] with valid hashes; TypeError / ValueError naming `name`."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise TypeError(f"{name} must be a sequence of (page hash, units) pairs")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, tuple) or len(item) != 2:
            raise TypeError(f"{name}[{i}] must be a (page hash, units) pair, got {item!r}")
        page_hash, units = item
        check_page_hash(page_hash, f"{name}[{i}][0]")
        ids = [units] if isinstance(units, int) else as_index_array(units, f"{name}[{i}][1]")
        out.append((page_hash, [int(u) for u in ids]))
    hashes = [h for h, _ in out]
    if len(set(hashes)) != len(hashes):
        raise ValueError(f"{name}: a page hash appears more than once")
    return out


def _check_group(group: Group, pool: _Pool, items: list[tuple[str, list[int]]]) -> None:
    layout = group_layout(group, "group")
    if layout != pool.layout:
        raise ValueError(f"group: layout {layout} is not this store's {pool.name} layout")
    limit = next(iter(group.values())).shape[1]
    units = [u for _, us in items for u in us]
    for i, (_, us) in enumerate(items):
        if len(us) != pool.units:
            raise ValueError(f"items[{i}]: {len(us)} units; a {pool.name} object has {pool.units}")
    bad = next((u for u in units if not 0 <= u < limit), None)
    if bad is not None:
        raise ValueError(f"items: unit {bad} is out of range [0, {limit})")
    if len(set(units)) != len(units):
        raise ValueError("items: a unit appears more than once")
