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
# Ours. Set on `bench/evaluate.py --material tuning` only (the synthetic
# generators at seeds 100-104, chitchat conversations 300-599), never on the
# evaluation's traces or seeds. Each number and each rule has an ablation row
# in the evaluation (`mambaradix.policies.mambaradix.ABLATIONS`).

DENSITY_PRIOR = 1.0
"""Segments' worth of evidence that a class's estimate is shrunk by: towards
its own rate over all ages, that towards optimism (a segment of average
length that ends in a hit), faded with age as recency
(`density.HitDensity`). Ablation `mambaradix/without-prior` (0: each class
on its own data alone)."""

AGE_EXACT = 8
AGE_BINS_PER_OCTAVE = 4
"""The age profile's resolution: ages below AGE_EXACT ticks each have a bin,
then AGE_BINS_PER_OCTAVE bins per doubling. Ablation `mambaradix/without-age`
(no age profile: one density per class)."""

RANK_SAMPLE = 64
"""Eviction ranks every evictable state when there are at most this many, else
a seeded random sample of this many (LHD's sample size). Ablation
`mambaradix/without-sampling` (rank them all)."""

RANK_SEED = 0
"""Seed of that sample (runs are reproducible)."""

# Rules, each with its ablation:
#   classes      density per (kind, covered, reused), not one for all states
#                (mambaradix/without-classes)
#   sizes        value per byte freed, not per state (mambaradix/without-size)
#   admission    a checkpoint that would displace a state is taken only if
#                worth more (mambaradix/without-admission: always taken)
#   prompt ends  input - 1 is a candidate checkpoint
#                (mambaradix/without-prompt-ends)
#   free pass    with split pools a free state slot admits without comparing
#                (mambaradix/without-free-pass: always compare)
#   room         one budget, nothing in flight: states go to admit a request that
#                hits a state and would be dropped (mambaradix/without-room)
#   queue        a state a waiting request would hit holds at least 1 / (its place in
#                the queue) hits per tick (mambaradix/without-queue)
