"""Our keys and longest-prefix rule against SGLang 0.5.23's own code, run from its wheel.

* Object names and the prefix rule: SGLang's ``HiCacheFile.batch_exists_v2`` reads the
  directory our ``FileStore`` wrote (it looks objects up by its own names), and its answer
  must equal our ``longest_prefix`` on the same directory, for random presence patterns.
* Page hashes: SGLang's C++ hash extension compiled from the wheel (slow: one g++ build).
"""

from __future__ import annotations

import os
import random

import pytest

import upstream_hicache as upstream
from mambaradix.tiers import (
    HYBRID_RULES,
    KV,
    MAMBA,
    FileStore,
    HitPolicy,
    Namespace,
    ObjectKey,
    PoolRule,
    page_hashes,
)


def _touch(store: FileStore, key: ObjectKey) -> None:
    """An object that exists (empty: both sides only test existence here)."""
    open(os.path.join(store.root, store.namespace.object_name(key) + ".bin"), "wb").close()


def _upstream_answer(hc: object, chain: list[str], rules: tuple[PoolRule, ...]) -> tuple:
    hs = upstream.hicache_storage()
    transfers = [
        hs.PoolTransfer(
            name=r.pool,
            keys=chain[-r.window:] if r.policy is HitPolicy.TRAILING_PAGES else list(chain),
            hit_policy=hs.PoolHitPolicy(r.policy.value),
        )
        for r in rules if r.pool != KV
    ]
    res = hc.batch_exists_v2(chain, transfers)  # type: ignore[attr-defined]
    # kv_hit_pages is the usable prefix; extra_pool_hit_pages holds each pool's own (KV too)
    hits = {str(pool): pages for pool, pages in res.extra_pool_hit_pages.items()}
    return res.kv_hit_pages, tuple(res.restorable_prefix_pages), hits


@pytest.mark.parametrize(("model", "tp_rank", "tp_size"), [
    ("nvidia/NVIDIA-Nemotron-H-8B-Base-8K", 0, 1), ("Qwen/Qwen3-Next-80B-A3B", 1, 2),
])
def test_prefix_and_names_match_hicache_file(tmp_path, model, tp_rank, tp_size):
    rng = random.Random(17 + tp_rank)
    rule_sets = [
        HYBRID_RULES,
        (PoolRule(KV), PoolRule(MAMBA, HitPolicy.TRAILING_PAGES, 2)),
        (PoolRule(KV), PoolRule("indexer"), PoolRule(MAMBA, HitPolicy.TRAILING_PAGES, 1)),
    ]
    for case in range(60):
        root = tmp_path / f"c{case}"
        store = FileStore(root, Namespace(model, tp_rank, tp_size))
        hc = upstream.hicache_file(str(root), model, tp_rank, tp_size)
        n = rng.randint(1, 10)
        chain = page_hashes([rng.randrange(50_000) for _ in range(n * 4)], 4)
        rules = rule_sets[case % len(rule_sets)]
        density = rng.choice([0.5, 0.8, 0.95])
        for h in chain:
            for rule in rules:
                if rng.random() < density:
                    _touch(store, ObjectKey(h, rule.pool))
        ours = store.longest_prefix(chain, rules)
        pages, restorable, pool_hits = _upstream_answer(hc, chain, rules)
        assert (ours.pages, ours.restorable) == (pages, restorable), (case, ours, restorable)
        for pool, hit in pool_hits.items():  # upstream lists the pools with a hit > 0
            assert dict(ours.pool_pages)[pool] == hit, (case, pool)
        mine = {pool: hit for pool, hit in ours.pool_pages if hit}
        assert set(pool_hits) <= set(mine), (case, pool_hits, mine)


def test_real_objects_are_found_by_hicache_file(tmp_path):
    """Objects written by a real put (framed bytes, fsync, rename) are upstream-visible."""
    model = "nvidia/NVIDIA-Nemotron-H-8B-Base-8K"
    store = FileStore(tmp_path, Namespace(model))
    chain = page_hashes(list(range(64)), 16)  # 4 pages
    store.put([(ObjectKey(h, KV), {"kv": b"k" * 64}) for h in chain[:3]])
    store.put([(ObjectKey(chain[1], MAMBA), {"conv": b"c" * 8, "ssm": b"s" * 32})])
    pages, restorable, hits = _upstream_answer(upstream.hicache_file(str(tmp_path), model),
                                               chain, HYBRID_RULES)
    assert (pages, restorable, hits) == (2, (2,), {KV: 3, MAMBA: 2})  # state ends page 1
    assert store.longest_prefix(chain, HYBRID_RULES).restorable == (2,)


def test_namespace_suffix_is_hicache_files(tmp_path):
    hc = upstream.hicache_file(str(tmp_path), "org/model-x", 3, 4)
    assert Namespace("org/model-x", 3, 4).suffix == hc.tp_config_suffix


@pytest.mark.slow
def test_page_hashes_match_sglang_native_hash():
    """Random chains, page sizes, wide tokens and priors against the compiled upstream."""
    rng = random.Random(5)
    for _ in range(300):
        n = rng.randint(0, 70)
        top = rng.choice([2**15, 2**32 - 1, 2**40, 2**63 - 1])
        tokens = [rng.randint(0, top) if rng.random() < 0.1 else rng.randrange(2**17)
                  for _ in range(n)]
        page = rng.choice([1, 2, 3, 16, 64])
        prior = rng.choice([None, os.urandom(32).hex()])
        assert page_hashes(tokens, page, prior) == upstream.upstream_page_hashes(
            tokens, page, prior
        ), (tokens, page, prior)
