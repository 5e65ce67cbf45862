"""The wire formats of vLLM and SGLang KV events (msgpack via msgspec), per release, both ways.

Encoding (`encode_batch(events, release)`) lays each event out as that release's own
msgspec structs do, byte for byte (`releases.py` holds the schemas; tests compare with
the structs loaded from each wheel): `EventBatch` is `[ts, events, rank]`; events are
tagged maps (vLLM, SGLang >= 0.5.20) or tagged arrays (SGLang <= 0.5.19), fields in the
release's order, None fields left out where the release omits defaults. SGLang cannot say
"a state", so state events are not sent in its dialects (as its caches do: sglang #23678);
SGLang <= 0.5.17 sends one `BlockStored` per block, later releases coalesce consecutive
stores of one chain and consecutive removals (`mem_cache/events.py` `enqueue`).

Departure: vLLM names blocks by its own seeded hash; we send our SHA-256 chain
(`hashing.py`) in every dialect. Consumers recompute their own keys from `token_ids`.

Decoding (`decode_batch`) reads every listed release (maps or arrays, fields it does not
know ignored) into `model` events, and reports, rather than raises on, bad events:
* a state group's store may name fewer blocks than its tokens span (vLLM align mode);
* vLLM's bytes hashes become ints as vLLM's own int mode makes them (low 64 bits);
* a LoRA or salted block is decoded with its `namespace`, for the consumer to skip;
* a store of block_size 0 and no tokens is vLLM's offload placeholder (hashes alone).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgspec

from mambaradix.events import releases
from mambaradix.events.model import (
    FULL_PREFIX_KINDS,
    KV_GROUP,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
)
from mambaradix.events.releases import MEDIA_IN, Release, Schema

# --------------------------------------------------------------------------- encoding

_encoder = msgspec.msgpack.Encoder()
_CLEARED = Schema((), 0)


def encode_batch(
    events: Sequence[Event],
    release: str | Release = "vllm",
    ts: float | None = None,
    rank: int = 0,
) -> bytes:
    """One msgpack `EventBatch` payload, as `release` (a name, see `releases.py`)
    publishes it."""
    r = releases.release(release)
    check_rank(rank)
    if ts is not None and (
        isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts)
    ):
        raise ValueError(f"ts must be a finite number or None, got {ts!r}")
    when = time.time() if ts is None else float(ts)
    return _encoder.encode([when, encode_events(events, r), rank])


def check_rank(rank: Any) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be an int >= 0, got {rank!r}")


def encode_events(events: Iterable[Event], r: Release) -> list[Any]:
    """The events as `r` lays them out (maps or arrays), in order."""
    chosen = [e for e in events if _sent(e, r)]
    if r.engine == "sglang":
        chosen = _per_block(chosen) if r.per_page else _coalesce(chosen)
    return [_pack(e, r) for e in chosen]


def _sent(e: Event, r: Release) -> bool:
    """Whether `r` can say `e` at all (SGLang: no state events)."""
    if isinstance(e, AllBlocksCleared):
        return True
    if not isinstance(e, (BlockStored, BlockRemoved)):
        raise TypeError(f"events must be BlockStored, BlockRemoved or AllBlocksCleared, got {e!r}")
    if isinstance(e, BlockStored) and (
        e.namespace is not None
        or (e.lookahead is not None and "lookahead_token_ids" not in r.stored.fields)
    ):
        raise ValueError(f"{r.name} cannot encode {e!r}: its hashes depend on more than tokens")
    if r.states:
        return True
    kind = e.kind if isinstance(e, BlockStored) else None
    return e.group in (KV_GROUP, None) and (kind is None or kind in FULL_PREFIX_KINDS)


def _per_block(events: list[Event]) -> list[Event]:
    """Every store split into one per block (SGLang <= 0.5.17: one event per page)."""
    out: list[Event] = []
    for e in events:
        if not isinstance(e, BlockStored) or len(e.block_hashes) == 1:
            out.append(e)
            continue
        size, parent = e.block_size, e.parent_block_hash
        for i, h in enumerate(e.block_hashes):
            tokens = e.token_ids[i * size : (i + 1) * size]
            out.append(BlockStored((h,), parent, tokens, size, e.group, e.kind, e.medium))
            parent = h
    return out


def _coalesce(events: list[Event]) -> list[Event]:
    """Consecutive stores of one chain (same medium and size) become one, and so do
    consecutive removals of one medium, as SGLang >= 0.5.18 queues them."""
    out: list[Event] = []
    for e in events:
        tail = out[-1] if out else None
        if (
            isinstance(e, BlockStored)
            and isinstance(tail, BlockStored)
            and (tail.medium, tail.block_size) == (e.medium, e.block_size)
            and e.parent_block_hash == tail.block_hashes[-1]
        ):
            hashes, tokens = (*tail.block_hashes, *e.block_hashes), (*tail.token_ids, *e.token_ids)
            parent = tail.parent_block_hash
            out[-1] = BlockStored(
                hashes, parent, tokens, e.block_size, tail.group, tail.kind, e.medium
            )
        elif (
            isinstance(e, BlockRemoved)
            and isinstance(tail, BlockRemoved)
            and (tail.medium == e.medium)
        ):
            out[-1] = BlockRemoved((*tail.block_hashes, *e.block_hashes), tail.group, e.medium)
        else:
            out.append(e)
    return out


def _pack(e: Event, r: Release) -> msgspec.Struct:
    if isinstance(e, BlockStored):
        values = {
            "block_hashes": list(e.block_hashes),
            "parent_block_hash": e.parent_block_hash,
            "token_ids": list(e.token_ids),
            "block_size": e.block_size,
            "medium": r.medium_name(e.medium),
            "group_idx": e.group,
            "kv_cache_spec_kind": e.kind,
            "lookahead_token_ids": None if e.lookahead is None else [list(x) for x in e.lookahead],
        }
        return _layout("BlockStored", r.stored, values, r)
    if isinstance(e, BlockRemoved):
        values = {
            "block_hashes": list(e.block_hashes),
            "medium": r.medium_name(e.medium),
            "group_idx": e.group,
        }
        return _layout("BlockRemoved", r.removed, values, r)
    return _layout("AllBlocksCleared", _CLEARED, {}, r)


def _layout(tag: str, schema: Schema, values: dict[str, Any], r: Release) -> msgspec.Struct:
    """`values` as the release's struct `tag`: msgspec then writes what the release's own
    struct writes (map or array, defaults left out or not, the same headers)."""
    cls = _struct(r, tag, schema)
    return cls(*[values.get(name) for name in schema.fields])


_structs: dict[tuple[str, str], type[msgspec.Struct]] = {}


def _struct(r: Release, tag: str, schema: Schema) -> type[msgspec.Struct]:
    """A msgspec struct with the release's fields, flags and tag (made once)."""
    cls = _structs.get((r.name, tag))
    if cls is None:
        fields = [
            (name, Any) if i < schema.required else (name, Any, None)
            for i, name in enumerate(schema.fields)
        ]
        cls = msgspec.defstruct(
            tag,
            fields,
            tag=tag,
            array_like=not r.event_maps,
            omit_defaults=r.omit_defaults,
            gc=False,
        )
        _structs[(r.name, tag)] = cls
    return cls


