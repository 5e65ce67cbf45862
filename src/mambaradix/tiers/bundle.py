"""The bytes of one stored object: a bundle of named parts, framed and checksummed.

A recurrent state is several tensors (conv and SSM state per layer group); KV is one or two.
All parts of an object travel in one blob, so a backend that writes one blob atomically makes
the bundle atomic: a reader gets every part or none (LMCache #4634: restoring a subset of a
state's groups is not a valid hit).

Layout (little-endian)::

    offset 0   magic "MRXB" | version u8 | 3 zero bytes | header_len u32 | payload_len u64
    offset 20  header: JSON {"name": object name, "parts": [[part name, nbytes], ...]}
               payload: the parts' bytes, back to back, in header order
    end - 8    xxh3-64 of everything before it

`decode` checks the length, magic, version, the name the blob was written under (a blob
copied or renamed to another key, another model or another layout does not decode) and the
checksum, and raises `CorruptObject` on any mismatch: a reader never gets wrong bytes.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping

import xxhash

MAGIC = b"MRXB"
VERSION = 1
_FIXED = struct.Struct("<4sB3xIQ")
FIXED_BYTES = _FIXED.size  # 20
DIGEST_BYTES = 8
_PART = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")

BytesLike = bytes | bytearray | memoryview


class CorruptObject(ValueError):
    """A stored blob that is truncated, altered or written under another name."""


def as_parts(parts: object, name: str) -> dict[str, memoryview]:
    """Validate a bundle: a non-empty mapping of part name -> C-contiguous bytes-like object.

    Returns byte views of the parts (no copy). Raises TypeError/ValueError naming `name`.
    """
    if not isinstance(parts, Mapping) or not parts:
        raise TypeError(f"{name} must be a non-empty mapping of part name -> bytes-like")
    views = {}
    for part, value in parts.items():
        if not isinstance(part, str) or not _PART.match(part):
            raise ValueError(f"{name}: part name must match [A-Za-z0-9_.-]{{1,64}}, got {part!r}")
        try:
            view = memoryview(value)
        except TypeError:
            raise TypeError(
                f"{name}[{part!r}] must support the buffer protocol, got {type(value).__name__}"
            ) from None
        if not view.c_contiguous:
            raise ValueError(f"{name}[{part!r}] must be C-contiguous")
        views[part] = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    return views


def encode(name: str, parts: Mapping[str, memoryview]) -> tuple[list[BytesLike], int]:
    """The blob for `parts` stored under `name`, as chunks to write in order, and its size.

    The parts are not copied: the chunks are the caller's views between a header and the
    digest, so a backend can write them with one gathered write (or concatenate them).
    """
    header = json.dumps(
        {"name": name, "parts": [[p, v.nbytes] for p, v in parts.items()]},
        separators=(",", ":"),
    ).encode()
    payload = sum(v.nbytes for v in parts.values())
    fixed = _FIXED.pack(MAGIC, VERSION, len(header), payload)
    digest = xxhash.xxh3_64(fixed)
    digest.update(header)
    for view in parts.values():
        digest.update(view)
    chunks: list[BytesLike] = [fixed + header, *parts.values(), digest.digest()]
    return chunks, FIXED_BYTES + len(header) + payload + DIGEST_BYTES


def body_hasher() -> xxhash.xxh3_64:
    """The running checksum a reader feeds all but a blob's last `DIGEST_BYTES` bytes."""
    return xxhash.xxh3_64()


def decode(blob: memoryview, name: str, digest: bytes | None = None) -> dict[str, memoryview]:
    """The parts of `blob` (read-only views into it), or CorruptObject saying what is wrong.

    `digest`: the xxh3-64 of `blob` without its last 8 bytes, when the reader already
    computed it chunk by chunk (see `body_digest`); else it is computed here.
    """
    if blob.nbytes < FIXED_BYTES + DIGEST_BYTES:
        raise CorruptObject(f"{name}: {blob.nbytes} bytes, shorter than a frame")
    magic, version, header_len, payload_len = _FIXED.unpack_from(blob)
    if magic != MAGIC or version != VERSION:
        raise CorruptObject(f"{name}: bad magic/version {bytes(magic)!r}/{version}")
    body = FIXED_BYTES + header_len + payload_len
    if blob.nbytes != body + DIGEST_BYTES:
        raise CorruptObject(f"{name}: {blob.nbytes} bytes, frame says {body + DIGEST_BYTES}")
    if (digest or xxhash.xxh3_64_digest(blob[:body])) != bytes(blob[body:]):
        raise CorruptObject(f"{name}: checksum mismatch")
    header = json.loads(bytes(blob[FIXED_BYTES : FIXED_BYTES + header_len]))
    if header["name"] != name:
        raise CorruptObject(f"{name}: blob was written as {header['name']!r}")
    if sum(nbytes for _, nbytes in header["parts"]) != payload_len:
        raise CorruptObject(f"{name}: part sizes do not add up to the payload")
    parts, offset = {}, FIXED_BYTES + header_len
    for part, nbytes in header["parts"]:
        parts[part] = blob[offset : offset + nbytes].toreadonly()
        offset += nbytes
    return parts
