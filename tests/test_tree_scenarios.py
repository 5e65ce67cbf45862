"""Hand-worked scenarios with exact expected results.

Mostly the default behaviour (compat=None); a few pin where compat="sglang-0.5.15.post1"
differs on purpose. Trees are drawn in the docstrings; KV indices are chosen so a
node's indices are easy to recognise (the index of token t is often 10 + t).
"""

from __future__ import annotations

from typing import Any

import pytest

from mambaradix import MambaRadixCache, MatchResult

# --------------------------------------------------------------------- helpers


def match(cache: MambaRadixCache, key: list[int], ns: Any = None) -> tuple[Any, ...]:
    """(prefix_len, kv_indices, kv_hit_len, branching_len) as plain values."""
    r: MatchResult = cache.match_prefix(key, extra_key=ns)
    assert len(r.kv_indices) == r.prefix_len
    assert (r.node is cache.root) == (r.prefix_len == 0)
    return r.prefix_len, list(r.kv_indices), r.kv_hit_len, r.branching_len


def insert(
    cache: MambaRadixCache, key: list[int], kv: list[int], state: int, prev: int = 0, ns: Any = None
) -> tuple[int, bool, list[int]]:
    r = cache.insert(key, kv, state, prev_prefix_len=prev, extra_key=ns)
    cache.check_invariants()
    return r.prefix_len, r.state_existed, list(r.freed_kv)


def evict(cache: MambaRadixCache, kv_tokens: int = 0, states: int = 0) -> tuple[Any, ...]:
    r = cache.evict(kv_tokens=kv_tokens, states=states)
    cache.check_invariants()
    return r.kv_tokens, r.states, list(r.freed_kv), r.freed_states


def sizes(cache: MambaRadixCache) -> tuple[int, int, int, int]:
    """(full evictable, full protected, state evictable, state protected)."""
    return (
        cache.full_evictable_size(),
        cache.full_protected_size(),
        cache.state_evictable_size(),
        cache.state_protected_size(),
    )


def two_level(compat: str | None = None) -> MambaRadixCache:
    """root ── [1,2] state 1 ── [3,4] state 2   (KV 10,11 | 12,13)"""
    cache = MambaRadixCache(chunk_size=2, compat=compat)
    assert insert(cache, [1, 2], [10, 11], 1) == (0, False, [])
    assert insert(cache, [1, 2, 3, 4], [10, 11, 12, 13], 2, prev=2) == (2, False, [])
    return cache


# ------------------------------------------------------------- read-only match


def test_default_match_never_splits_but_reports_kv_hit() -> None:
    """A match ending inside an edge leaves the tree as it was, yet reports the KV
    it matched (kv_hit_len) and the chunk-aligned branching point."""
    cache = MambaRadixCache(chunk_size=2)
    insert(cache, [1, 2, 3, 4], [10, 11, 12, 13], 1)
    before = cache.pretty()
    assert match(cache, [1, 2, 9]) == (0, [], 2, 2)
    assert match(cache, [1, 2, 3]) == (0, [], 3, 2)
    assert cache.node_count() == 1 and cache.pretty() == before
    assert match(cache, [1, 2, 3, 4, 5]) == (4, [10, 11, 12, 13], 4, None)


def test_sglang_match_splits() -> None:
    """compat="sglang-0.5.15.post1" splits the edge at the divergence (upstream behaviour): same
    results, one more node, a stateless node in the middle."""
    cache = MambaRadixCache(chunk_size=2, compat="sglang-0.5.15.post1")
    insert(cache, [1, 2, 3, 4], [10, 11, 12, 13], 1)
    assert match(cache, [1, 2, 9]) == (0, [], 2, 2)
    assert cache.node_count() == 2
    assert "tombstone" in cache.pretty()
    cache.check_invariants()


# ------------------------------------------------------- only the used state


