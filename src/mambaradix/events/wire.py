"""The wire formats of vLLM and SGLang KV events (msgpack via msgspec), both ways.

Encoding mirrors each engine's msgspec structs field for field (order, tags, defaults):

* vLLM (`vllm/distributed/kv_events.py`): `EventBatch(ts, events, data_parallel_rank)` is
  array-like; events are tagged *maps* (`{"type": "BlockStored", ...}`) with
  `omit_defaults`, carrying `group_idx` and `kv_cache_spec_kind` (hybrid groups: group 0
  "full_attention", group 1 "mamba"). Fields added to vLLM later (`locality`, ...) are
  left out; they default to None there and are omitted on the wire anyway.
* SGLang 0.5.15.post1 (`srt/disaggregation/kv_events.py`): everything array-like and
  tagged; one `BlockStored` per block, as SGLang sends one per page; KV only, so state
  events are dropped (as MambaRadixCache does: sglang #23678).

Departure: vLLM names blocks by its own seeded hash; we send our SHA-256 chain
(`hashing.py`) in both formats. Consumers recompute their own keys from `token_ids`.

Decoding (`decode_batch`) reads either engine's layout (maps or arrays, extra trailing
fields ignored) into `model` events and reports, rather than raises on, bad events.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from mambaradix.events.model import (
    KV_GROUP,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
)

FORMATS = ("vllm", "sglang")

# ----------------------------------------------------------------------- vLLM structs


class VllmEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class VllmKVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class VllmBlockStored(VllmKVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class VllmBlockRemoved(VllmKVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class VllmAllBlocksCleared(VllmKVCacheEvent, tag="AllBlocksCleared"):
    pass


# --------------------------------------------------------------------- SGLang structs


class SglangEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    attn_dp_rank: int | None = None


class SglangKVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class SglangBlockStored(SglangKVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None


class SglangBlockRemoved(SglangKVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


class SglangAllBlocksCleared(SglangKVCacheEvent, tag="AllBlocksCleared"):
    pass


# --------------------------------------------------------------------------- encoding

_encoder = msgspec.msgpack.Encoder()


def encode_batch(
    events: Sequence[Event], fmt: str = "vllm", ts: float | None = None, rank: int = 0
) -> bytes:
    """One msgpack `EventBatch` payload, as the engine `fmt` publishes it."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    check_rank(rank)
    if ts is not None and (
        isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts)
    ):
        raise ValueError(f"ts must be a finite number or None, got {ts!r}")
    when = time.time() if ts is None else ts
    if fmt == "vllm":
        return _encoder.encode(VllmEventBatch(when, [_vllm(e) for e in events], rank))
    out: list[Any] = []
    for e in events:
        out.extend(_sglang(e))
    return _encoder.encode(SglangEventBatch(when, out, rank))


def check_rank(rank: Any) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be an int >= 0, got {rank!r}")


def _vllm(e: Event) -> VllmKVCacheEvent:
    if isinstance(e, BlockStored):
        return VllmBlockStored(
            list(e.block_hashes),
            e.parent_block_hash,
            list(e.token_ids),
            e.block_size,
            None,
            e.medium,
            None,
            group_idx=e.group,
            kv_cache_spec_kind=e.kind,
        )
    if isinstance(e, BlockRemoved):
        return VllmBlockRemoved(list(e.block_hashes), e.medium, group_idx=e.group)
    if isinstance(e, AllBlocksCleared):
        return VllmAllBlocksCleared()
    raise TypeError(f"events must be BlockStored, BlockRemoved or AllBlocksCleared, got {e!r}")


def _sglang(e: Event) -> list[SglangKVCacheEvent]:
    if isinstance(e, AllBlocksCleared):
        return [SglangAllBlocksCleared()]
    if not isinstance(e, (BlockStored, BlockRemoved)):
        raise TypeError(f"events must be BlockStored, BlockRemoved or AllBlocksCleared, got {e!r}")
    if e.group not in (KV_GROUP, None):
        return []
    if isinstance(e, BlockRemoved):
        return [SglangBlockRemoved(list(e.block_hashes), e.medium)]
    size, parent = e.block_size, e.parent_block_hash
    out: list[SglangKVCacheEvent] = []
    for i, h in enumerate(e.block_hashes):
        tokens = list(e.token_ids[i * size : (i + 1) * size])
        out.append(SglangBlockStored([h], parent, tokens, size, None, e.medium))
        parent = h
    return out


# --------------------------------------------------------------------------- decoding

_decoder = msgspec.msgpack.Decoder()
_INT64 = 1 << 63
# Positions in an array-layout event (vLLM's order; SGLang's is a prefix of it).
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


class MalformedBatch(ValueError):
    """A payload that is not an event batch at all."""


class _BadEvent(ValueError):
    pass


@dataclass
class DecodedBatch:
    ts: float
    events: list[Event]
    rank: int | None
    problems: list[str] = field(default_factory=list)
    # An unreadable removal (or event of unknown shape) was skipped: events before
    # `trusted_from` may be contradicted by it, and a consumer must not trust them.
    unsafe: bool = False
    trusted_from: int = 0


