"""compat="sglang-0.5.15.post1" makes the same decisions as SGLang 0.5.15.post1's own class.

Every result is compared after every operation: matched lengths and indices,
branching lengths, freed KV and states, evicted counts, the four size counters.
"""

from __future__ import annotations

import pytest

from differential import run_differential
from mambaradix import MambaRadixCache
from upstream_sglang import UpstreamCache

# (page_size, chunk_size, seeds, ops per seed): 10**5+ operations in total.
CONFIGS = [
    (1, 64, range(0, 4), 15_000),
    (1, 8, range(10, 13), 10_000),
    (4, 8, range(20, 23), 8_000),
    (2, 16, range(30, 32), 6_000),
]


@pytest.mark.parametrize(
    "page_size,chunk_size,seeds,n_ops",
    # the first two (90,000 operations) in the slow tier, the others by default
    [*(pytest.param(*c, marks=pytest.mark.slow) for c in CONFIGS[:2]), *CONFIGS[2:]],
)
def test_same_decisions_as_sglang(
    page_size: int, chunk_size: int, seeds: range, n_ops: int
) -> None:
    total = 0
    for seed in seeds:
        ours = MambaRadixCache(
            page_size=page_size, chunk_size=chunk_size, compat="sglang-0.5.15.post1"
        )
        theirs = UpstreamCache(page_size=page_size, chunk_size=chunk_size)
        counts = run_differential(ours, theirs, seed, n_ops, page_size, check_every=97)
        assert min(counts.values()) > n_ops // 50, counts  # every kind of op was exercised
        ours.check_invariants()
        total += n_ops
    assert total >= 12_000


def test_total_operations_cover_1e5() -> None:
    assert sum(len(seeds) * n for _, _, seeds, n in CONFIGS) >= 100_000
