"""Multi-turn conversations driven by the engine's own answers.

A conversation is a list of user turns (token ids). Turn t's prompt is turn
t-1's prompt + the ENGINE's answer to it + turn t's user tokens, so a prefix
cache sees exactly the reuse a real chat server sees. (`mambaradix.compare`
takes sessions from the replay's bundled workloads.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mambaradix.engine.engine import Engine, Result

__all__ = [
    "ConversationRun",
    "request_sizes",
    "run_conversations",
]


@dataclass
class ConversationRun:
    """results[s][t]: session s, turn t. prompts likewise. seconds: wall time."""

    results: list[list[Result]] = field(default_factory=list)
    prompts: list[list[list[int]]] = field(default_factory=list)
    seconds: float = 0.0

    def output_ids(self) -> list[list[list[int]]]:
        return [[r.output_ids for r in turns] for turns in self.results]

    @property
    def num_requests(self) -> int:
        return sum(len(t) for t in self.results)


def run_conversations(
    engine: Engine,
    sessions: list[list[list[int]]],
    max_new_tokens: int,
    on_round: Callable[[int], None] | None = None,
) -> ConversationRun:
    """Serve every session turn by turn. Round t submits turn t of every
    session that has one in a single `generate` call (they interleave);
    sessions end independently. `on_round(n)` is called after each round
    with the number of requests it served (e.g. to advance a progress bar)."""
    run = ConversationRun(results=[[] for _ in sessions], prompts=[[] for _ in sessions])
    t0 = time.perf_counter()
    rounds = max((len(s) for s in sessions), default=0)
    for t in range(rounds):
        live = [s for s in range(len(sessions)) if t < len(sessions[s])]
        prompts = []
        for s in live:
            prev = run.prompts[s][-1] + run.results[s][-1].output_ids if t else []
            prompts.append(prev + list(sessions[s][t]))
        for s, p, r in zip(live, prompts, engine.generate(prompts, max_new_tokens), strict=True):
            run.prompts[s].append(p)
            run.results[s].append(r)
        if on_round is not None:
            on_round(len(prompts))
    run.seconds = time.perf_counter() - t0
    return run


def request_sizes(
    sessions: list[list[list[int]]], max_new_tokens: int
) -> list[tuple[int, int, int]]:
    """`(session, turn, prompt tokens)` of every request `run_conversations`
    will make: turn t's prompt holds the previous prompt, the engine's answer
    to it (exactly `max_new_tokens`: decoding is greedy with no stop token)
    and turn t's user tokens."""
    out = []
    for s, users in enumerate(sessions):
        prompt = 0
        for t, user in enumerate(users):
            prompt += len(user) + (max_new_tokens if t else 0)
            out.append((s, t, prompt))
    return out
