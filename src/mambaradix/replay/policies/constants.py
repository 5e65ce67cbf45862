"""Every constant of every replay policy, in one place.

Each entry says what it is, where its value comes from (an upstream's code,
or the material it was tuned on) and, for our own policy, which ablation row
of `bench/evaluate.py` shows the result without it. Nothing here was tuned on
the evaluation's traces or seeds.
"""

from __future__ import annotations

# --------------------------------------------------------------------- Marconi
# Upstream values (github.com/ruipeterpan/marconi, the paper's section 4).

MARCONI_ALPHAS: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 4.0)
"""The alphas Marconi's tuner replays (upstream: 0, 0.1, ..., 2.0; fewer here
for speed, the upper end wider)."""

MARCONI_BOOTSTRAP = 5
"""Tune after this many times the requests seen before the first eviction
(upstream `bootstrap_multiplier` default 5)."""

MARCONI_TUNING_WINDOW = 1000
"""Requests the tuner replays per alpha (the most recent ones)."""

MARCONI_EVICT_BATCH = 0.01
"""Share of a pool one utility ranking frees (ours, for speed: upstream ranks
once per eviction)."""

ORACLE_ALPHAS: tuple[float, ...] = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
"""`marconi-oracle`: each alpha a full run, the best token hit rate kept."""

# ------------------------------------------------------------------ mambaradix
# Ours. Tuned only on `bench/evaluate.py --material tuning` (synthetic seeds
# 100-104, chitchat conversations 300-599); each has an ablation row.

DENSITY_PRIOR = 1.0
"""Segments' worth of the pooled (all classes) age profile added to each
class's own, so a class with little data starts from the average
(ablation `mambaradix/without-prior`)."""

RANK_SAMPLE = 64
"""Eviction ranks every evictable state when there are at most this many, else
a seeded random sample of this many (LHD's sample size)."""

RANK_SEED = 0
"""Seed of that sample (runs are reproducible)."""
