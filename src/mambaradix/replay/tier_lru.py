"""The lower tiers' byte LRUs, now below the replay (`lifecycle.tier_lru`), so that the
engine uses the same ones; re-exported here for the replay's callers."""

from __future__ import annotations

from mambaradix.lifecycle.tier_lru import ByteLRU, Entry, LowerTier

__all__ = ["ByteLRU", "Entry", "LowerTier"]
