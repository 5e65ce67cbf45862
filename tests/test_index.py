"""Indexer: KV overlap, usable prefix and tail per worker, from hand-built event streams.

Block size 2 throughout; a worker's block hashes are arbitrary names (the indexer keys
blocks by their tokens and uses hashes only to find parents and removals)."""

from __future__ import annotations

import pytest

from mambaradix.events import AllBlocksCleared, BlockRemoved, BlockStored
from mambaradix.events.model import DISK, HOST
from mambaradix.index import Indexer, Overlap


def kv(hashes: list[int], parent: int | None, tokens: list[int], **kw: object) -> BlockStored:
    return BlockStored(tuple(hashes), parent, tokens, 2, **kw)  # type: ignore[arg-type]


def state(h: int, tokens: list[int]) -> BlockStored:
    return BlockStored((h,), None, tokens, 2, 1, "mamba")


PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # four full blocks and a token


def test_overlap_usable_and_tail() -> None:
    ix = Indexer(2)
    ix.apply(7, [kv([10, 11, 12], None, [1, 2, 3, 4, 5, 6]), state(11, [3, 4])])
    assert ix.query(PROMPT) == {7: Overlap(6, 4, 2)}
    ix.apply(7, [state(12, [5, 6])])
    assert ix.query(PROMPT) == {7: Overlap(6, 6, 0)}
    ix.apply(7, [BlockRemoved((12,), 1)])  # the state goes, its KV stays
    assert ix.query(PROMPT) == {7: Overlap(6, 4, 2)}
    ix.apply(7, [BlockRemoved((11,))])  # a hole: KV stops at block 0, so do states
    assert ix.query(PROMPT) == {7: Overlap(2, 0, 2)}


def test_usable_leaves_one_token_to_prefill() -> None:
    ix = Indexer(2)
    ix.apply(0, [kv([1, 2], None, [1, 2, 3, 4]), state(1, [1, 2]), state(2, [3, 4])])
    assert ix.query([1, 2, 3, 4]) == {0: Overlap(4, 2, 2)}  # a state at 4 needs 5 tokens
    assert ix.query([1, 2, 3, 4, 0]) == {0: Overlap(4, 4, 0)}
    assert ix.query([1, 2, 3]) == {0: Overlap(2, 2, 0)}
    assert ix.query([]) == {0: Overlap(0, 0, 0)}


def test_workers_share_blocks_and_differ_in_states() -> None:
    ix = Indexer(2)
    ix.apply(1, [kv([100, 101], None, [1, 2, 3, 4]), state(101, [3, 4])])
    ix.apply(2, [kv([7, 8, 9], None, [1, 2, 3, 4, 5, 6]), state(7, [1, 2])])
    ix.apply(3, [kv([5], None, [9, 9])])
    assert ix.query(PROMPT) == {1: Overlap(4, 4, 0), 2: Overlap(6, 2, 4), 3: Overlap(0, 0, 0)}
    ix.apply(2, [AllBlocksCleared()])
    assert ix.query(PROMPT)[2] == Overlap(0, 0, 0)
    assert ix.query(PROMPT)[1] == Overlap(4, 4, 0)


def test_a_state_announced_before_its_kv_counts_once_the_kv_comes() -> None:
    ix = Indexer(2)
    ix.apply(0, [state(1, [1, 2])])
    assert ix.query(PROMPT) == {0: Overlap(0, 0, 0)}
    ix.apply(0, [kv([1], None, [1, 2])])
    assert ix.query(PROMPT) == {0: Overlap(2, 2, 0)}


def test_a_block_whose_parent_was_never_stored_is_not_credited() -> None:
    ix = Indexer(2)
    ix.apply(0, [kv([2], 1, [3, 4]), state(2, [3, 4])])
    assert ix.query([3, 4, 5]) == {0: Overlap(0, 0, 0)}  # not placed at the root either
    assert ix.worker_info(0)["skipped"] == {"parent never stored": 1}
    assert ix.worker_info(0)["blocks"] == 0


def test_what_does_not_count() -> None:
    ix = Indexer(2)
    ix.apply(
        0,
        [
            BlockStored((1,), None, [1, 2], 4),  # another block size
            kv([2], None, [1, 2], medium="CPU_PINNED"),  # not on the device
            kv([3], None, [1, 2], group=2, kind="sliding_window"),  # not the whole prefix
            kv([4], None, [1, 2], group=3, kind=None),  # a group never described
        ],
    )
    assert ix.query(PROMPT) == {0: Overlap(0, 0, 0)}
    assert sum(ix.worker_info(0)["skipped"].values()) == 4