# --------------------------------------------------------------------------- decoding

_decoder = msgspec.msgpack.Decoder()
_MEDIA_IN = dict(MEDIA_IN)  # a dict: faster to read than the read-only view
_INT64 = 1 << 63
_MASK64 = (1 << 64) - 1
MAPS, ARRAYS = "maps", "arrays"


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
    layout: str | None = None  # MAPS or ARRAYS (None: no events, or both)


class _MapEvent(msgspec.Struct, tag=True, gc=False):
    """Map-layout events as read: every field any release sends (others ignored)."""


class _MapStored(_MapEvent, tag="BlockStored"):
    block_hashes: list[int]
    token_ids: list[int]
    block_size: int
    parent_block_hash: int | None = None
    lora_id: int | None = None
    lora_name: str | None = None
    medium: str | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    cache_salt: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class _MapRemoved(_MapEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None
    group_idx: int | None = None


class _MapCleared(_MapEvent, tag="AllBlocksCleared"):
    pass


class _MapBatchIn(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_MapStored | _MapRemoved | _MapCleared]
    rank: int | None = None


class _ArrayEvent(msgspec.Struct, array_like=True, gc=False, tag=True):
    """Array-layout events as read: SGLang's fields, then SGLang 0.5.18-0.5.19's
    `metadata` (a map) or an older vLLM's `lora_name` and later fields."""


class _ArrayStored(_ArrayEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    lora_name: str | dict[str, Any] | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    # not fields: no array release sends them (read alike with _MapStored's)
    cache_salt: ClassVar[None] = None
    lookahead_token_ids: ClassVar[None] = None


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


_TYPED: dict[str, msgspec.msgpack.Decoder[Any]] = {
    MAPS: msgspec.msgpack.Decoder(_MapBatchIn),
    ARRAYS: msgspec.msgpack.Decoder(_ArrayBatchIn),
}
_order = [MAPS, ARRAYS]  # without an expected release: the layout that worked last first


def decode_batch(payload: bytes, expect: Release | None = None) -> DecodedBatch:
    """Read a batch of any listed release (`expect`: the release likely sending it).
    Raises MalformedBatch if it is no batch at all; a bad event is skipped and noted in
    `problems`; unless it was a store (whose loss only under-credits) it makes the batch
    `unsafe` up to `trusted_from`.

    Well-formed batches with int hashes go through msgspec's typed decoders (C speed);
    anything else (bytes hashes too) through a tolerant generic reading."""
    order = _order if expect is None else [MAPS, ARRAYS] if expect.event_maps else [ARRAYS, MAPS]
    for layout in order:
        try:
            batch = _TYPED[layout].decode(payload)
        except msgspec.ValidationError:
            continue
        except msgspec.DecodeError as e:
            raise MalformedBatch(f"not msgpack: {e}") from None
        if expect is None and layout != _order[0]:
            _order.reverse()
        return _from_typed(batch, layout)
    return _decode_generic(payload)


def _from_typed(batch: _MapBatchIn | _ArrayBatchIn, layout: str) -> DecodedBatch:
    out = DecodedBatch(batch.ts, [], batch.rank, layout=layout if batch.events else None)
    append = out.events.append
    for e in batch.events:
        try:
            if isinstance(e, (_MapStored, _ArrayStored)):
                append(_typed_stored(e))
            elif isinstance(e, (_MapRemoved, _ArrayRemoved)):
                append(_removed(tuple(e.block_hashes), e.group_idx, e.medium))
            else:
                append(AllBlocksCleared())
        except _BadEvent as bad:
            stored = isinstance(e, (_MapStored, _ArrayStored))
            _note(out, "BlockStored" if stored else "BlockRemoved", bad)
    return out


def _typed_stored(e: _MapStored | _ArrayStored) -> BlockStored:
    """A store from a typed struct (the hot path: a KV store with nothing unusual
    passes two comparisons and builds the event)."""
    hashes, tokens, size, kind = e.block_hashes, e.token_ids, e.block_size, e.kv_cache_spec_kind
    if not (hashes and size > 0 and len(tokens) == len(hashes) * size):
        _check_blocks(len(hashes), len(tokens), size, kind)
    namespace = None
    if e.lora_id is not None or e.lora_name is not None or e.cache_salt is not None:
        name = e.lora_name if isinstance(e.lora_name, str) else None
        namespace = _namespace(e.lora_id, name, e.cache_salt or _metadata_salt(e.lora_name))
    lookahead = e.lookahead_token_ids
    return BlockStored(
        tuple(hashes),
        e.parent_block_hash,
        tokens,
        size,
        e.group_idx,
        kind,
        _MEDIA_IN.get(e.medium, e.medium),  # type: ignore[arg-type]  # None stays None
        namespace,
        None if lookahead is None else _lookahead(lookahead, len(hashes)),
    )


def _check_blocks(n: int, tokens: int, size: int, kind: str | None) -> None:
    """Raises _BadEvent unless `n` hashes fit `tokens` token ids in blocks of `size`:
    whole blocks, one hash each (a state group may name fewer), or a placeholder (size
    0, no tokens, some hashes: vLLM's offload connector names blocks by hash alone)."""
    if size == 0 and not tokens and n:
        return
    if size < 1 or tokens % size:
        raise _BadEvent(f"{tokens} token_ids are not whole blocks of {size}")
    blocks = tokens // size
    if n > blocks or (n < blocks and (kind is None or kind in FULL_PREFIX_KINDS)):
        raise _BadEvent(f"{n} block_hashes for {blocks} blocks of {kind or 'KV'}")


def _lookahead(value: list[list[int]], n: int) -> tuple[tuple[int, ...], ...]:
    if len(value) != n:
        raise _BadEvent(f"{len(value)} lookahead_token_ids for {n} block_hashes")
    return tuple(tuple(x) for x in value)


def _note(out: DecodedBatch, tag: str | None, bad: _BadEvent) -> None:
    out.problems.append(f"{tag or 'event'}: {bad}")
    if tag != "BlockStored":
        out.unsafe, out.trusted_from = True, len(out.events)


def _removed(hashes: tuple[int, ...], group: int | None, medium: str | None) -> BlockRemoved:
    if not hashes:
        raise _BadEvent("no block_hashes")
    return BlockRemoved(hashes, group, _MEDIA_IN.get(medium, medium))  # type: ignore[arg-type]


def _namespace(lora_id: int | None, lora_name: str | None, salt: str | None) -> str | None:
    if lora_id is not None or lora_name is not None:
        return "lora"
    return None if salt is None else "cache_salt"


def _metadata_salt(value: Any) -> str | None:
    """SGLang 0.5.18-0.5.19's `metadata` ({"cache_salt": ...}) in an array event."""
    if isinstance(value, dict):
        salt = value.get("cache_salt")
        return salt if isinstance(salt, str) else "?"
    return None


def _hash(value: Any) -> int:
    """A block hash, signed or unsigned 64-bit, kept as sent: it only has to match the
    same producer's other events. Bytes (vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)
    become the int vLLM's int mode sends: their low 64 bits, big-endian."""
    if isinstance(value, bytes):
        return int.from_bytes(value, "big") & _MASK64
    if isinstance(value, bool) or not isinstance(value, int) or not -_INT64 <= value < 2 * _INT64:
        raise _BadEvent(f"block hash {value!r} is not a 64-bit int")
    return value


# ------------------------------------------------------------------ generic reading

# Positions in an array-layout event: vLLM's order (SGLang's is its first five fields).
_STORED_FIELDS = releases.VLLM_STORED
_REMOVED_FIELDS = releases.VLLM_REMOVED


def _decode_generic(payload: bytes) -> DecodedBatch:
    try:
        raw = _decoder.decode(payload)
    except (msgspec.DecodeError, ValueError, RecursionError) as e:
        raise MalformedBatch(f"not msgpack: {e}") from None
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise MalformedBatch("not an event batch [ts, events, rank]")
    ts, rank = raw[0], raw[2] if len(raw) > 2 else None
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise MalformedBatch(f"batch timestamp is {type(ts).__name__}, not a number")
    out = DecodedBatch(float(ts), [], rank if isinstance(rank, int) else None)
    kinds = {type(item) for item in raw[1]}
    out.layout = MAPS if kinds == {dict} else ARRAYS if kinds == {list} else None
    for item in raw[1]:
        tag, fields = _tag_and_fields(item)
        try:
            event = _event(tag, fields)
        except _BadEvent as e:
            _note(out, tag, e)
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
        return _generic_stored(f)
    if tag == "BlockRemoved":
        hashes = _hashes(f.get("block_hashes"), empty_ok=False)
        return _removed(hashes, _opt(f, "group_idx", int), _opt(f, "medium", str))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    if tag is None:
        raise _BadEvent("no event type")
    return None


def _generic_stored(f: dict[str, Any]) -> BlockStored:
    """A store from plain msgpack values: every type checked here."""
    size, kind = _opt(f, "block_size", int), _opt(f, "kv_cache_spec_kind", str)
    tokens, hashes = f.get("token_ids"), _hashes(f.get("block_hashes"), empty_ok=True)
    if size is None or not isinstance(tokens, list):
        raise _BadEvent(f"block_size {size!r} and token_ids {type(tokens).__name__}")
    _check_blocks(len(hashes), len(tokens), size, kind)
    lora_name = f.get("lora_name")  # or, at this place in an array, SGLang's metadata
    if lora_name is not None and not isinstance(lora_name, (str, dict)):
        raise _BadEvent(f"lora_name is {type(lora_name).__name__}, not str")
    salt = _opt(f, "cache_salt", str) or _metadata_salt(lora_name)
    name = lora_name if isinstance(lora_name, str) else None
    lookahead = f.get("lookahead_token_ids")
    if lookahead is not None and not (
        isinstance(lookahead, list) and all(isinstance(x, list) for x in lookahead)
    ):
        raise _BadEvent("lookahead_token_ids must be lists of token ids")
    parent = f.get("parent_block_hash")
    medium = _opt(f, "medium", str)
    return BlockStored(
        hashes,
        None if parent is None else _hash(parent),
        tokens,
        size,
        _opt(f, "group_idx", int),
        kind,
        _MEDIA_IN.get(medium, medium),  # None stays None
        _namespace(_opt(f, "lora_id", int), name, salt),
        None if lookahead is None else _lookahead(lookahead, len(hashes)),
    )


def _hashes(value: Any, empty_ok: bool) -> tuple[int, ...]:
    if not isinstance(value, list) or not (value or empty_ok):
        raise _BadEvent("block_hashes must be a non-empty list")
    return tuple(_hash(h) for h in value)


def _opt(f: dict[str, Any], name: str, kind: type) -> Any:
    value = f.get(name)
    if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    raise _BadEvent(f"{name} is {type(value).__name__}, not {kind.__name__}")
