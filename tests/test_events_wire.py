"""Wire formats: our payloads as vLLM and SGLang lay theirs out, and decoding both.

vLLM: the expected msgpack structure is written out by hand from vLLM's
`vllm/distributed/kv_events.py` (EventBatch array-like; events tagged maps with
`omit_defaults`; field order block_hashes, parent_block_hash, token_ids, block_size,
lora_id, medium, lora_name, [extra_keys], group_idx, kv_cache_spec_kind, ...).
SGLang: SGLang 0.5.15.post1's own structs (from its wheel) decode our payloads and
encode batches that we decode. Every other release: tests/test_events_releases.py."""

from __future__ import annotations

import msgspec
import pytest

from mambaradix.events import AllBlocksCleared, BlockRemoved, BlockStored
from mambaradix.events.model import DEVICE, HOST
from mambaradix.events.wire import MalformedBatch, decode_batch, encode_batch
from upstream_kv_events import sglang_kv_events

EVENTS = [
    BlockStored((11, 12), None, tuple(range(8)), 4),
    BlockStored((12,), 11, (4, 5, 6, 7), 4, 1, "mamba"),
    BlockRemoved((12,), 1),
    BlockRemoved((12, 11)),
    AllBlocksCleared(),
]


def test_vllm_layout_field_for_field() -> None:
    raw = msgspec.msgpack.decode(encode_batch(EVENTS, "vllm", ts=2.5, rank=3))
    stored = {
        "type": "BlockStored",
        "block_hashes": [11, 12],
        "parent_block_hash": None,
        "token_ids": list(range(8)),
        "block_size": 4,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }
    state = dict(stored, block_hashes=[12], parent_block_hash=11, token_ids=[4, 5, 6, 7])
    state.update(group_idx=1, kv_cache_spec_kind="mamba")
    assert raw == [
        2.5,
        [
            stored,
            state,
            {"type": "BlockRemoved", "block_hashes": [12], "medium": "GPU", "group_idx": 1},
            {"type": "BlockRemoved", "block_hashes": [12, 11], "medium": "GPU", "group_idx": 0},
            {"type": "AllBlocksCleared"},
        ],
        3,
    ]
    assert list(raw[1][0]) == list(stored)  # key order: the tag, then vLLM's field order


def test_sglang_structs_decode_our_payload() -> None:
    up = sglang_kv_events()
    payload = encode_batch(EVENTS, "sglang-0.5.15.post1", ts=2.5)
    batch = msgspec.msgpack.Decoder(up.KVEventBatch).decode(payload)
    assert batch.ts == 2.5 and batch.attn_dp_rank == 0
    assert batch.events == [  # one event per block, KV only: the state events are gone
        up.BlockStored([11], None, [0, 1, 2, 3], 4, None, "GPU"),
        up.BlockStored([12], 11, [4, 5, 6, 7], 4, None, "GPU"),
        up.BlockRemoved([12, 11], "GPU"),
        up.AllBlocksCleared(),
    ]


def test_we_decode_what_sglang_encodes() -> None:
    up = sglang_kv_events()
    batch = up.KVEventBatch(
        ts=1.0,
        events=[
            up.BlockStored([-5], None, [1, 2], 2, None, up.StorageMedium.GPU),
            up.BlockRemoved([-5], up.StorageMedium.CPU),
            up.AllBlocksCleared(),
        ],
        attn_dp_rank=1,
    )
    got = decode_batch(msgspec.msgpack.encode(batch))
    assert got.rank == 1 and not got.problems
    assert got.events == [
        BlockStored((-5,), None, [1, 2], 2, None, None, DEVICE),
        BlockRemoved((-5,), None, HOST),
        AllBlocksCleared(),
    ]


def test_vllm_round_trip() -> None:
    got = decode_batch(encode_batch(EVENTS, "vllm"))
    assert not got.problems and not got.unsafe
    assert [(type(e).__name__, getattr(e, "block_hashes", ())) for e in got.events] == [
        (type(e).__name__, getattr(e, "block_hashes", ())) for e in EVENTS
    ]
    assert got.events[1] == BlockStored((12,), 11, [4, 5, 6, 7], 4, 1, "mamba", DEVICE)


