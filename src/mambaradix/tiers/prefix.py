"""The longest usable prefix of a page-hash chain, from which objects a store holds.

Same rule as SGLang 0.5.23's ``HiCacheFile.batch_exists_v2`` (``hicache_storage.py:981-1033``)
and ``MooncakeStore.batch_exists_v2`` (``storage/mooncake_store/mooncake_store.py:1025-1102``):

* a prefix of ``p`` pages is a candidate when ``1 <= p <= anchor``; the anchor is the longest
  run of leading pages whose KV object exists when KV is one of the rules, else the whole chain
  (Mooncake's "logical anchor" when KV lives elsewhere, ``mooncake_store.py:1031-1034``);
* an ``ALL_PAGES`` pool keeps the candidates up to its first missing page;
* a ``TRAILING_PAGES`` pool keeps ``p`` when its objects at pages ``p-window .. p-1`` all
  exist: a recurrent state (window 1) is usable only at the page where it was stored, so the
  candidates can have holes;
* the answer is the largest candidate every pool keeps (0 when none).

Pure standard library.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from mambaradix.names import Names
from mambaradix.tiers.keys import KV, MAMBA, check_pool


class HitPolicy(Names):
    """Which pages of a prefix a pool must hold (SGLang's ``PoolHitPolicy``)."""

    ALL_PAGES = "all_pages"
    TRAILING_PAGES = "trailing_pages"


class PoolRule(NamedTuple):
    """A pool taking part in a prefix query and what it must hold."""

    pool: str
    policy: HitPolicy = HitPolicy.ALL_PAGES
    window: int = 1  # TRAILING_PAGES only: how many pages ending at the prefix's end


# KV on every page, the recurrent state at the prefix's last page (SGLang's Mamba rule,
# ``mooncake_store.py:869``: trailing window 1).
HYBRID_RULES = (PoolRule(KV), PoolRule(MAMBA, HitPolicy.TRAILING_PAGES, 1))


class PrefixHit(NamedTuple):
    """Result of a longest-prefix query (a snapshot: the store may change right after)."""

    pages: int  # the longest usable prefix, in pages
    restorable: tuple[int, ...]  # every usable prefix length, ascending
    pool_pages: tuple[tuple[str, int], ...]  # per pool: its own longest prefix (0 = none)


def check_rules(rules: Sequence[PoolRule]) -> tuple[PoolRule, ...]:
    """The rules as a tuple, or a one-line error naming the bad one."""
    if isinstance(rules, PoolRule) or not isinstance(rules, Sequence) or not rules:
        raise TypeError("rules must be a non-empty sequence of PoolRule")
    seen: set[str] = set()
    for i, rule in enumerate(rules):
        if not isinstance(rule, PoolRule):
            raise TypeError(f"rules[{i}] must be a PoolRule, got {type(rule).__name__}")
        check_pool(rule.pool, f"rules[{i}].pool")
        if not isinstance(rule.policy, HitPolicy):
            raise TypeError(f"rules[{i}].policy must be a HitPolicy, got {rule.policy!r}")
        if isinstance(rule.window, bool) or not isinstance(rule.window, int) or rule.window < 1:
            raise ValueError(f"rules[{i}].window must be a positive int, got {rule.window!r}")
        if rule.pool in seen:
            raise ValueError(f"rules[{i}].pool {rule.pool!r} appears twice")
        seen.add(rule.pool)
    return tuple(rules)


def usable_prefix(
    n_pages: int, present: Mapping[str, Sequence[bool]], rules: Sequence[PoolRule]
) -> PrefixHit:
    """The longest usable prefix, given per pool which of the chain's pages hold an object.

    `present[rule.pool][i]` tells whether page i's object of that pool exists.
    """
    anchor = n_pages
    if any(rule.pool == KV for rule in rules):
        anchor = _leading_run(present[KV], n_pages)
    restorable = set(range(1, anchor + 1))
    pool_pages = []
    for rule in rules:
        have = present[rule.pool]
        if rule.policy is HitPolicy.ALL_PAGES:
            keep = set(range(1, _leading_run(have, anchor) + 1))
        else:
            keep = {
                p
                for p in range(1, anchor + 1)
                if all(have[i] for i in range(max(0, p - rule.window), p))
            }
        pool_pages.append((rule.pool, max(keep, default=0)))
        restorable &= keep
    ordered = tuple(sorted(restorable))
    return PrefixHit(ordered[-1] if ordered else 0, ordered, tuple(pool_pages))


def _leading_run(flags: Sequence[bool], limit: int) -> int:
    for i in range(limit):
        if not flags[i]:
            return i
    return limit
