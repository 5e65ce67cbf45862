"""Chained block hashes, as SGLang computes its page hashes.

digest_k = SHA-256(digest_{k-1} || tokens of block k as little-endian uint32), with no
prefix for the first block; the event carries the digest's first 8 bytes read big-endian
as a signed int64 (SGLang 0.5.15.post1 `hash_str_to_int64`). Dynamo's indexer recomputes
its own hash from `token_ids`, so it only uses these to name blocks for removal.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence

_SWAP = sys.byteorder != "little"


def block_digest(prev: bytes | None, tokens: Sequence[int]) -> bytes:
    """The 32-byte digest of one block. Raises OverflowError for a token outside uint32."""
    data = array("I", tokens)
    if _SWAP:
        data.byteswap()
    h = hashlib.sha256(prev) if prev is not None else hashlib.sha256()
    h.update(data.tobytes())
    return h.digest()


def digest_to_int64(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "big", signed=True)


def chain_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """The int64 hashes of every full block of `tokens` (a reference for tests and tools)."""
    out, prev = [], None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        prev = block_digest(prev, tokens[start : start + block_size])
        out.append(digest_to_int64(prev))
    return out
