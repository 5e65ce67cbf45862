"""Store keys compatible with SGLang HiCache's v2 scheme (SGLang 0.5.23).

Three pieces make an object's name, each matching upstream (file:line in the 0.5.23 wheel):

* the page-hash chain: page ``i``'s key is ``sha256(key[i-1] || tokens of page i)`` as 64
  lowercase hex, tokens as little-endian uint32 (a page holding a token >= 2**32 is hashed as
  ``0xff`` + little-endian uint64), the last page hashed even when partial
  (``mem_cache/utils.py:116-122`` -> ``mem_cache/cpp_utils/hash_binding.cpp:62-81, 223-276``);
  a chain may start from a namespace seed (``mem_cache/utils.py:125-139``);
* a per-pool suffix: KV under the page hash itself, a pool's object under
  ``{page_hash}.{pool}`` (``hicache_storage.py:1035-1036``); a recurrent state is stored under
  the hash of the last KV page it covers (``unified_cache/components/mamba.py:738-746, 918-927``);
* a model/rank tag ``_{model}_{tp_rank}_{tp_size}``, ``/`` in the model name written as ``-``
  (``hicache_storage.py:748, 757, 822-831``). Ours adds an optional layout tag ``_{layout}``
  (dtype and shapes of the parts), which upstream's file backend lacks (its TODO at
  ``hicache_storage.py:762-763``); with no layout tag the names equal ``HiCacheFile``'s.

Pure standard library: the tree may import this module.
"""

from __future__ import annotations

import hashlib
import re
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

KV = "kv"
MAMBA = "mamba"

_U32_MAX = 0xFFFF_FFFF
_I64_MAX = 2**63 - 1
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_POOL = re.compile(r"[a-z][a-z0-9_]{0,31}\Z")
_MODEL = re.compile(r"[A-Za-z0-9._+-]{1,128}\Z")
_LAYOUT = re.compile(r"[a-z][a-z0-9.-]{0,63}\Z")


# --------------------------------------------------------------------------- hash chain


def page_hashes(tokens: Sequence[int], page_size: int, prior: str | None = None) -> list[str]:
    """The page-hash chain of `tokens`: one 64-hex key per page (the last may be partial).

    `prior` is the key of the page before `tokens[0]` (None at the start of a sequence, or a
    namespace seed from `chain_seed`). Equal to SGLang 0.5.23's
    ``get_hash_str(tokens, prior, page_size)``.
    """
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be a positive int, got {page_size!r}")
    check_page_hash(prior, "prior", optional=True)
    ids = _token_list(tokens)
    digest = bytes.fromhex(prior) if prior else b""
    out = []
    for start in range(0, len(ids), page_size):
        digest = _hash_page(ids[start : start + page_size], digest)
        out.append(digest.hex())
    return out


def chain_seed(extra_key: str | None, cache_salt: str | None) -> str | None:
    """The prior key that starts a namespaced chain (None when both parts are None)."""
    if extra_key is None and cache_salt is None:
        return None
    digest = hashlib.sha256(b"sglang-cache-namespace-v1")
    for name, part in (("extra_key", extra_key), ("cache_salt", cache_salt)):
        if part is None:
            digest.update(b"\x00")
            continue
        if not isinstance(part, str):
            raise TypeError(f"{name} must be a str or None, got {type(part).__name__}")
        encoded = part.encode("utf-8")
        digest.update(b"\x01" + len(encoded).to_bytes(8, "little") + encoded)
    return digest.hexdigest()


def _token_list(tokens: Sequence[int]) -> list[int]:
    if hasattr(tokens, "tolist") and not isinstance(tokens, array):
        tokens = tokens.tolist()  # numpy: one C call
    if isinstance(tokens, (str, bytes, bytearray)) or not isinstance(tokens, (Sequence, array)):
        raise TypeError(f"tokens must be a sequence of ints, got {type(tokens).__name__}")
    ids = list(tokens)
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise TypeError("tokens must be a sequence of ints")
    if ids and (min(ids) < 0 or max(ids) > _I64_MAX):
        raise ValueError("tokens must be non-negative int64 token ids")
    return ids


