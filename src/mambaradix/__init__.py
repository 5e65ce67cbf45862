"""mambaradix: prefix caching for hybrid attention + recurrent-state LLMs."""

from mambaradix.core import EvictResult, InsertResult, LockReceipt, MambaRadixCache, MatchResult

__all__ = ["MambaRadixCache", "LockReceipt", "MatchResult", "InsertResult", "EvictResult"]
__version__ = "0.1.0"