class _VllmBatchIn(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[VllmBlockStored | VllmBlockRemoved | VllmAllBlocksCleared]
    data_parallel_rank: int | None = None


class _ArrayEvent(msgspec.Struct, array_like=True, gc=False, tag=True):
    """Array-layout events as read: SGLang's fields, then (older vLLM) its later ones."""


class _ArrayStored(_ArrayEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class _ArrayRemoved(_ArrayEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None
    group_idx: int | None = None


class _ArrayCleared(_ArrayEvent, tag="AllBlocksCleared"):
    pass


class _ArrayBatchIn(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_ArrayStored | _ArrayRemoved | _ArrayCleared]
    rank: int | None = None


_typed: list[msgspec.msgpack.Decoder[Any]] = [
    msgspec.msgpack.Decoder(_VllmBatchIn),
    msgspec.msgpack.Decoder(_ArrayBatchIn),
]


def decode_batch(payload: bytes) -> DecodedBatch:
    """Read a vLLM or SGLang batch. Raises MalformedBatch if it is no batch at all; a bad
    event is skipped and noted in `problems`; unless it was a store (whose loss only
    under-credits) it makes the batch `unsafe` up to `trusted_from`.

    Well-formed batches go through msgspec's typed decoders (C speed; the layout that
    worked last is tried first); anything else through a tolerant generic reading."""
    for i, decoder in enumerate(_typed):
        try:
            batch = decoder.decode(payload)
        except msgspec.ValidationError:
            continue
        except msgspec.DecodeError as e:
            raise MalformedBatch(f"not msgpack: {e}") from None
        if i:
            _typed.reverse()
        return _from_typed(batch)
    return _decode_generic(payload)


def _from_typed(batch: _VllmBatchIn | _ArrayBatchIn) -> DecodedBatch:
    rank = batch.data_parallel_rank if isinstance(batch, _VllmBatchIn) else batch.rank
    out = DecodedBatch(batch.ts, [], rank)
    for e in batch.events:
        if isinstance(e, (VllmBlockStored, _ArrayStored)):
            size, hashes = e.block_size, e.block_hashes
            if size < 1 or not hashes or len(e.token_ids) != len(hashes) * size:
                out.problems.append(f"BlockStored: {len(e.token_ids)} tokens, {size} per block")
            elif e.lora_id is not None or e.lora_name is not None:
                out.problems.append("BlockStored: LoRA blocks are not indexed")
            else:
                out.events.append(
                    BlockStored(
                        tuple(hashes),
                        e.parent_block_hash,
                        e.token_ids,
                        size,
                        e.group_idx,
                        e.kv_cache_spec_kind,
                        e.medium,
                    )
                )
        elif isinstance(e, (VllmBlockRemoved, _ArrayRemoved)):
            if not e.block_hashes:
                out.problems.append("BlockRemoved: no block_hashes")
                out.unsafe, out.trusted_from = True, len(out.events)
                continue
            out.events.append(BlockRemoved(tuple(e.block_hashes), e.group_idx, e.medium))
        else:
            out.events.append(AllBlocksCleared())
    return out


def _decode_generic(payload: bytes) -> DecodedBatch:
    try:
        raw = _decoder.decode(payload)
    except (msgspec.DecodeError, ValueError) as e:
        raise MalformedBatch(f"not msgpack: {e}") from None
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise MalformedBatch("not an event batch [ts, events, rank]")
    ts, rank = raw[0], raw[2] if len(raw) > 2 else None
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise MalformedBatch(f"batch timestamp is {type(ts).__name__}, not a number")
    out = DecodedBatch(float(ts), [], rank if isinstance(rank, int) else None)
    for item in raw[1]:
        tag, fields = _tag_and_fields(item)
        try:
            event = _event(tag, fields)
        except _BadEvent as e:
            out.problems.append(f"{tag or 'event'}: {e}")
            if tag != "BlockStored":
                out.unsafe, out.trusted_from = True, len(out.events)
            continue
        if event is not None:
            out.events.append(event)
        elif tag is not None:
            out.problems.append(f"unknown event type {tag!r} ignored")
    return out


def _tag_and_fields(item: Any) -> tuple[str | None, dict[str, Any]]:
    if isinstance(item, dict):
        tag = item.get("type")
        return (tag if isinstance(tag, str) else None), item
    if isinstance(item, list) and item and isinstance(item[0], str):
        names = {"BlockStored": _STORED_FIELDS, "BlockRemoved": _REMOVED_FIELDS}.get(item[0], ())
        return item[0], dict(zip(names, item[1:], strict=False))  # extra fields ignored
    return None, {}


def _event(tag: str | None, f: dict[str, Any]) -> Event | None:
    if tag == "BlockStored":
        hashes = _hashes(f.get("block_hashes"))
        size = f.get("block_size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise _BadEvent(f"block_size {size!r}")
        tokens = f.get("token_ids")
        if not isinstance(tokens, list) or len(tokens) != len(hashes) * size:
            raise _BadEvent(f"token_ids do not fill {len(hashes)} blocks of {size}")
        if f.get("lora_id") is not None or f.get("lora_name") is not None:
            raise _BadEvent("LoRA blocks are not indexed")
        parent = f.get("parent_block_hash")
        return BlockStored(
            hashes,
            None if parent is None else _hash(parent),
            tokens,
            size,
            _opt(f, "group_idx", int),
            _opt(f, "kv_cache_spec_kind", str),
            _opt(f, "medium", str),
        )
    if tag == "BlockRemoved":
        hashes = _hashes(f.get("block_hashes"))
        return BlockRemoved(hashes, _opt(f, "group_idx", int), _opt(f, "medium", str))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    if tag is None:
        raise _BadEvent("no event type")
    return None


def _hash(value: Any) -> int:
    """A block hash, signed or unsigned 64-bit, kept as sent: it only has to match the
    same producer's other events (the typed fast path keeps it as sent too)."""
    if isinstance(value, bool) or not isinstance(value, int) or not -_INT64 <= value < 2 * _INT64:
        raise _BadEvent(f"block hash {value!r} is not a 64-bit int")
    return value


def _hashes(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise _BadEvent("block_hashes must be a non-empty list")
    return tuple(_hash(v) for v in value)


def _opt(f: dict[str, Any], name: str, kind: type) -> Any:
    value = f.get(name)
    if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    raise _BadEvent(f"{name} is {type(value).__name__}, not {kind.__name__}")