@pytest.mark.parametrize(
    "compat,first,rest",
    [
        (None, [1], [3, 4, 2]),  # default: a1's state was never used again -> oldest
        ("sglang-0.5.15.post1", [3], [4, 1, 2]),  # sglang: the match refreshed a1 along with b1
    ],
)
def test_match_refreshes_only_the_state_it_uses(
    compat: str | None, first: list[int], rest: list[int]
) -> None:
    """Two sessions: a1 -> b1 and a2 -> b2 (states 1, 2, 3, 4, inserted in that order).

    Re-matching session 1 (b1) uses only b1's state. Default (SGLang #31643): state
    order oldest first is a1, a2, b2, b1, so a1 goes first (tombstoned: it has a
    child). compat="sglang-0.5.15.post1" also refreshes a1 (the whole matched path), so the order
    is a2, b2, a1, b1 and a2 goes first."""
    cache = MambaRadixCache(chunk_size=2, compat=compat)
    insert(cache, [1, 1], [10, 11], 1)
    insert(cache, [1, 1, 2, 2], [10, 11, 12, 13], 2, prev=2)
    insert(cache, [3, 3], [30, 31], 3)
    insert(cache, [3, 3, 4, 4], [30, 31, 32, 33], 4, prev=2)
    assert match(cache, [1, 1, 2, 2])[0] == 4
    assert evict(cache, states=1) == (0, 1, [], first)
    assert evict(cache, states=3)[3] == rest


# --------------------------------------------------------------------- pages


def test_page4_match_uses_whole_pages_and_never_creates_a_node() -> None:
    """page_size 4, tree [1..8]: a 7-token key is cut to one page; the match ends
    inside the edge (no state there): 0 usable, 4 KV tokens hit, no new node."""
    cache = MambaRadixCache(page_size=4, chunk_size=4)
    kv = list(range(11, 19))
    insert(cache, list(range(1, 9)), kv, 1)
    before = cache.pretty()
    assert match(cache, list(range(1, 8))) == (0, [], 4, 4)
    assert cache.node_count() == 1 and cache.pretty() == before
    # With a state after the first page (revived split point), 4 tokens are usable.
    assert insert(cache, [1, 2, 3, 4], kv[:4], 2, prev=4) == (4, False, [])
    assert cache.node_count() == 2
    assert match(cache, list(range(1, 8))) == (4, kv[:4], 4, None)
    assert match(cache, [1, 2, 3]) == (0, [], 0, None)  # less than a page: nothing
    assert cache.node_count() == 2


def test_page4_sglang_match_splits_on_the_page_boundary() -> None:
    cache = MambaRadixCache(page_size=4, chunk_size=4, compat="sglang-0.5.15.post1")
    insert(cache, list(range(1, 9)), list(range(11, 19)), 1)
    assert match(cache, list(range(1, 8))) == (0, [], 4, 4)
    assert cache.node_count() == 2


# ---------------------------------------------------------------- namespaces


def test_namespaces_isolate_identical_keys() -> None:
    """The same tokens under extra_key None, "lora" and "other" are three prefixes."""
    cache = MambaRadixCache()
    assert insert(cache, [1, 2, 3], [10, 11, 12], 1) == (0, False, [])
    assert insert(cache, [1, 2, 3], [20, 21, 22], 2, ns="lora") == (0, False, [])
    assert match(cache, [1, 2, 3]) == (3, [10, 11, 12], 3, None)
    assert match(cache, [1, 2, 3], ns="lora") == (3, [20, 21, 22], 3, None)
    assert match(cache, [1, 2, 3], ns="other") == (0, [], 0, None)
    # Re-inserting into "lora" finds its own copy only.
    assert insert(cache, [1, 2, 3], [30, 31, 32], 3, ns="lora") == (3, True, [30, 31, 32])
    assert sorted(cache.all_kv_indices()) == [10, 11, 12, 20, 21, 22]
    assert sorted(cache.all_states()) == [1, 2]
    assert "ns='lora'" in cache.pretty()


# ------------------------------------------------------------- tombstones


def test_tombstone_then_revival_by_insert() -> None:
    """root ── [1,2] state 1 ── [3,4] state 2. Evicting one state tombstones [1,2]
    (the oldest; it keeps its KV because it has a child); a lookup then cuts back to
    the root; inserting [1,2] again revives it with the new state and hands back the
    caller's duplicate KV."""
    cache = two_level()
    assert evict(cache, states=1) == (0, 1, [], [1])
    assert "tombstone" in cache.pretty()
    assert sizes(cache) == (4, 0, 1, 0)
    assert match(cache, [1, 2, 3]) == (0, [], 3, 2)
    assert match(cache, [1, 2]) == (0, [], 2, 2)
    assert insert(cache, [1, 2], [20, 21], 5) == (2, False, [20, 21])
    assert "tombstone" not in cache.pretty()
    assert sorted(cache.all_states()) == [2, 5]
    assert match(cache, [1, 2]) == (2, [10, 11], 2, None)
    assert cache.match_prefix([1, 2]).node.state == 5


