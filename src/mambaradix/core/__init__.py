"""The radix tree core: pure Python, standard library only."""

from mambaradix.core.results import EvictResult, InsertResult, MatchResult
from mambaradix.core.tree import LockReceipt, MambaRadixCache

__all__ = ["MambaRadixCache", "LockReceipt", "MatchResult", "InsertResult", "EvictResult"]
