"""The upstream harness drives SGLang 0.5.15.post1's real MambaRadixCache correctly.

Replays upstream's own unit-test scenarios (and a known upstream bug) through
``UpstreamCache`` and checks the documented outcomes, so the differential tests that
compare our tree against it stand on a verified base.
"""

from __future__ import annotations

from array import array
from itertools import count

import pytest

import upstream_sglang
from upstream_sglang import UpstreamCache


class FreshKV:
    """Hands out KV indices never used before (the tests play the allocator)."""

    def __init__(self, start: int = 1000) -> None:
        self._next = count(start)

    def take(self, n: int) -> list[int]:
        return [next(self._next) for _ in range(n)]


def test_mamba_radix_cache_1_scenario() -> None:
    """Upstream ``test_mamba_radix_cache_1`` (page 1), with its documented results."""
    cache = UpstreamCache(page_size=1)
    kv = FreshKV()
    k1, k2, k3, k4 = [1, 2, 3], [1, 2, 3, 4, 5, 6, 7], [10, 11, 12], [1, 2, 3, 4, 5, 60, 70]
    v1, v2, v3, v4 = kv.take(3), kv.take(7), kv.take(3), kv.take(7)

    r = cache.insert(k1, v1, state=1)
    assert (r.prefix_len, r.state_existed, list(r.freed_kv)) == (0, False, [])
    r = cache.insert(k2, v2, state=2)
    assert (r.prefix_len, r.state_existed, list(r.freed_kv)) == (3, False, v2[:3])
    r = cache.insert(k3, v3, state=3)
    assert (r.prefix_len, r.state_existed, list(r.freed_kv)) == (0, False, [])
    r = cache.insert(k4, v4, state=4)  # splits [4,5,6,7] into tombstone [4,5] + [6,7]
    assert (r.prefix_len, r.state_existed, list(r.freed_kv)) == (5, False, v4[:5])
    assert cache.full_evictable_size() == 3 + 4 + 3 + 2
    assert cache.state_evictable_size() == 4
    assert (cache.full_protected_size(), cache.state_protected_size()) == (0, 0)
    cache.sanity_check()

    # KV eviction takes the LRU unlocked leaf [10,11,12] whole.
    e = cache.evict(kv_tokens=1)
    assert (e.kv_tokens, e.states, list(e.freed_kv), e.freed_states) == (3, 0, v3, [3])
    cache.sanity_check()

    # State eviction: the LRU state is internal node [1,2,3]; it becomes a tombstone.
    e = cache.evict(states=1)
    assert (e.kv_tokens, e.states, list(e.freed_kv), e.freed_states) == (0, 1, [], [1])
    assert cache.state_evictable_size() == 2
    cache.sanity_check()

    m = cache.match_prefix([1, 2, 3, 4, 5])
    assert (m.prefix_len, m.node, m.branching_len) == (0, cache.root, None)
    assert isinstance(m.kv_indices, array) and len(m.kv_indices) == 0

    m = cache.match_prefix(k4)
    assert m.prefix_len == 7
    assert list(m.kv_indices) == v1 + v2[3:5] + v4[5:]
    assert list(m.node.key.token_ids) == [60, 70]
    assert m.branching_len is None

    m = cache.match_prefix(k2)
    assert m.prefix_len == 7
    assert list(m.kv_indices) == v1 + v2[3:]
    assert list(m.node.key.token_ids) == [6, 7]

    # Next LRU state is leaf [60,70]: deleted with its KV; tombstones stay above [6,7].
    e = cache.evict(states=1)
    assert (e.kv_tokens, e.states, list(e.freed_kv), e.freed_states) == (0, 1, v4[5:], [4])
    m = cache.match_prefix(k4)
    assert (m.prefix_len, m.node) == (0, cache.root)
    assert cache.match_prefix(k2).prefix_len == 7
    cache.sanity_check()


