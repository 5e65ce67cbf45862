"""Every listed release against its own msgspec structs, loaded from its wheel at test time
(`tests/upstream_kv_events.py`): the release table matches the structs; our payload is,
byte for byte, what the release's own encoder makes of the events it would send; we read
what the release writes, every optional field of it set; and vLLM's align-mode state
stores (fewer hashes than blocks) credit exactly the states they name.

The newest release of each engine runs in the default tier, every other one under
`-m slow` (`pytest -m slow tests/test_events_releases.py`)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from mambaradix.events import AllBlocksCleared, BlockRemoved, BlockStored, chain_hashes
from mambaradix.events.model import DEVICE, DISK, HOST
from mambaradix.events.releases import NEWEST, RELEASES, release
from mambaradix.events.wire import ARRAYS, MAPS, decode_batch, encode_batch
from mambaradix.index import Indexer
from upstream_kv_events import SGLANG, VLLM, kv_events


def each(names: list[str]) -> list[Any]:
    quick = set(NEWEST.values())
    return [n if n in quick else pytest.param(n, marks=pytest.mark.slow) for n in names]


def version(name: str) -> tuple[int, ...]:
    return tuple(int(x) for x in name.split("-")[1].split(".")[:3])


def make(cls: Any, **fields: Any) -> Any:
    """One of the release's structs, with those of `fields` it has."""
    return cls(**{k: v for k, v in fields.items() if k in cls.__struct_fields__})


# The events: a KV chain of three blocks (the third stored apart), a state at block 2,
# its removal, the KV removed in two events, a reset.
T = list(range(12))
EVENTS = [
    BlockStored((11, 12), None, tuple(T[:8]), 4),
    BlockStored((13,), 12, tuple(T[8:]), 4),
    BlockStored((12,), 11, tuple(T[4:8]), 4, 1, "mamba"),
    BlockRemoved((12,), 1),
    BlockRemoved((13,)),
    BlockRemoved((12, 11)),
    AllBlocksCleared(),
]


# --------------------------------------------------------------------- the table


@pytest.mark.parametrize("name", each(VLLM + SGLANG))
def test_the_release_table_is_the_wheels(name: str) -> None:
    up, r = kv_events(name), RELEASES[name]
    for ours, theirs in ((r.stored, up.BlockStored), (r.removed, up.BlockRemoved)):
        assert ours.fields == theirs.__struct_fields__
        assert ours.required == len(theirs.__struct_fields__) - len(theirs.__struct_defaults__)
    config = up.KVCacheEvent.__struct_config__
    assert (config.array_like, config.omit_defaults) == (not r.event_maps, r.omit_defaults)
    assert config.tag_field == "type" or not r.event_maps
    if r.engine == "vllm":  # MEDIUM_* constants; "CPU" before 0.26 is the offload spec's
        named = {v for k, v in vars(up).items() if k.startswith("MEDIUM_")}
        named |= {"CPU"} if version(name) < (0, 26) else set()
    else:
        named = {m.value for m in up.StorageMedium}
    assert set(r.media.values()) <= named
    assert r.states == ("group_idx" in up.BlockStored.__struct_fields__)


def test_release_names() -> None:
    assert release("vllm").name == "vllm-0.33.0" and release("sglang").name == "sglang-0.5.23"
    with pytest.raises(ValueError, match=r"release must be one of vllm, sglang, vllm-0\.24\.0"):
        release("vllm-0.34.0")
    with pytest.raises(ValueError, match="got 'trtllm'"):
        encode_batch([AllBlocksCleared()], "trtllm")
    with pytest.raises(ValueError, match="vllm-0.24.0 has no medium for 'disk'"):
        encode_batch([BlockRemoved((1,), 0, DISK)], "vllm-0.24.0")


# ----------------------------------------------------------- what we send, byte for byte


def vllm_expected(up: Any) -> list[Any]:
    """What vLLM sends for EVENTS: every event, with its group and kind."""

    def stored(hashes: list[int], parent: int | None, tokens: list[int], group: int) -> Any:
        kind = "mamba" if group else "full_attention"
        return up.BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=tokens,
            block_size=4,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            group_idx=group,
            kv_cache_spec_kind=kind,
        )

    return [
        stored([11, 12], None, T[:8], 0),
        stored([13], 12, T[8:], 0),
        stored([12], 11, T[4:8], 1),
        up.BlockRemoved(block_hashes=[12], medium="GPU", group_idx=1),
        up.BlockRemoved(block_hashes=[13], medium="GPU", group_idx=0),
        up.BlockRemoved(block_hashes=[12, 11], medium="GPU", group_idx=0),
        up.AllBlocksCleared(),
    ]


