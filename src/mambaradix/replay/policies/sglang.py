"""SGLang's policies: 0.5.15.post1 in both of its strategies, and 0.5.16+."""

from __future__ import annotations

from mambaradix.replay.policies.base import Policy


class SGLang(Policy):
    """SGLang 0.5.15.post1, no_buffer: a state at every prefill chunk end and at
    the prompt end (cache_unfinished_req), and at finish (cache_finished_req);
    the tree's LRU, refreshing the matched path (compat tree); SGLang's
    scheduler rules (state head-room, eviction amounts)."""

    name = "sglang"
    compat: str | None = "sglang"
    sglang_rules = True


class SGLangExtraBuffer(SGLang):
    """SGLang 0.5.15.post1's default strategy for Nemotron-H and Qwen3-Next (a
    default deployment runs it): extra_buffer, ping-pong track slots, states
    only at tracked positions (chunk-aligned prefill positions, the branching
    point, every track_interval while decoding). Departure: its overlap
    scheduler (on by default with extra_buffer) processes a step's results
    while the next step runs; the replay's loop is the non-overlap one, so
    finished requests are cached and freed one step earlier than there. The
    two track slots per request are the overlap default's."""

    name = "sglang-extra-buffer"
    strategy = "extra_buffer"


class SGLangUsed(SGLang):
    """SGLang 0.5.16+: the same checkpoints; a match refreshes only the state it
    uses (#31643). Departure: our tree's read-only match also never splits an
    edge on lookup (0.5.16 still does)."""

    name = "sglang-used"
    compat = None