def test_insert_prev_prefix_len_accounting() -> None:
    """Upstream ``test_insert_prev_prefix_len``: only duplicates at or past
    ``prev_prefix_len`` are handed back for freeing."""
    cache = UpstreamCache()
    kv = FreshKV()
    v1, v2, v3, v4 = kv.take(3), kv.take(7), kv.take(8), kv.take(9)

    r = cache.insert([1, 2, 3], v1, state=1)
    assert (r.prefix_len, list(r.freed_kv)) == (0, [])
    r = cache.insert(list(range(1, 8)), v2, state=2, prev_prefix_len=0)
    assert (r.prefix_len, list(r.freed_kv)) == (3, v2[:3])
    r = cache.insert(list(range(1, 9)), v3, state=3, prev_prefix_len=2)
    assert (r.prefix_len, list(r.freed_kv)) == (7, v3[2:7])  # 5 freed, 1 stored
    r = cache.insert(list(range(1, 10)), v4, state=4, prev_prefix_len=8)
    assert (r.prefix_len, list(r.freed_kv)) == (8, [])
    assert cache.full_evictable_size() == 9
    m = cache.match_prefix(list(range(1, 10)))
    assert list(m.kv_indices) == v1 + v2[3:] + v3[7:] + v4[8:]
    cache.sanity_check()


def test_identical_prompt_prefix_misses() -> None:
    """Upstream bug #22935: a state at the end of K gives no hit for K[:-1]."""
    cache = UpstreamCache()
    key = list(range(100, 110))
    cache.insert(key, FreshKV().take(10), state=7)
    m = cache.match_prefix(key[:9])
    assert (m.prefix_len, m.node, m.branching_len) == (0, cache.root, None)
    assert cache.match_prefix(key).prefix_len == 10
    cache.sanity_check()


def test_chunk_size_sets_branching_len() -> None:
    cache = UpstreamCache(chunk_size=4)
    key = list(range(100, 110))
    cache.insert(key, FreshKV().take(10), state=7)
    assert cache.match_prefix(key[:9]).branching_len == 8
    assert UpstreamCache(chunk_size=64).inner.mamba_cache_chunk_size == 64


def test_page_size_4_smoke() -> None:
    cache = UpstreamCache(page_size=4)
    key = list(range(1, 9))
    r = cache.insert(key, FreshKV().take(8), state=5)
    assert (r.prefix_len, r.state_existed) == (0, False)
    m = cache.match_prefix(key[:6])
    assert (m.prefix_len, m.node, m.branching_len) == (0, cache.root, None)
    assert cache.match_prefix(key).prefix_len == 8
    cache.sanity_check()


def test_locks_receipts_and_existing_state() -> None:
    cache = UpstreamCache()
    kv = FreshKV()
    v = kv.take(4)
    cache.insert([1, 2, 3, 4], v, state=1)
    r = cache.insert([1, 2, 3, 4], kv.take(4), state=2)
    assert r.state_existed and r.prefix_len == 4 and len(r.freed_kv) == 4
    node = cache.match_prefix([1, 2, 3, 4]).node
    receipt = cache.inc_lock_ref(node)
    assert (cache.full_protected_size(), cache.state_protected_size()) == (4, 1)
    assert (cache.full_evictable_size(), cache.state_evictable_size()) == (0, 0)
    e = cache.evict(kv_tokens=10, states=10)
    assert (e.kv_tokens, e.states, list(e.freed_kv), e.freed_states) == (0, 0, [], [])
    cache.dec_lock_ref(receipt)
    assert (cache.full_evictable_size(), cache.state_evictable_size()) == (4, 1)
    e = cache.evict(kv_tokens=1)
    assert (e.kv_tokens, list(e.freed_kv), e.freed_states) == (4, v, [1])
    cache.sanity_check()


def test_missing_wheel_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv(upstream_sglang.WHEEL_ENV, str(tmp_path / "nope.whl"))
    with pytest.raises(RuntimeError, match="pip download sglang==0.5.15.post1"):
        upstream_sglang.find_wheel()