def test_decoding_tolerates_what_engines_add() -> None:
    newer_vllm = [  # a later vLLM's extra map keys, an older one's array layout with more fields
        0.0,
        [
            {
                "type": "BlockStored",
                "block_hashes": [2**64 - 1],
                "parent_block_hash": None,
                "token_ids": [1, 2],
                "block_size": 2,
                "lora_id": None,
                "medium": "GPU",
                "lora_name": None,
                "group_idx": 0,
                "kv_cache_spec_kind": "full_attention",
                "locality": "LOCAL",
                "session_id": "s",
            },
            ["BlockRemoved", [2**63], "GPU", 0, "LOCAL", "x"],
        ],
    ]
    got = decode_batch(msgspec.msgpack.encode(newer_vllm))
    assert not got.problems
    assert got.events == [  # unsigned 64-bit hashes kept as sent
        BlockStored((2**64 - 1,), None, [1, 2], 2, 0, "full_attention", DEVICE),
        BlockRemoved((2**63,), 0, DEVICE),
    ]


@pytest.mark.parametrize(
    "payload",
    [b"\xc1garbage", msgspec.msgpack.encode({"ts": 1}), msgspec.msgpack.encode([1.0])],
)
def test_not_a_batch(payload: bytes) -> None:
    with pytest.raises(MalformedBatch):
        decode_batch(payload)


def test_bad_events_are_reported_and_a_lost_removal_distrusts_what_came_before() -> None:
    batch = [
        1.0,
        [
            ["BlockStored", [1], None, [1, 2], 2, None, "GPU"],
            ["BlockStored", [2], 1, [1, 2, 3], 2, None, "GPU"],  # 3 tokens for one block of 2
            ["BlockStored", [3], None, [1, 2], 2, 7, "GPU"],  # a LoRA block: read, marked
            ["NewEventType", 1],
            ["BlockRemoved", "not a list"],
            ["BlockStored", [4], None, [5, 6], 2, None, "GPU"],
        ],
    ]
    got = decode_batch(msgspec.msgpack.encode(batch))
    assert [e.block_hashes for e in got.events] == [(1,), (3,), (4,)]  # type: ignore[union-attr]
    assert [e.namespace for e in got.events] == [None, "lora", None]  # type: ignore[union-attr]
    assert got.problems == [
        "BlockStored: 3 token_ids are not whole blocks of 2",
        "unknown event type 'NewEventType' ignored",
        "BlockRemoved: block_hashes must be a non-empty list",
    ]
    assert got.unsafe and got.trusted_from == 2  # the unreadable removal came after 2 events


def test_bad_release_name() -> None:
    with pytest.raises(ValueError, match="release must be one of .* got 'trtllm'"):
        encode_batch(EVENTS, "trtllm")


def test_array_layout_with_vllm_fields_keeps_the_groups() -> None:
    """Older vLLM sent array-like events: SGLang's fields, then lora_name, extra_keys,
    group_idx, kv_cache_spec_kind. A state event must not be read as a KV block."""
    batch = [
        1.0,
        [
            ["BlockStored", [7], None, [1, 2], 2, None, "GPU", None, None, 1, "mamba"],
            ["BlockRemoved", [7], "GPU", 1],
        ],
        0,
    ]
    got = decode_batch(msgspec.msgpack.encode(batch))
    assert got.events == [
        BlockStored((7,), None, [1, 2], 2, 1, "mamba", DEVICE),
        BlockRemoved((7,), 1, DEVICE),
    ]


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_only_events_are_encoded(fmt: str) -> None:
    with pytest.raises(TypeError, match="events must be"):
        encode_batch([AllBlocksCleared(), "BlockRemoved"], fmt)  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        ({"ts": "now"}, "ts"),
        ({"ts": float("nan")}, "ts"),
        ({"rank": "0"}, "rank"),
        ({"rank": -1}, "rank"),
        ({"rank": True}, "rank"),
    ],
)
def test_bad_batch_fields_are_refused(kw: dict[str, object], name: str) -> None:
    # Encoded as they were, the indexer would refuse such a batch (a str ts) or lose its rank.
    with pytest.raises((TypeError, ValueError), match=name):
        encode_batch([AllBlocksCleared()], "vllm", **kw)  # type: ignore[arg-type]
