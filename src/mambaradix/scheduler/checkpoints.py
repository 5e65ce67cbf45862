"""Where a request's recurrent state is checkpointed into the tree.

A `CheckpointPolicy` answers the scheduler's questions; the scheduler and the
cache manager do the rest. Two policies ship here (the replay's baselines and
our own policy live in `mambaradix.replay.policies`):

    SGLangCheckpoints   SGLang 0.5.15.post1: a checkpoint at every prefill
                        chunk end (cache_unfinished_req when a chunk is
                        stashed), at the prompt end when the request goes on
                        decoding, and at finish (cache_finished_req)
    DefaultCheckpoints  ours: chunk ends and finish as SGLang, plus the branch
                        point (where the prompt leaves the cached KV, so the
                        next request sharing this prefix hits) and input - 1
                        instead of the prompt end (an identical re-sent prompt
                        then hits, SGLang #22935)

Two hooks every policy has (no-ops in `SGLangCheckpoints`, which policies extend):
``before_match(req)``, called before a waiting request is looked up (its match may
allocate), and ``on_abort(req)``, called before a request that was looked up gives
everything back unfinished: refused after its match, retracted or dropped. A policy
that wraps another passes both on.

With the `extra_buffer` strategy the positions come from the tracking rule
(chunk-aligned, in the strategy), so `stops` is not consulted; `cache_at`
still decides whether a tracked state is kept at a chunk end.
"""

from __future__ import annotations

from typing import Protocol

from mambaradix.core.node import TreeNode
from mambaradix.lifecycle import Request

CHUNK, STOP, PROMPT_END, DECODED, FINISH = "chunk", "stop", "prompt_end", "decoded", "finish"


class CheckpointPolicy(Protocol):
    """Decisions the scheduler asks for; every method is called between forwards."""

    decode_interval: int | None
    """no_buffer: also checkpoint after a decode step when the length is a
    multiple of this (kind DECODED); None for never."""

    def stops(self, req: Request) -> list[int]:
        """After admission: positions (> req.computed, < req.total_len) at which
        the prefill must stop to checkpoint (no_buffer strategy)."""
        ...

    def cache_at(self, req: Request, kind: str) -> bool:
        """Checkpoint now, at req.computed? kind: CHUNK (a chunk ended there),
        STOP (a planned stop), PROMPT_END (the prompt is done, decoding goes on)."""
        ...

    def insert_at_finish(self, req: Request) -> bool:
        """Cache the finished sequence (its state at the end)?"""
        ...

    def on_admitted(self, req: Request) -> None:
        """The request matched `req.node` (`req.cached_len` tokens) and was admitted."""
        ...

    def on_cached(self, req: Request, node: TreeNode | None, kind: str) -> None:
        """A checkpoint of kind CHUNK / STOP / PROMPT_END / FINISH was taken;
        `node` holds the state (None if the tree already had one there)."""
        ...

    def before_match(self, req: Request) -> None:
        """`req` is about to be looked up (its match may allocate: vLLM pins blocks)."""
        ...

    def on_abort(self, req: Request) -> None:
        """`req`, looked up, gives everything back unfinished (refused after its
        match, retracted or dropped)."""
        ...


class SGLangCheckpoints:
    """SGLang 0.5.15.post1's checkpoints (see the module docstring)."""

    decode_interval: int | None = None

    def stops(self, req: Request) -> list[int]:
        return []

    def cache_at(self, req: Request, kind: str) -> bool:
        return True

    def insert_at_finish(self, req: Request) -> bool:
        return True

    def on_admitted(self, req: Request) -> None:
        pass

    def on_cached(self, req: Request, node: TreeNode | None, kind: str) -> None:
        pass

    def before_match(self, req: Request) -> None:
        pass

    def on_abort(self, req: Request) -> None:
        pass


class DefaultCheckpoints(SGLangCheckpoints):
    """Ours (see the module docstring): branch point and input - 1 stops."""

    def stops(self, req: Request) -> list[int]:
        end = req.total_len - 1
        out = {end} if end > req.computed else set()
        if req.computed < req.kv_hit_len < end:
            out.add(req.kv_hit_len)
        return sorted(out)

    def cache_at(self, req: Request, kind: str) -> bool:
        return kind != PROMPT_END  # input - 1 is already cached
