"""EventEmitter: which block events a tree's changes produce.

Hashes are recomputed here from the definition (SHA-256 over the previous digest and the
block's tokens as little-endian uint32; the first 8 bytes big-endian as a signed int64),
independently of `mambaradix.events.hashing`."""

from __future__ import annotations

import hashlib
import struct

import pytest

from mambaradix import MambaRadixCache
from mambaradix.events import AllBlocksCleared, BlockRemoved, BlockStored, EventEmitter

_NEXT_KV = iter(range(10**9))


def fresh(n: int) -> list[int]:
    """n KV indices never used before (a caller's own, as insert requires)."""
    return [next(_NEXT_KV) for _ in range(n)]


def ref_hashes(tokens: list[int], size: int) -> list[int]:
    out, prev = [], b""
    for i in range(len(tokens) // size):
        block = tokens[i * size : (i + 1) * size]
        prev = hashlib.sha256(prev + struct.pack(f"<{size}I", *block)).digest()
        out.append(struct.unpack(">q", prev[:8])[0])
    return out


def kv(hashes: list[int], parent: int | None, tokens: list[int], size: int = 4) -> BlockStored:
    return BlockStored(tuple(hashes), parent, tuple(tokens), size)


def state(h: int, parent: int | None, tokens: list[int], size: int = 4) -> BlockStored:
    return BlockStored((h,), parent, tuple(tokens), size, 1, "mamba")


def setup(page: int = 1, size: int = 4) -> tuple[MambaRadixCache, EventEmitter]:
    tree = MambaRadixCache(page_size=page)
    return tree, EventEmitter(tree, size)


def test_only_full_blocks_and_states_on_the_grid() -> None:
    tree, em = setup()
    key = list(range(1, 11))  # 10 tokens: two full blocks, a state at 10 (off the grid)
    tree.insert(key, fresh(len(key)), state=0)
    h = ref_hashes(key, 4)
    assert em.take() == [kv(h, None, key[:8])]
    tree.insert(key[:8], fresh(len(key[:8])), state=1)  # splits at 8; the tombstone there revives
    assert em.take() == [state(h[1], h[0], key[4:8])]


def test_a_block_across_a_split_is_announced_once_with_its_chain() -> None:
    tree, em = setup()
    a = [1, 2, 3, 4, 5, 6, 7, 8]
    b = [1, 2, 3, 4, 5, 6, 50, 51]
    tree.insert(a, fresh(len(a)), state=0)
    tree.insert(b, fresh(len(b)), state=1)  # split at 6; the leaf [50, 51] completes block 1
    ha, hb = ref_hashes(a, 4), ref_hashes(b, 4)
    assert ha[0] == hb[0]
    assert em.take() == [
        kv(ha, None, a),
        state(ha[1], ha[0], a[4:]),
        kv([hb[1]], hb[0], b[4:]),
        state(hb[1], hb[0], b[4:]),
    ]
    assert (
        em.dump()
        == [  # parents first: [1..6] holds block 0, each leaf its block 1
            AllBlocksCleared(),
            kv([ha[0]], None, a[:4]),
            kv([ha[1]], ha[0], a[4:]),
            state(ha[1], ha[0], a[4:]),
            kv([hb[1]], hb[0], b[4:]),
            state(hb[1], hb[0], b[4:]),
        ]
    )


def test_a_block_goes_when_any_of_its_tokens_goes() -> None:
    tree, em = setup()
    a = [1, 2, 3, 4, 5, 6, 7, 8]
    b = [1, 2, 3, 4, 5, 6, 50, 51]
    tree.insert(a, fresh(len(a)), state=0)
    tree.insert(b, fresh(len(b)), state=1)
    em.take()
    ha, hb = ref_hashes(a, 4), ref_hashes(b, 4)
    tree.evict_leaf(tree.peek(b))  # tokens 50, 51 go: block 1 of b goes, block 0 stays
    assert em.take() == [BlockRemoved((hb[1],), 1), BlockRemoved((hb[1],))]
    tree.evict(kv_tokens=1)  # the leaf [7, 8], then the tombstone [1..6] left childless
    assert em.take() == [BlockRemoved((ha[1],), 1), BlockRemoved((ha[1],)), BlockRemoved((ha[0],))]


def test_tombstoning_retracts_the_state_only() -> None:
    tree, em = setup()
    a = list(range(1, 9))
    tree.insert(a[:4], fresh(len(a[:4])), state=0)
    tree.insert(a, fresh(len(a)), state=1)
    em.take()
    h = ref_hashes(a, 4)
    tree.evict_state_of(tree.peek(a[:4]))
    assert em.take() == [BlockRemoved((h[0],), 1)]


def test_reset_clears_and_hashes_start_over() -> None:
    tree, em = setup()
    tree.insert([1, 2, 3, 4], fresh(4), state=0)
    tree.reset()
    tree.insert([1, 2, 3, 4], fresh(4), state=1)
    h = ref_hashes([1, 2, 3, 4], 4)
    events = em.take()
    assert events[2] == AllBlocksCleared()
    assert events[3:] == [kv(h, None, [1, 2, 3, 4]), state(h[0], None, [1, 2, 3, 4])]


def test_attaching_to_a_filled_tree_announces_its_contents() -> None:
    tree = MambaRadixCache(page_size=2)
    tree.insert([1, 2, 3, 4, 5, 6], fresh(6), state=0)
    em = EventEmitter(tree, 2)
    h = ref_hashes([1, 2, 3, 4, 5, 6], 2)
    assert em.take() == [
        kv(h, None, [1, 2, 3, 4, 5, 6], 2),
        state(h[2], h[1], [5, 6], 2),
    ]
    em.close()
    tree.insert([9, 9], fresh(2), state=1)
    assert em.take() == []


def test_namespaces_and_tokens_beyond_uint32_are_not_announced() -> None:
    tree, em = setup()
    tree.insert([1, 2, 3, 4], fresh(4), state=0, extra_key="tenant")
    tree.insert([1, 2, 3, 4, 5, 6, 7, 8], fresh(8), state=1, extra_key="tenant")
    tree.insert([2**32, 1, 2, 3], fresh(4), state=2)
    assert em.take() == []
    assert em.skipped_blocks == 3
    assert em.dump() == [AllBlocksCleared()]


def test_bad_arguments() -> None:
    tree = MambaRadixCache(page_size=4)
    with pytest.raises(ValueError, match="multiple of the tree's page_size"):
        EventEmitter(tree, 6)
    with pytest.raises(ValueError, match="block_size"):
        EventEmitter(tree, 0)
    with pytest.raises(ValueError, match="block_size"):
        EventEmitter(tree, True)
    with pytest.raises(TypeError, match="tree"):
        EventEmitter(object(), 4)  # type: ignore[arg-type]
    tree.insert([1, 2, 3, 4], fresh(4), state=0)
    assert len(tree._listeners) == 0  # no half-made emitter is left listening
