"""Hit density: how many hits per unit of time a cached item can expect, by
class and age, learned online (the estimator of LHD, Beckmann et al., NSDI'18).

An item's life in a class is a segment: it starts when the item is cached, hit,
or changes class, and ends with a hit, an eviction, or a change of class. Ages
are whole ticks of a clock. The estimator keeps, per class, how many segments
ended at each age (exact up to 8, then 4 bins per octave), and how many of
them by a hit, and answers for an item of class c at age a

    density(c, a) = hits_c(>= a) / life_c(>= a),
    life_c(>= a) = sum over segments that ended at x >= a of (x - a + 1/2):

the hits it can still expect in this segment per tick it will still hold its
place. Sparse data is shrunk, by `prior` segments' worth of time, towards the
class's density over all ages (itself shrunk towards optimism, `_target`)
times m / (m + a), m the mean segment length: where a class has no data at
an age, its older items are worth less, as recency says. With no data at all
the answer is 1 / (1 + a).
"""

from __future__ import annotations

import math
from collections.abc import Hashable

from mambaradix.policies import constants as C

EXACT = C.AGE_EXACT  # ages below this have a bin each
PER_OCTAVE = C.AGE_BINS_PER_OCTAVE
BINS = EXACT + PER_OCTAVE * 24  # up to ages of EXACT * 2**24 ticks


def age_bin(age: int) -> int:
    if age < EXACT:
        return max(0, age)
    return min(BINS - 1, EXACT + int(PER_OCTAVE * math.log2(age / EXACT)))


def _bin_age(j: int) -> float:
    """A bin's representative age (exact, or the geometric middle)."""
    if j < EXACT:
        return float(j)
    return EXACT * 2 ** ((j - EXACT + 0.5) / PER_OCTAVE)


BIN_AGE = [_bin_age(j) for j in range(BINS)]

Suffix = tuple[list[float], list[float], list[float]]


class _Histogram:
    __slots__ = ("hits", "ends", "snap", "top")

    def __init__(self) -> None:
        self.hits = [0.0] * BINS
        self.ends = [0.0] * BINS  # every end, hits included
        self.snap: Suffix = ([0.0] * (BINS + 1), [0.0] * (BINS + 1), [0.0] * (BINS + 1))
        self.top = -1  # the highest bin changed since the last snapshot

    def add(self, j: int, hit: bool) -> None:
        self.ends[j] += 1
        if hit:
            self.hits[j] += 1
        if j > self.top:
            self.top = j

    def snapshot(self) -> None:
        """Per bin b: hits, ends, and sum of (bin age + 1/2) x ends over bins
        >= b; what `at` answers from until the next snapshot. Sums above the
        highest bin changed since the last one are still right: only those below
        it are summed again (the same additions, so the same floats)."""
        h, n, r = self.snap
        hits, ends = self.hits, self.ends
        for j in range(self.top, -1, -1):
            h[j] = h[j + 1] + hits[j]
            n[j] = n[j + 1] + ends[j]
            r[j] = r[j + 1] + (BIN_AGE[j] + 0.5) * ends[j]
        self.top = -1

    def at(self, age: int) -> tuple[float, float]:
        """(hits, life) of the segments still to end for an item at `age`."""
        h, n, r = self.snap
        b = age_bin(age)
        return h[b], max(r[b] - age * n[b], 0.5 * n[b])


class HitDensity:
    """Per-class hit-density estimates (see the module docstring). Answers
    count the segments recorded before the last `tick()`."""

    def __init__(self, prior: float) -> None:
        self.prior = prior
        self.classes: dict[Hashable, _Histogram] = {}
        self.pooled = _Histogram()
        self._overall: dict[Hashable, float] = {}  # class -> density over all ages
        self._memo: dict[tuple[Hashable, int], float] = {}  # this tick's answers
        self._changed: set[_Histogram] = set()  # refreshed at the next tick
        self._mean = 1.0  # the mean segment length, in ticks
        self._weight = 0.0  # `prior` segments' worth of ticks

    def record(self, cls: Hashable, age: int, hit: bool) -> None:
        """A segment of class `cls` ended at `age` ticks, by a hit or not."""
        j = age_bin(age)
        hist = self.classes.setdefault(cls, _Histogram())
        hist.add(j, hit)
        self.pooled.add(j, hit)
        self._changed.update((hist, self.pooled))

    def tick(self) -> None:
        self._overall.clear()
        self._memo.clear()
        for hist in self._changed:
            hist.snapshot()
        self._changed.clear()
        h, n, r = self.pooled.snap
        self._mean = r[0] / n[0] if n[0] else 1.0
        self._weight = self.prior * self._mean

    def _target(self, cls: Hashable) -> float:
        """The class's density over all ages, shrunk towards optimism: `prior`
        segments of the average length that each end in a hit (a class with
        no evidence is tried, and its own data soon outweighs the prior)."""
        rate = self._overall.get(cls)
        if rate is None:
            hist = self.classes.get(cls)
            h, life = hist.at(0) if hist is not None else (0.0, 0.0)
            rate = (h + self.prior) / (life + self._weight) if life + self._weight > 0 else 1.0
            self._overall[cls] = rate
        return rate

    def density(self, cls: Hashable, age: int) -> float:
        key = (cls, age)
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self._density(cls, age)
        return got

    def _density(self, cls: Hashable, age: int) -> float:
        if not self.pooled.snap[1][0]:
            return 1.0 / (1.0 + age)
        hist = self.classes.get(cls)
        h, life = hist.at(age) if hist is not None else (0.0, 0.0)
        w, mean = self._weight, self._mean
        prior = self._target(cls) * mean / (mean + age)  # fades with age, as recency
        if life + w <= 0:
            return prior
        return (h + w * prior) / (life + w)
