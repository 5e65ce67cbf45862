"""`explain`: why each request of a replay hit short of the ideal bound.

One replay is run with observers on its tree and scheduler (`observe`); at each
request's admission they read how far its prompt was held by what (`Seen`),
and `attribute` splits the gap between the bound and the hit into categories
that add up to it exactly. `ideal` computes the bound's structure as
`replay.bound` does. See docs/explain.md.
"""

from __future__ import annotations

from mambaradix.replay.explain.attribute import CATEGORIES, Seen
from mambaradix.replay.explain.ideal import Ideal, ideal
from mambaradix.replay.explain.records import Explanation, RequestGap
from mambaradix.replay.explain.run import explain

__all__ = [
    "CATEGORIES",
    "Explanation",
    "Ideal",
    "RequestGap",
    "Seen",
    "explain",
    "ideal",
]