def sglang_expected(up: Any, per_page: bool) -> list[Any]:
    """What SGLang sends for EVENTS: KV only; one store per page up to 0.5.17, later
    consecutive stores of one chain and consecutive removals coalesced."""
    gpu = up.StorageMedium.GPU
    if per_page:
        return [
            up.BlockStored([11], None, T[:4], 4, None, gpu),
            up.BlockStored([12], 11, T[4:8], 4, None, gpu),
            up.BlockStored([13], 12, T[8:], 4, None, gpu),
            up.BlockRemoved([13], gpu),
            up.BlockRemoved([12, 11], gpu),
            up.AllBlocksCleared(),
        ]
    return [
        up.BlockStored([11, 12, 13], None, T, 4, None, gpu),
        up.BlockRemoved([13, 12, 11], gpu),
        up.AllBlocksCleared(),
    ]


@pytest.mark.parametrize("name", each(VLLM + SGLANG))
def test_our_payload_is_the_releases_own_encoding(name: str) -> None:
    up = kv_events(name)
    if name in VLLM:
        batch = up.KVEventBatch(ts=2.5, events=vllm_expected(up), data_parallel_rank=3)
    else:
        per_page = version(name) <= (0, 5, 17)
        batch = up.KVEventBatch(ts=2.5, events=sglang_expected(up, per_page), attn_dp_rank=3)
    ours = encode_batch(EVENTS, name, ts=2.5, rank=3)
    assert ours == msgspec.msgpack.encode(batch)
    assert msgspec.msgpack.Decoder(up.KVEventBatch).decode(ours) == batch


# ------------------------------------------------------ what the release sends, read back


def vllm_written(up: Any, name: str) -> tuple[list[Any], list[Any]]:
    """vLLM's structs with every field the release has set, and what we read from them."""
    extras = {
        "extra_keys": [None, None],
        "kv_cache_spec_sliding_window": None,
        "locality": "LOCAL",
        "ownership": "tier-1",
        "session_id": "s",
    }
    lookahead = version(name) >= (0, 33)
    events = [
        make(
            up.BlockStored,
            block_hashes=[2**64 - 1, b"\x01" * 32],
            parent_block_hash=None,
            token_ids=[1, 2, 3, 4],
            block_size=2,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            group_idx=0,
            kv_cache_spec_kind="full_attention",
            **extras,
            lookahead_token_ids=[[3], [5]],
        ),
        make(
            up.BlockStored,
            block_hashes=[7],
            parent_block_hash=None,
            token_ids=[1, 2],
            block_size=2,
            lora_id=None,
            medium="CPU",
            lora_name=None,
            group_idx=0,
            kv_cache_spec_kind="full_attention",
        ),
        make(
            up.BlockStored,
            block_hashes=[8],
            parent_block_hash=None,
            token_ids=[],
            block_size=0,
            lora_id=None,
            medium=list(RELEASES[name].media.values())[-1],
            lora_name=None,
            group_idx=1,
        ),  # the offload placeholder
        make(
            up.BlockStored,
            block_hashes=[9],
            parent_block_hash=None,
            token_ids=[1, 2],
            block_size=2,
            lora_id=3,
            medium="GPU",
            lora_name="adapter",
        ),
        make(
            up.BlockRemoved,
            block_hashes=[2**64 - 1],
            medium="GPU",
            group_idx=0,
            locality="REMOTE",
            ownership="tier-1",
        ),
        up.AllBlocksCleared(),
    ]
    low = int.from_bytes(b"\x01" * 8, "big")  # vLLM's int mode keeps the low 64 bits
    lower = HOST if len(RELEASES[name].media) == 2 else DISK
    read = [
        BlockStored(
            (2**64 - 1, low),
            None,
            [1, 2, 3, 4],
            2,
            0,
            "full_attention",
            DEVICE,
            None,
            ((3,), (5,)) if lookahead else None,
        ),
        BlockStored((7,), None, [1, 2], 2, 0, "full_attention", HOST),
        BlockStored((8,), None, [], 0, 1, None, lower),
        BlockStored((9,), None, [1, 2], 2, None, None, DEVICE, "lora"),
        BlockRemoved((2**64 - 1,), 0, DEVICE),
        AllBlocksCleared(),
    ]
    return events, read


