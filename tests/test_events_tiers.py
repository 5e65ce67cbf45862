"""Events about the lower tiers: the emitter's `stored_on` / `removed_from`, their medium
through every listed release's own msgspec structs (loaded from its wheel), and what an
indexer fed them answers per tier.

Hashes are recomputed here from the definition (SHA-256 chain, as in
`test_events_emitter.py`), and per-tier answers are worked out by hand."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import replace
from typing import Any

import msgspec
import pytest

from mambaradix import MambaRadixCache
from mambaradix.core.node import TreeNode
from mambaradix.events import AllBlocksCleared, BlockRemoved, BlockStored, EventEmitter
from mambaradix.events.model import DEVICE, DISK, HOST, STATE_GROUP
from mambaradix.events.releases import NEWEST, RELEASES
from mambaradix.events.wire import decode_batch, encode_batch
from mambaradix.index import Indexer, TierOverlap
from upstream_kv_events import SGLANG, VLLM, kv_events

B = 4


def ref_hashes(tokens: list[int]) -> list[int]:
    out, prev = [], b""
    for i in range(len(tokens) // B):
        prev = hashlib.sha256(prev + struct.pack(f"<{B}I", *tokens[i * B : (i + 1) * B])).digest()
        out.append(struct.unpack(">q", prev[:8])[0])
    return out


def tree_with(*keys: list[int]) -> tuple[MambaRadixCache, EventEmitter, list[TreeNode]]:
    """A tree holding `keys` (each with a state at its end), an emitter on it, and the
    node ending each key."""
    tree = MambaRadixCache(page_size=1)
    em = EventEmitter(tree, B)
    nodes = []
    for i, key in enumerate(keys):
        tree.insert(key, list(range(100 * i, 100 * i + len(key))), state=i)
        nodes.append(tree.match_prefix(key).node)
    return tree, em, nodes


A = [1, 2, 3, 4]
AB = A + [5, 6, 7, 8]
H = ref_hashes(AB)


def test_stored_on_announces_the_nodes_blocks_and_state_with_the_medium() -> None:
    tree, em, (a, b) = tree_with(A, AB)
    device = em.take()
    em.stored_on(HOST, a, kv=True, state=True)
    em.stored_on(DISK, b, state=True)
    assert em.take() == [
        BlockStored((H[0],), None, tuple(A), B, medium=HOST),
        BlockStored((H[0],), None, tuple(A), B, 1, "mamba", HOST),
        BlockStored((H[1],), H[0], tuple(AB[4:]), B, medium=DISK),
        BlockStored((H[1],), H[0], tuple(AB[4:]), B, 1, "mamba", DISK),
    ]
    em.removed_from(HOST, a, kv=False, state=True)
    em.removed_from(DISK, b)  # the KV, and with it (for a router) the state there
    assert em.take() == [
        BlockRemoved((H[0],), STATE_GROUP, HOST),
        BlockRemoved((H[1],), 0, DISK),
    ]
    assert device  # the tree's own events were about the device
    assert all(e.medium == DEVICE for e in device if not isinstance(e, AllBlocksCleared))


def test_an_indexer_follows_a_demotion_and_a_device_eviction() -> None:
    """Both blocks and the state at 8 copied to the host, then the tree evicts everything
    from the device: by hand, the device reuses nothing, the host all 8 tokens, loading
    them, with the state from the host."""
    tree, em, (a, b) = tree_with(A, AB)
    ix = Indexer(B)
    prompt = AB + [9]
    ix.apply(0, em.take())
    assert ix.query_tiers(prompt)[0][HOST] == TierOverlap(8, 8, 0, {}, DEVICE)
    em.stored_on(HOST, a)
    em.stored_on(HOST, b, state=True)
    ix.apply(0, em.take())
    tree.evict(kv_tokens=8, states=2)
    ix.apply(0, em.take())
    got = ix.query_tiers(prompt)[0]
    assert got[DEVICE] == TierOverlap(0, 0, 0, {}, None)
    assert got[HOST] == got[DISK] == TierOverlap(8, 8, 0, {HOST: 8}, HOST)
    assert ix.query(prompt)[0].longest_matched == 0  # the plain answer: the device alone
    cold = Indexer(B)
    cold.apply(0, em.dump())  # a router starting cold sees the host copies too
    assert cold.query_tiers(prompt) == ix.query_tiers(prompt)
    ix.check_invariants()


def test_bad_calls_name_the_parameter_and_queue_nothing() -> None:
    tree, em, (a,) = tree_with(A)
    em.take()
    for medium in (DEVICE, "CPU", "cpu", None, 1):
        with pytest.raises(ValueError, match="medium must be 'host' or 'disk'"):
            em.stored_on(medium, a)  # type: ignore[arg-type]
    for node in (tree.root, "a", None):
        with pytest.raises(ValueError, match="node must be a node of the tree"):
            em.removed_from(HOST, node)  # type: ignore[arg-type]
    for kv, state in ((False, False), (1, False), (True, None)):
        with pytest.raises(ValueError, match="kv and state must be bools"):
            em.stored_on(HOST, a, kv, state)  # type: ignore[arg-type]
    assert em.take() == []
    assert em.dump() == [AllBlocksCleared(), *kv_and_state(A, None)]


def kv_and_state(key: list[int], parent: int | None) -> list[BlockStored]:
    h = ref_hashes(key)[-1]
    return [
        BlockStored((h,), parent, tuple(key[-B:]), B),
        BlockStored((h,), parent, tuple(key[-B:]), B, 1, "mamba"),
    ]


# ---------------------------------------------------- through each release's structs


def each(names: list[str]) -> list[Any]:
    quick = set(NEWEST.values())
    return [n if n in quick else pytest.param(n, marks=pytest.mark.slow) for n in names]


def tiered_events() -> list[Any]:
    tree, em, (a, b) = tree_with(A, AB)
    em.stored_on(HOST, a, state=True)
    em.stored_on(DISK, b, state=True)
    em.removed_from(HOST, a, kv=False, state=True)
    em.removed_from(DISK, b)
    return em.take()


def per_block(events: list[Any], spell: Any) -> list[tuple[str, Any, int]]:
    """(event type, medium as `spell` says it, hash) per block named, in order: a layout
    that one event per block or coalesced stores (SGLang) leave unchanged."""
    out = []
    for e in events:
        if not isinstance(e, AllBlocksCleared):
            out += [(type(e).__name__, spell(e.medium), h) for h in e.block_hashes]
    return out


@pytest.mark.parametrize("name", each(VLLM + SGLANG))
def test_the_medium_round_trips_through_the_releases_own_structs(name: str) -> None:
    """Our payload, read by the release's own decoder, names each block's medium as the
    release does (vLLM `GPU`/`CPU`/`FS` or `STORAGE`, SGLang `GPU`/`CPU_PINNED`/`DISK`);
    read back by us, each is the tier it was. State events are omitted where the release
    cannot say a state (SGLang), on every tier; a release with no name for a tier (vLLM
    0.24-0.25.1 and disk) refuses the event rather than invent one."""
    up, r = kv_events(name), RELEASES[name]
    events = tiered_events()
    if DISK not in r.media:
        with pytest.raises(ValueError, match=f"{name} has no medium for 'disk'"):
            encode_batch(events, name)
        events = [e for e in events if e.medium != DISK]
    said = [e for e in events if r.states or e.group == 0]
    payload = encode_batch(events, name, ts=1.0)
    theirs = msgspec.msgpack.Decoder(up.KVEventBatch).decode(payload).events
    media = {DEVICE: "GPU", HOST: "CPU" if r.engine == "vllm" else "CPU_PINNED"}
    media[DISK] = r.media.get(DISK)
    assert per_block(theirs, lambda m: m) == per_block(said, media.__getitem__)
    assert {"GPU", "CPU", "CPU_PINNED", "FS", "STORAGE", "DISK"} >= {e.medium for e in theirs}
    back = decode_batch(payload, r)
    assert not back.problems
    assert per_block(back.events, lambda m: m) == per_block(said, lambda m: m)
    if r.states:
        assert list(map(tokens_as_tuple, back.events)) == events  # every field as sent


def tokens_as_tuple(e: Any) -> Any:
    return replace(e, token_ids=tuple(e.token_ids)) if isinstance(e, BlockStored) else e
