"""The gap to the bound, split into categories that add up exactly.

A request's gap is `bound - hit` prompt tokens. Between the two lie positions
of its prompt (trace units), each an answer to "how far could the match have
gone if this one thing had not happened?". Sorted from the bound down to the
hit, they form a staircase; each step is one category, so the steps add up to
the gap by construction (a telescoping sum), token for token.

The levels (positions along the prompt, trace units), from the top; each is
the longest prefix with its property or with a property of a level below it:

    bound       shared with an earlier request's prompt and answer (the ideal,
                `replay.bound`)
    reach       ... as far as any cache of this engine holds it: without the
                source answer's last token (its KV is never computed) and a
                page's partial tail
    session     held by a request that had ended, or by its own session's
                earlier turn still in flight
    ended       held by a request that had ended (finished or dropped)
    elsewhere   held by a tree, or carried by a finished request, on any instance
    here        ... on this instance
    refused     covered by a checkpoint this tree held or its policy refused
    ever_state  covered by a state this tree held at some time
    kept_kv     ... whose KV is still cached
    ever_below  ... covered by a state this instance's lower tiers (host, store)
                held at some time
    state_below ... held there still (every group of it)
    lower_tier  ... usable from them when the request was looked up: its state
                (every group) and the KV of every unit to it on the device or
                below (`replay.tiered`'s candidates)
    recompute   ... and the load-or-recompute rule chose not to load that deep
    failed      the depth the rule chose to load, when the load failed
    hit         what the request hit (a prefix loaded from below is hit)

The first three come from the trace; the others were recorded during the run,
up to the request's (last) admission; the five tier levels are the hit when
no tier is configured. Each step between two levels is one category:

    unreachable        bound -> reach
    in_flight          reach -> session      (concurrency: its source still ran,
                                              waited, or was not yet released)
    session_in_flight  session -> ended      (its own previous turn still ran)
    source_dropped     ended -> elsewhere
    other_instance     elsewhere -> here     (routing)
    no_checkpoint      here -> refused       (no state kept: grid, retention)
    admission_refused  refused -> ever_state
    kv_evicted         ever_state -> kept_kv
    state_evicted      kept_kv -> ever_below (its KV stayed: a tombstone)
    tier_dropped       ever_below -> state_below (the state fell out of the
                                              last tier)
    tier_kv_dropped    state_below -> lower_tier (the state is below, but KV
                                              before it fell out of the last tier)
    lower_tier         lower_tier -> recompute (usable below, loaded, and yet
                                              not hit: a safety net, 0 in every
                                              run tested)
    recompute_chosen   recompute -> failed   (usable below, the rule judged
                                              recomputing cheaper)
    load_failed        failed -> hit         (the rule chose to load it, the load
                                              failed: no device memory, or the
                                              room it made evicted part of the
                                              prefix)

The levels are computed bottom up, each the larger of the level below it and
its own position capped at `reach`, so every step is >= 0. A hit above
`reach` (from a source the bound does not count: a later request of the trace
served earlier, or the request's own work before a retraction) leaves one
negative step instead, `beyond_bound`. A dropped request's whole
bound is `dropped`. Tokens come from positions by the replay's own rule
(`Units.hit_tokens`: min(units x unit tokens, prompt - 1)), which is monotone,
so the token steps telescope too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from mambaradix.names import Names


class Category(Names):
    """Where a request's gap to the bound went (the module docstring), from the bound
    down to the hit; the members between `UNREACHABLE` and `BEYOND_BOUND` are the steps
    of the staircase, in its order."""

    DROPPED = "dropped"
    UNREACHABLE = "unreachable"
    IN_FLIGHT = "in_flight"
    SESSION_IN_FLIGHT = "session_in_flight"
    SOURCE_DROPPED = "source_dropped"
    OTHER_INSTANCE = "other_instance"
    NO_CHECKPOINT = "no_checkpoint"
    ADMISSION_REFUSED = "admission_refused"
    KV_EVICTED = "kv_evicted"
    STATE_EVICTED = "state_evicted"
    TIER_DROPPED = "tier_dropped"
    TIER_KV_DROPPED = "tier_kv_dropped"
    LOWER_TIER = "lower_tier"
    RECOMPUTE_CHOSEN = "recompute_chosen"
    LOAD_FAILED = "load_failed"
    BEYOND_BOUND = "beyond_bound"


CATEGORIES = tuple(Category)
"""Every category, from the bound down to the hit (see the module docstring)."""


class Seen(NamedTuple):
    """Raw positions (trace units along the request's prompt) recorded at its
    admission, each the longest prefix with the property (0 for none)."""

    session: int  # held by its session's earlier turn, not yet ended
    ended: int  # held by a request that had ended (finished or dropped)
    elsewhere: int  # held or finished on any instance
    here: int  # held by this tree, or finished on this instance
    refused: int  # the deepest checkpoint the policy's admission refused
    ever_state: int  # the deepest state this tree ever held
    kept_kv: int  # the deepest state ever held whose KV is still cached
    ever_below: int  # the deepest state a lower tier held at some time (no tier: 0)
    state_below: int  # ... and holds at the admission (no tier: 0)
    lower_tier: int  # the deepest prefix a load could have restored (no tier: 0)
    recompute: int  # that prefix, when the rule chose not to load it (else 0)
    failed: int  # the depth the rule chose, when its load failed (else 0)


NOTHING_SEEN = Seen(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)


def staircase(reach: int, hit: int, seen: Seen) -> tuple[int, ...]:
    """The fourteen levels from `reach` down to `hit` (module docstring), bottom
    up: each the larger of the level below it and its raw position capped at
    `reach`. With `hit >= reach` every level below `reach` is `hit`."""
    if hit >= reach:
        return (reach,) + (hit,) * 13
    levels = [hit]
    for raw in (
        seen.failed,
        seen.recompute,
        seen.lower_tier,
        seen.state_below,
        seen.ever_below,
        seen.kept_kv,
        seen.ever_state,
        seen.refused,
        seen.here,
        seen.elsewhere,
        seen.ended,
        seen.session,
    ):
        levels.append(max(levels[-1], min(raw, reach)))
    levels.append(reach)
    return tuple(reversed(levels))


def categories(
    bound: int, reach: int, hit: int, seen: Seen, tokens: Callable[[int], int]
) -> dict[str, int]:
    """Tokens per category for a served request; they add up to
    `tokens(bound) - tokens(hit)` (`tokens`: prompt tokens of a prefix of so
    many units, nondecreasing)."""
    levels = staircase(reach, hit, seen)
    t = [tokens(u) for u in levels]
    out: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
    out[Category.UNREACHABLE] = tokens(bound) - t[0]
    if hit >= reach:
        out[Category.BEYOND_BOUND] = t[0] - tokens(hit)
        return out
    names = CATEGORIES[2:-1]  # IN_FLIGHT .. LOAD_FAILED: the staircase's steps
    for name, upper, lower in zip(names, t[:-1], t[1:], strict=True):
        out[name] = upper - lower
    return out


def dropped(bound_tokens: int) -> dict[str, int]:
    """A request that was never served: its whole bound."""
    out: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
    out[Category.DROPPED] = bound_tokens
    return out