def test_namespaced_blocks_are_skipped_and_counted() -> None:
    """A LoRA or salted block's hashes depend on more than its tokens: a query by token
    ids must not be credited with it (it would be, keyed by tokens alone)."""
    ix = Indexer(2)
    ix.apply(0, [kv([1], None, [1, 2], namespace="lora"), kv([2], None, [1, 2])])
    ix.apply(1, [kv([1, 2], None, [1, 2, 3, 4], namespace="cache_salt")])
    assert ix.query(PROMPT) == {0: Overlap(2, 0, 2), 1: Overlap(0, 0, 0)}
    assert ix.worker_info(0)["skipped"] == {"namespaced (lora)": 1}
    assert ix.worker_info(1)["skipped"] == {"namespaced (cache_salt)": 1}


def test_lookahead_blocks_count_only_where_the_prompt_goes_on_with_their_lookahead() -> None:
    """vLLM 0.33 with EAGLE hashes each block with the token after it
    (`lookahead_token_ids`): block [1, 2] stored with lookahead [3] is not reused by a
    prompt [1, 2, 9, ...]. Worked out by hand per prompt."""
    ix = Indexer(2)
    ix.apply(0, [kv([1, 2], None, [1, 2, 3, 4], lookahead=((3,), (5,))), state(2, [3, 4])])
    ix.apply(0, [state(1, [1, 2])])
    assert ix.query([1, 2, 3, 4, 5]) == {0: Overlap(4, 4, 0)}
    assert ix.query([1, 2, 3, 4, 6]) == {0: Overlap(2, 2, 0)}  # block 2 wants a 5 after it
    assert ix.query([1, 2, 3, 4]) == {0: Overlap(2, 2, 0)}  # nothing after block 2
    assert ix.query([1, 2, 9]) == {0: Overlap(0, 0, 0)}
    ix.apply(0, [kv([7], None, [1, 2], lookahead=((9,),))])  # the same block, another hash
    assert ix.query([1, 2, 9]) == {0: Overlap(2, 2, 0)}
    assert ix.query([1, 2, 3, 4, 5]) == {0: Overlap(4, 4, 0)}  # both continuations count
    ix.apply(0, [BlockRemoved((7,))])
    assert ix.query([1, 2, 9]) == {0: Overlap(0, 0, 0)}
    ix.apply(1, [kv([1, 2], None, [1, 2, 3, 4])])  # a worker without lookahead hashes
    assert ix.query([1, 2, 3, 4, 6])[1] == Overlap(4, 0, 4)


def test_lower_tiers_are_kept_per_medium_not_credited() -> None:
    ix = Indexer(2)
    ix.apply(
        0,
        [
            kv([1, 2], None, [1, 2, 3, 4], medium=HOST),
            BlockStored((2,), 1, [3, 4], 2, 1, "mamba", HOST),
            BlockStored((3, 4), None, [], 0, 0, "full_attention", DISK),  # an offload placeholder
            kv([5], None, [1, 2]),  # on the device
        ],
    )
    assert ix.query(PROMPT) == {0: Overlap(2, 0, 2)}  # the device's block alone, for now
    assert ix.worker_info(0)["media"] == {"host": {"kv": 2, "state": 1}, "disk": {"kv": 2}}
    ix.apply(0, [BlockRemoved((1,), 0, HOST), BlockRemoved((2,), 7, HOST)])  # 7: unknown group
    assert ix.worker_info(0)["media"] == {"disk": {"kv": 2}}
    ix.apply(0, [AllBlocksCleared()])
    assert ix.worker_info(0)["media"] == {} and ix.worker_info(0)["skipped"] == {}


def test_removals_follow_the_group_kind_learned_from_stores() -> None:
    ix = Indexer(2)
    ix.apply(0, [kv([1, 2], None, [1, 2, 3, 4], group=1, kind="mla_attention")])
    ix.apply(0, [BlockStored((2,), 1, [3, 4], 2, 0, "mamba")])  # states in group 0 here
    assert ix.query(PROMPT) == {0: Overlap(4, 4, 0)}
    ix.apply(0, [BlockRemoved((2,), 0)])  # group 0 is the state group: KV stays
    assert ix.query(PROMPT) == {0: Overlap(4, 0, 4)}
    ix.apply(0, [BlockRemoved((2,), 5)])  # an unknown group: drop KV and state, to be safe
    assert ix.query(PROMPT) == {0: Overlap(2, 0, 2)}


