"""`InsertResult.node`, `touch` and `path_kv`: what a caller reads after an insert without
walking the key again, against the walks themselves (`peek`, `match_prefix`) on random
sequences of inserts, matches and evictions, in every mode."""

from __future__ import annotations

import copy
import random

import pytest

from mambaradix import MambaRadixCache
from mambaradix.core.node import Link


def order(links: object) -> list[tuple[int, int]]:
    out = []
    for link in links:  # type: ignore[attr-defined]
        assert isinstance(link, Link) and link.node is not None
        out.append((link.node.id, link.stamp))
    return out


@pytest.mark.parametrize("compat", [None, "sglang-0.5.15.post1", "sglang-0.5.23"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_insert_node_touch_and_path_kv_agree_with_the_walks(compat: str | None, seed: int) -> None:
    rng = random.Random(seed)
    cache = MambaRadixCache(chunk_size=4, compat=compat)
    keys: list[list[int]] = []
    next_kv = 0
    for step in range(150):
        base = rng.choice(keys) if keys and rng.random() < 0.7 else []
        key = base[: rng.randint(0, len(base))] + [
            rng.randint(0, 3) for _ in range(rng.randint(1, 9))
        ]
        m = cache.match_prefix(key, read_only=True)
        kv = list(m.kv_indices[: m.prefix_len]) + list(range(next_kv, next_kv + len(key)))
        kv = kv[: len(key)]
        next_kv += len(key)
        r = cache.insert(key, kv, step, prev_prefix_len=m.prefix_len)
        assert r.node is not None and r.node is cache.peek(key)
        assert r.node.state is not None
        keys.append(key)
        if rng.random() < 0.2:
            cache.evict(kv_tokens=rng.randint(1, 20), states=rng.randint(0, 3))
        if step % 5 or r.node.parent is None or r.node.state is None:  # (evicted)
            continue
        start = rng.randint(0, len(key))
        walked, touched = copy.deepcopy(cache), copy.deepcopy(cache)
        got = walked.match_prefix(key)
        assert got.prefix_len == len(key)
        assert list(cache.path_kv(r.node, start)) == list(got.kv_indices[start:])
        node = touched.peek(key)
        assert node is not None
        touched.touch(node)
        for res in (0, 1):
            assert order(touched.lru[res]) == order(walked.lru[res])
    cache.check_invariants()


def test_touch_and_path_kv_refuse_bad_nodes() -> None:
    cache, other = MambaRadixCache(), MambaRadixCache()
    cache.insert([1, 2, 3], [4, 5, 6], 0)
    node = other.insert([1, 2], [7, 8], 1).node
    assert node is not None
    with pytest.raises(ValueError, match="not in this tree"):
        cache.touch(node)
    with pytest.raises(TypeError, match="expected a TreeNode"):
        cache.path_kv("x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="start must be >= 0"):
        cache.path_kv(cache.root, -1)
    assert list(cache.path_kv(cache.root)) == []