@pytest.mark.parametrize("compat", [None, "sglang-0.5.15.post1"])
def test_evict_result_counts_as_documented(compat: str | None) -> None:
    """README / EvictResult: `kv_tokens` counts the KV the KV phase freed (leaves and the
    tombstones they leave childless), `states` the states the state phase freed; what a
    phase frees on the side (a KV-evicted leaf's state, a state-evicted leaf's KV)
    shows only in freed_kv / freed_states. Tree (LRU order in both lists: 1, 2, 3):
        root ─┬─ [1,2] state 1 (KV 10,11) ── [3,4] state 2 (KV 12,13)
              └─ [5,6] state 3 (KV 30,31)"""

    def build() -> MambaRadixCache:
        cache = two_level(compat)
        insert(cache, [5, 6], [30, 31], 3)
        return cache

    # KV phase: leaf [3,4] (2 tokens, and its state 2). State phase: state 1, now on a
    # leaf, goes with its KV 10,11. Counted: 2 tokens, 1 state; freed: 4 tokens, 2 states.
    assert evict(build(), kv_tokens=1, states=1) == (2, 1, [12, 13, 10, 11], [2, 1])
    # the targeted evictions count the same way
    cache = build()
    node = {n.state: n for n in cache._nodes()}
    r = cache.evict_state_of(node[1])  # internal: tombstoned, its KV stays
    assert (r.kv_tokens, r.states, list(r.freed_kv), r.freed_states) == (0, 1, [], [1])
    r = cache.evict_leaf(node[2])  # the tombstone left childless goes too, and counts
    assert (r.kv_tokens, r.states, list(r.freed_kv), r.freed_states) == (
        4,
        0,
        [12, 13, 10, 11],
        [2],
    )
    r = cache.evict_state_of(node[3])  # a leaf: deleted with its KV, which is not counted
    assert (r.kv_tokens, r.states, list(r.freed_kv), r.freed_states) == (0, 1, [30, 31], [3])
    cache.check_invariants()
    # reset is no eviction: both counts 0, everything in the freed lists
    r = build().reset()
    assert (r.kv_tokens, r.states) == (0, 0)
    assert (sorted(r.freed_kv), sorted(r.freed_states)) == ([10, 11, 12, 13, 30, 31], [1, 2, 3])


def test_kv_eviction_cascades_through_childless_tombstones() -> None:
    """Deleting leaf [3,4] leaves tombstone [1,2] childless: it goes too, and its
    tokens count towards the KV freed."""
    cache = two_level()
    assert evict(cache, states=1) == (0, 1, [], [1])
    assert evict(cache, kv_tokens=1) == (4, 0, [12, 13, 10, 11], [2])
    assert cache.node_count() == 0 and sizes(cache) == (0, 0, 0, 0)


def test_kv_eviction_restarts_from_the_tail() -> None:
    """KV list, oldest first: c=[1,5] (leaf), p=[1] (parent of c), q=[2] (leaf).
    Deleting c makes p a leaf that is older than q, the next leaf found before the
    deletion, so eviction restarts from the tail and takes p, not q."""
    cache = MambaRadixCache()
    insert(cache, [1], [10], 1)  # p
    insert(cache, [1, 5], [10, 15], 3, prev=1)  # c
    assert match(cache, [1])[0] == 1  # p newer than c
    insert(cache, [2], [12], 2)  # q, newest
    assert evict(cache, kv_tokens=2) == (2, 0, [15, 10], [3, 1])
    assert match(cache, [2]) == (1, [12], 1, None)


def test_locked_path_survives_eviction() -> None:
    """Locking [1,2,3,4] protects 4 KV tokens and one state (not the state of its
    ancestor [1,2], which may be tombstoned); unlocking makes everything evictable."""
    cache = two_level()
    insert(cache, [5, 6], [30, 31], 3)
    receipt = cache.inc_lock_ref(cache.match_prefix([1, 2, 3, 4]).node)
    assert sizes(cache) == (2, 4, 2, 1)
    assert evict(cache, kv_tokens=100, states=100) == (2, 1, [30, 31], [3, 1])
    assert sizes(cache) == (0, 4, 0, 1)
    assert match(cache, [1, 2, 3, 4]) == (4, [10, 11, 12, 13], 4, None)
    cache.dec_lock_ref(receipt)
    assert sizes(cache) == (4, 0, 1, 0)
    assert evict(cache, kv_tokens=1) == (4, 0, [12, 13, 10, 11], [2])