def sglang_written(up: Any, name: str) -> tuple[list[Any], list[Any]]:
    m = up.StorageMedium
    events = [
        make(
            up.BlockStored,
            block_hashes=[-5, 6],
            parent_block_hash=None,
            token_ids=[1, 2, 3, 4],
            block_size=2,
            lora_id=None,
            medium=m.GPU,
            session_id="s",
        ),
        up.BlockStored([7], -5, [3, 4], 2, None, m.CPU),
        up.BlockStored([8], None, [5, 6], 2, None),  # medium left at its default
        up.BlockRemoved([6], m.DISK),
        up.BlockRemoved([7], m.EXTERNAL),
        up.AllBlocksCleared(),
    ]
    read: list[Any] = [
        BlockStored((-5, 6), None, [1, 2, 3, 4], 2, None, None, DEVICE),
        BlockStored((7,), -5, [3, 4], 2, None, None, HOST),
        BlockStored((8,), None, [5, 6], 2, None, None, None),
        BlockRemoved((6,), None, DISK),
        BlockRemoved((7,), None, DISK),
        AllBlocksCleared(),
    ]
    salted = None
    if hasattr(up, "BlockStoredWithMetadata"):  # 0.5.18-0.5.19
        salted = up.BlockStoredWithMetadata(
            [9], None, [1, 2], 2, None, m.GPU, metadata=up.BlockStoredMetadata(cache_salt="x")
        )
    elif "cache_salt" in up.BlockStored.__struct_fields__:  # 0.5.20+
        salted = up.BlockStored([9], None, [1, 2], 2, None, m.GPU, cache_salt="x")
    if salted is not None:
        events.insert(-1, salted)
        read.insert(-1, BlockStored((9,), None, [1, 2], 2, None, None, DEVICE, "cache_salt"))
    if "lora_name" in up.BlockStored.__struct_fields__:  # 0.5.22+
        events.insert(-1, up.BlockStored([10], None, [1, 2], 2, None, m.GPU, lora_name="a"))
        read.insert(-1, BlockStored((10,), None, [1, 2], 2, None, None, DEVICE, "lora"))
    return events, read


@pytest.mark.parametrize("name", each(VLLM + SGLANG))
def test_we_read_what_the_release_writes(name: str) -> None:
    up, r = kv_events(name), RELEASES[name]
    events, want = (vllm_written if name in VLLM else sglang_written)(up, name)
    payload = msgspec.msgpack.encode(up.KVEventBatch(ts=1.0, events=events))
    for expect in (None, r):
        got = decode_batch(payload, expect)
        assert got.problems == [] and not got.unsafe
        assert got.events == want
        assert got.layout == (MAPS if r.event_maps else ARRAYS)


# ---------------------------------------------------------------- vLLM's align mode


@pytest.mark.parametrize("name", each(VLLM))
def test_align_mode_state_stores_credit_the_states_they_name(name: str) -> None:
    """vLLM's `BlockPool.cache_full_blocks` (0.33.0 `v1/core/block_pool.py:265-357`) sends,
    per group, one store from the last cached block on: `token_ids` span every new
    block, `block_hashes` only the blocks that are not null. A Mamba group in align mode
    keeps a state at few blocks (the others are null), so its store names fewer blocks
    than its tokens span; each hash is that block's, as in the attention group."""
    up = kv_events(name)
    tokens = list(range(100, 132))  # 8 blocks of 4
    h = chain_hashes(tokens, 4)

    def store(hashes: list[int], parent: int | None, span: range, group: int) -> Any:
        kind = "mamba" if group else "full_attention"
        return up.BlockStored(
            hashes,
            parent,
            tokens[span.start * 4 : span.stop * 4],
            4,
            None,
            "GPU",
            None,
            group_idx=group,
            kv_cache_spec_kind=kind,
        )

    steps = [
        [store(h[:4], None, range(0, 4), 0), store([h[2]], None, range(0, 4), 1)],  # state at 12
        [store(h[4:], h[3], range(4, 8), 0), store([h[4], h[6]], h[3], range(4, 8), 1)],
        [store([], h[7], range(8, 8), 1)],  # nothing new: no hashes
    ]
    ix = Indexer(4)
    for step in steps:
        batch = decode_batch(msgspec.msgpack.encode(up.KVEventBatch(ts=0.0, events=step)))
        assert batch.problems == []
        ix.apply(0, batch.events)
    answers = {n: ix.query(tokens[:n])[0].usable for n in (13, 16, 17, 21, 28, 33)}
    assert answers == {13: 12, 16: 12, 17: 12, 21: 20, 28: 20, 33: 28}
    assert ix.query(tokens + [0])[0].longest_matched == 32
    # a KV store must still name every block: that is a malformed event
    bad = store(h[:3], None, range(0, 4), 0)
    got = decode_batch(msgspec.msgpack.encode(up.KVEventBatch(ts=0.0, events=[bad])))
    assert got.events == [] and got.problems == [
        "BlockStored: 3 block_hashes for 4 blocks of full_attention"
    ]
