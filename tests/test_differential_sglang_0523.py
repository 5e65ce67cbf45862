"""compat="sglang-0.5.23" makes the same decisions as SGLang 0.5.23's own ``UnifiedRadixCache``.

Every result is compared after every operation of seeded streams (``differential``): matched
lengths, indices, branching lengths and full KV hits; inserts' prefix lengths, existing states
and freed duplicates; evictions' counts and freed KV and states, driven both as upstream's
``evict`` (counts) and as its allocation-driven ``evict_for_alloc`` (to an availability target)
against our ``evict`` of the same amount; the four size counters. Upstream's ``sanity_check``
and our ``check_invariants`` run every 97 operations.

Upstream runs with both of its tree cores: the Python ``UnifiedTreeCore`` and the compiled
Rust core (SGLang's default backend), loaded from the wheel's extension.
"""

from __future__ import annotations

import pytest

from differential import run_differential
from mambaradix import MambaRadixCache
from upstream_unified import BACKENDS, RUST_SO, UpstreamUnifiedCache, load_unified

# (page_size, chunk_size, seeds, ops per seed). Page > 1 is extra_buffer (0.5.23 requires it).
QUICK = [(1, 64, [0], 800), (1, 8, [1], 800), (4, 8, [2], 600), (16, 16, [3], 400)]
SLOW = [
    (1, 64, range(10, 14), 15_000),
    (1, 8, range(20, 23), 10_000),
    (4, 8, range(30, 33), 8_000),
    (2, 16, range(40, 42), 6_000),
    (16, 64, range(50, 52), 5_000),
]


def _run(
    page_size: int, chunk_size: int, seeds: list[int] | range, n_ops: int, backend: str = "python"
) -> None:
    for seed in seeds:
        ours = MambaRadixCache(page_size=page_size, chunk_size=chunk_size, compat="sglang-0.5.23")
        theirs = UpstreamUnifiedCache(page_size=page_size, chunk_size=chunk_size, backend=backend)
        counts = run_differential(
            ours, theirs, seed, n_ops, page_size, check_every=97, unified=True
        )
        assert min(counts.values()) > n_ops // 60, counts  # every kind of op was exercised
        ours.check_invariants()


@pytest.mark.parametrize("page_size,chunk_size,seeds,n_ops", QUICK)
def test_same_decisions_as_sglang_0523(
    page_size: int, chunk_size: int, seeds: list[int], n_ops: int
) -> None:
    _run(page_size, chunk_size, seeds, n_ops)


@pytest.mark.parametrize("page_size,chunk_size,seeds,n_ops", QUICK)
def test_same_decisions_as_sglang_0523_rust_core(
    page_size: int, chunk_size: int, seeds: list[int], n_ops: int
) -> None:
    """The same streams against SGLang's compiled Rust tree core (its default backend), loaded
    from the wheel's extension (``upstream_unified.load_rust_core``)."""
    _run(page_size, chunk_size, seeds, n_ops, backend="rust")


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size,chunk_size,seeds,n_ops", SLOW)
def test_same_decisions_as_sglang_0523_long(
    page_size: int, chunk_size: int, seeds: range, n_ops: int, backend: str
) -> None:
    _run(page_size, chunk_size, seeds, n_ops, backend)


def test_slow_tier_covers_1e5_operations() -> None:
    assert sum(len(seeds) * n for _, _, seeds, n in SLOW) >= 100_000


def test_a_kv_only_leaf_survives_and_is_evicted_by_recency() -> None:
    """The rule that changed (hand-built): a leaf's deletion keeps its state-less parent as a
    KV-only leaf, which later KV eviction takes by last access, on both sides."""
    for tree in (
        MambaRadixCache(page_size=1, chunk_size=64, compat="sglang-0.5.23"),
        UpstreamUnifiedCache(page_size=1, chunk_size=64),
        UpstreamUnifiedCache(page_size=1, chunk_size=64, backend="rust"),
    ):
        tree.insert([1, 2, 3, 4], [10, 11, 12, 13], 0)
        tree.insert([1, 2, 5, 6], [10, 11, 22, 23], 1, prev_prefix_len=2)  # splits [1, 2]
        tree.insert([7, 8], [30, 31], 2)
        # State 0 is the least recently used: its leaf goes, [1, 2] keeps a child.
        got = tree.evict(states=1)
        assert (got.kv_tokens, got.states, list(got.freed_kv)) == (2, 1, [12, 13])
        tree.match_prefix([7, 8])  # refresh [7, 8]
        # State 1's leaf [5, 6] goes; its parent [1, 2] (no state) stays as a KV-only leaf,
        # older than [7, 8]: the next token of KV eviction takes it, not [7, 8].
        got = tree.evict(states=1)
        assert (got.kv_tokens, got.states, list(got.freed_kv)) == (2, 1, [22, 23])
        assert tree.full_evictable_size() == 4  # [1, 2] and [7, 8]
        got = tree.evict(kv_tokens=1)
        assert (got.kv_tokens, got.states, list(got.freed_kv)) == (2, 0, [10, 11])
        assert tree.match_prefix([7, 8, 9]).prefix_len == 2


def test_a_branching_point_only_past_the_matched_state() -> None:
    """0.5.23 reports a branching point only past the matched state (hand-built): states at 64
    and 100, a key leaving the second edge at 90: the chunk-aligned KV hit is 64, the matched
    state is at 64, so none (0.5.15.post1 and ours report 64)."""
    key = list(range(100))
    probe = key[:90] + [999, 998]
    for tree in (
        MambaRadixCache(page_size=1, chunk_size=64, compat="sglang-0.5.23"),
        UpstreamUnifiedCache(page_size=1, chunk_size=64),
        UpstreamUnifiedCache(page_size=1, chunk_size=64, backend="rust"),
    ):
        tree.insert(key[:64], range(1000, 1064), 0)
        tree.insert(key, range(1000, 1100), 1, prev_prefix_len=64)
        got = tree.match_prefix(probe)
        assert (got.prefix_len, got.kv_hit_len, got.branching_len) == (64, 90, None)
    older = MambaRadixCache(page_size=1, chunk_size=64, compat="sglang-0.5.15.post1")
    older.insert(key[:64], range(1000, 1064), 0)
    older.insert(key, range(1000, 1100), 1, prev_prefix_len=64)
    assert older.match_prefix(probe).branching_len == 64


def test_the_rust_core_is_the_wheels_compiled_extension() -> None:
    """The Rust side runs the wheel's own binary (no fallback to the Python core): its core is
    the wheel's adapter over a binding object of the extracted ``.so``."""
    tree = UpstreamUnifiedCache(page_size=1, chunk_size=64, backend="rust")
    binding_module = tree.core._bindings  # what the adapter's `extension.bindings` gave it
    assert type(tree.core).__name__ == "RustUnifiedTreeCore"
    assert isinstance(tree.core._binding, binding_module.RustUnifiedTreeCoreBinding)
    assert binding_module.__file__ == str(load_unified().root / RUST_SO)
    assert binding_module.__file__.endswith(".cpython-311-x86_64-linux-gnu.so")
    python_core = UpstreamUnifiedCache(page_size=1, chunk_size=64).core
    assert type(python_core).__name__ == "UnifiedTreeCore"
    with pytest.raises(ValueError, match="backend"):
        UpstreamUnifiedCache(backend="c++")