def test_revival_on_a_locked_path_keeps_lock_accounting() -> None:
    """SGLang #27147: a receipt records what it locked. Tombstone [1,2], lock its
    child, revive [1,2]: the release must not touch [1,2]'s (never taken) state lock."""
    cache = two_level()
    evict(cache, states=1)
    receipt = cache.inc_lock_ref(cache.match_prefix([1, 2, 3, 4]).node)
    assert insert(cache, [1, 2], [10, 11], 7, prev=2) == (2, False, [])
    assert sizes(cache) == (0, 4, 1, 1)
    cache.dec_lock_ref(receipt)
    cache.check_invariants()
    assert sizes(cache) == (4, 0, 2, 0)


# --------------------------------------------------------- prev_prefix_len


@pytest.mark.parametrize(
    "prev,freed",
    [(0, [20, 21, 22, 23]), (1, [21, 22, 23]), (3, [23]), (4, []), (5, []), (6, [])],
)
def test_insert_hands_back_duplicates_from_prev_prefix_len(prev: int, freed: list[int]) -> None:
    """Tree [1,2] -> [3,4]; inserting [1..6] matches 4 tokens over two nodes: the
    caller's indices in [prev, 4) are duplicates handed back, [4, 6) are taken."""
    cache = two_level()
    kv = [20, 21, 22, 23, 24, 25]
    assert insert(cache, [1, 2, 3, 4, 5, 6], kv, 9, prev=prev) == (4, False, freed)
    assert sorted(cache.all_kv_indices()) == [10, 11, 12, 13, 24, 25]


# --------------------------------------------------------------------- reset


def test_reset_returns_everything() -> None:
    cache = two_level()
    insert(cache, [7, 8], [70, 71], 3, ns="lora")
    evict(cache, states=1)  # a tombstone: its KV must come back too
    receipt = cache.inc_lock_ref(cache.match_prefix([7, 8], extra_key="lora").node)
    with pytest.raises(RuntimeError, match="lock"):
        cache.reset()
    cache.dec_lock_ref(receipt)
    r = cache.reset()
    assert sorted(r.freed_kv) == [10, 11, 12, 13, 70, 71]
    assert sorted(r.freed_states) == [2, 3]
    assert (r.kv_tokens, r.states) == (0, 0)
    assert cache.node_count() == 0 and sizes(cache) == (0, 0, 0, 0)
    assert cache.all_kv_indices().tolist() == [] and cache.all_states() == []
    cache.check_invariants()
    assert insert(cache, [1, 2], [10, 11], 1) == (0, False, [])


# -------------------------------------------- identical prompt (#22935)


def test_identical_prompt_lookup_sglang_split_gives_zero_hit() -> None:
    """SGLang #22935: the scheduler looks up prompt[:-1]; the state sits at the prompt
    end, inside the matched edge. Upstream splits there, the new node has no state,
    the match collapses to the root: 0 hit, and the split stays."""
    prompt = [1, 2, 3, 4, 5, 6]
    cache = MambaRadixCache(chunk_size=4, compat="sglang-0.5.15.post1")
    insert(cache, prompt, [11, 12, 13, 14, 15, 16], 1)
    assert match(cache, prompt[:-1]) == (0, [], 5, 4)
    assert cache.node_count() == 2 and "tombstone" in cache.pretty()
    assert match(cache, prompt[:-1]) == (0, [], 5, 4)  # still 0 on every re-send
    cache.check_invariants()


def test_identical_prompt_lookup_default_no_split() -> None:
    """The default tree gives the same 0 hit for prompt[:-1] (the fix lives in the
    request lifecycle), but reports all 5 KV tokens and creates no node; the full
    prompt still matches."""
    prompt = [1, 2, 3, 4, 5, 6]
    cache = MambaRadixCache(chunk_size=4)
    insert(cache, prompt, [11, 12, 13, 14, 15, 16], 1)
    assert match(cache, prompt[:-1]) == (0, [], len(prompt) - 1, 4)
    assert cache.node_count() == 1 and "tombstone" not in cache.pretty()
    assert match(cache, prompt) == (6, [11, 12, 13, 14, 15, 16], 6, None)
