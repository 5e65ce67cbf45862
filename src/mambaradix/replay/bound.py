"""The ideal bound: unlimited memory and a state at every position.

A request can then reuse its longest common prefix with any earlier request's
prompt and output, capped at input - 1 (one token is always computed for
logits). Computed with the core tree itself: inserting every sequence with a
state at its end and reading `kv_hit_len` (the KV matched at any position).
"""

from __future__ import annotations

from mambaradix.core.tree import MambaRadixCache
from mambaradix.replay.progress import track
from mambaradix.replay.trace import Trace


def bound_hit_tokens(trace: Trace) -> list[int]:
    """Per request (in arrival order), the tokens an ideal cache would reuse."""
    tree = MambaRadixCache(page_size=1, chunk_size=1)
    unit, out, next_kv = trace.unit_tokens, [], 0
    for i, r in enumerate(track(trace.requests, "bound", len(trace), " requests")):
        m = tree.match_prefix(r.input_units[:-1]).kv_hit_len
        out.append(min(m * unit, r.input_tokens - 1) if m else 0)
        seq = r.input_units + r.output_units
        # KV indices are irrelevant here, but the tree refuses one it already holds.
        tree.insert(seq, range(next_kv, next_kv + len(seq)), state=i)
        next_kv += len(seq)
    return out


def bound_token_hit_rate(trace: Trace) -> float:
    """Over all the trace's prompt tokens."""
    hits = bound_hit_tokens(trace)
    return sum(hits) / max(1, trace.prompt_tokens)
