"""mambaradix: prefix caching for hybrid attention + recurrent-state LLMs."""

from mambaradix import _build

# Before the core's first import: its compiled build if built from today's source and
# MAMBARADIX_PURE is unset, else the pure-Python modules (mambaradix/_build.py).
BUILD = _build.install()

from mambaradix.core import (  # noqa: E402
    EvictResult,
    InsertResult,
    LockReceipt,
    MambaRadixCache,
    MatchResult,
)

__all__ = ["BUILD", "MambaRadixCache", "LockReceipt", "MatchResult", "InsertResult", "EvictResult"]
__version__ = "0.1.0"
