"""L3 stores for states and KV pages, keyed as SGLang HiCache v2 keys them.

* `keys`: the page-hash chain, `ObjectKey` (page hash, pool) and `Namespace` (model, rank,
  layout) that name an object; pure standard library.
* `prefix`: hit policies and the longest usable prefix of a chain; pure standard library.
* `bundle`: an object's bytes: named parts, framed and checksummed.
* `store`: the `Store` protocol, its counters and errors, and `BlobStore`, the base of the
  backends: `FileStore` (default, durable), `RedisStore`, `MooncakeStore` (optional extras,
  imported from their modules); `open_store` opens one from a string (``file:PATH``,
  ``redis://HOST:PORT/DB``, ``mooncake://...``).

* `cost`: load or recompute: the load time of a hit per tier vs its prefill time, and the
  break-even length (pure standard library; imported from its module).

Tensors to and from a store: `mambaradix.pools.store_io` (docs/tiers-data-path.md).
docs/tiers-stores.md describes the guarantees and how they are tested.
"""

from mambaradix.tiers.bundle import CorruptObject
from mambaradix.tiers.file_store import FileStore
from mambaradix.tiers.keys import (
    KV,
    MAMBA,
    Namespace,
    ObjectKey,
    chain_seed,
    layout_tag,
    page_hashes,
)
from mambaradix.tiers.open import open_store
from mambaradix.tiers.prefix import HYBRID_RULES, HitPolicy, PoolRule, PrefixHit, usable_prefix
from mambaradix.tiers.store import (
    BlobStore,
    Bundle,
    Store,
    StoreError,
    StoreStats,
    StoreUnavailable,
)

__all__ = [
    "KV", "MAMBA", "HYBRID_RULES", "BlobStore", "Bundle", "CorruptObject", "FileStore",
    "HitPolicy", "Namespace", "ObjectKey", "PoolRule", "PrefixHit", "Store", "StoreError",
    "StoreStats", "StoreUnavailable", "chain_seed", "layout_tag", "page_hashes",
    "open_store", "usable_prefix",
]