def test_attention_only_worker_reuses_any_block_end() -> None:
    ix = Indexer(2)
    ix.add_worker(4, hybrid=False)
    ix.apply(4, [kv([1, 2], None, [1, 2, 3, 4])])
    assert ix.query([1, 2, 3, 4]) == {4: Overlap(4, 2, 2)}
    assert ix.query(PROMPT) == {4: Overlap(4, 4, 0)}


def test_dump_rebuilds_the_worker() -> None:
    ix = Indexer(2)
    ix.apply(0, [kv([1, 2, 3], None, [1, 2, 3, 4, 5, 6]), state(2, [3, 4])])
    ix.apply(0, [kv([9], 1, [7, 7]), BlockRemoved((3,))])
    fresh = Indexer(2)
    fresh.apply(5, ix.dump(0))
    for q in (PROMPT, [1, 2, 7, 7, 0], [1, 2, 3, 4, 5, 6, 0]):
        assert fresh.query(q)[5] == ix.query(q)[0]


def test_removing_a_worker_prunes_its_blocks() -> None:
    ix = Indexer(2)
    ix.apply(0, [kv([1, 2], None, [1, 2, 3, 4])])
    ix.remove_worker(0)
    assert ix.query(PROMPT) == {} and ix.worker_ids() == []
    assert not ix._root.children


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="block_size"):
        Indexer(0)
    ix = Indexer(2)
    with pytest.raises(ValueError, match="worker_id"):
        ix.add_worker(-1)
    ix.add_worker(1)
    with pytest.raises(ValueError, match="already"):
        ix.add_worker(1)
    with pytest.raises(TypeError, match="token_ids"):
        ix.query(["a"])
    with pytest.raises(KeyError):
        ix.dump(2)
    ix.apply(1, [kv([1], None, [1, "x"])])  # a bad event from a caller is skipped, not raised
    assert ix.worker_info(1)["skipped"] == {"token_ids not int64": 1}


def test_bad_calls_name_the_parameter_and_change_nothing() -> None:
    with pytest.raises(TypeError, match="hybrid"):
        Indexer(2, hybrid="no")  # type: ignore[arg-type]
    ix = Indexer(2)
    with pytest.raises(TypeError, match="hybrid"):
        ix.add_worker(1, hybrid="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="events"):
        ix.apply(2, None)  # type: ignore[arg-type]
    assert ix.worker_ids() == []  # neither call registered a worker
    for prompt in ({1: 2, 3: 4}, {1, 2}):
        with pytest.raises(TypeError, match="token_ids"):
            ix.query(prompt)


def test_a_bytes_prompt_is_its_byte_values() -> None:
    ix = Indexer(2)
    ix.apply(1, [kv([1, 2], None, [1, 2, 3, 4])])
    want = Overlap(4, 0, 4)  # by hand: both blocks held, no state
    assert ix.query(bytes([1, 2, 3, 4, 5]))[1] == want
    assert ix.query(bytearray([1, 2, 3, 4, 5]))[1] == want


def test_one_block_under_two_hashes() -> None:
    """vLLM names a block by its tokens and extra keys (an image's hash): one parent and
    the same tokens can come under two hashes. The block is held until both are removed."""
    ix = Indexer(2)
    ix.apply(1, [kv([10], None, [1, 2]), kv([11], 10, [3, 4]), kv([12], 10, [3, 4])])
    ix.apply(1, [BlockRemoved((11,))])
    assert ix.query(PROMPT)[1].longest_matched == 4  # still held under 12
    ix.apply(1, [BlockRemoved((12,))])
    assert ix.query(PROMPT)[1].longest_matched == 2
    ix.apply(1, [kv([13], 10, [3, 4]), kv([14], 10, [3, 4])])
    ix.clear_worker(1)  # each trie node dropped once
    assert ix.query(PROMPT)[1].longest_matched == 0
    ix.apply(1, [kv([10], None, [1, 2]), kv([11], 10, [3, 4]), kv([12], 10, [3, 4])])
    ix.apply(1, [kv([11], None, [5, 6])])  # 11 now names another block: 12 still holds [3, 4]
    assert ix.query(PROMPT)[1].longest_matched == 4
    ix.apply(1, [BlockRemoved((12,)), BlockRemoved((10,))])
    assert ix.query(PROMPT)[1].longest_matched == 0
    assert ix.query([5, 6, 0])[1].longest_matched == 2