def _hash_page(page: list[int], prior: bytes) -> bytes:
    h = hashlib.sha256(prior)
    if max(page) > _U32_MAX:  # upstream's "wide" page: a tag byte, then uint64 words
        h.update(b"\xff")
        h.update(_little_endian("Q", page))
    else:
        h.update(_little_endian("I", page))
    return h.digest()


def _little_endian(typecode: str, page: list[int]) -> bytes:
    words = array(typecode, page)
    if sys.byteorder == "big":
        words.byteswap()
    return words.tobytes()


def check_page_hash(value: object, name: str, *, optional: bool = False) -> None:
    """ValueError naming `name` unless `value` is a 64-char lowercase hex page key."""
    if value is None and optional:
        return
    if not isinstance(value, str) or not _HEX64.match(value):
        raise ValueError(f"{name} must be a 64-char lowercase hex page hash, got {value!r}")


# --------------------------------------------------------------------------- object names


class ObjectKey(NamedTuple):
    """One stored object: the page it ends at and the pool it belongs to."""

    page_hash: str
    pool: str


def check_key(key: object, name: str = "key") -> ObjectKey:
    """The key as an ObjectKey, or ValueError/TypeError naming `name`."""
    if not isinstance(key, tuple) or len(key) != 2:
        raise TypeError(f"{name} must be an ObjectKey(page_hash, pool), got {key!r}")
    page_hash, pool = key
    check_page_hash(page_hash, f"{name}.page_hash")
    check_pool(pool, f"{name}.pool")
    return ObjectKey(page_hash, pool)


def check_pool(pool: object, name: str) -> None:
    """ValueError naming `name` unless `pool` is a pool name such as "kv" or "mamba"."""
    if not isinstance(pool, str) or not _POOL.match(pool):
        raise ValueError(f"{name} must match [a-z][a-z0-9_]{{0,31}}, got {pool!r}")


@dataclass(frozen=True)
class Namespace:
    """Who may read an object: the model, the rank's shard, and the byte layout.

    `layout` is empty (names equal SGLang's ``HiCacheFile``) or a tag such as `layout_tag`
    returns; it must start with a letter so it never reads as a rank number.
    """

    model: str
    tp_rank: int = 0
    tp_size: int = 1
    layout: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not _MODEL.match(self.model.replace("/", "-")):
            raise ValueError(
                f"model must be 1-128 chars of [A-Za-z0-9._+-/] (an empty id would merge"
                f" models into one keyspace), got {self.model!r}"
            )
        for field, value in (("tp_size", self.tp_size), ("tp_rank", self.tp_rank)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{field} must be an int, got {type(value).__name__}")
        if self.tp_size < 1 or not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(
                f"tp_rank must be in [0, tp_size) and tp_size >= 1, got {self.tp_rank}, "
                f"{self.tp_size}"
            )
        if not isinstance(self.layout, str) or (self.layout and not _LAYOUT.match(self.layout)):
            raise ValueError(f"layout must be empty or match [a-z][a-z0-9.-]*, got {self.layout!r}")

    @property
    def suffix(self) -> str:
        """``_{model}_{tp_rank}_{tp_size}[_{layout}]`` (hicache_storage.py:757)."""
        tail = f"_{self.layout}" if self.layout else ""
        return f"_{self.model.replace('/', '-')}_{self.tp_rank}_{self.tp_size}{tail}"

    def object_name(self, key: ObjectKey) -> str:
        """The object's name in the store, without the file extension."""
        base = key.page_hash if key.pool == KV else f"{key.page_hash}.{key.pool}"
        return base + self.suffix


def layout_tag(parts: Mapping[str, tuple[str, tuple[int, ...]]]) -> str:
    """A short tag naming the parts' dtypes and shapes, e.g. for a state's conv/ssm tensors:
    ``layout_tag({"conv": ("bfloat16", (4, 8192)), "ssm": ("float32", (64, 128, 16))})``.
    Objects written with another layout get other names, so they miss instead of decoding
    into the wrong shapes."""
    spec = sorted((name, str(dtype), tuple(int(d) for d in shape)) for name, (dtype, shape) in
                  parts.items())
    return "l" + hashlib.sha256(repr(spec).encode()).hexdigest()[:12]
