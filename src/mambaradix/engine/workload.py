"""Multi-turn conversations driven by the engine's own answers.

A conversation is a list of user turns (token ids). Turn t's prompt is turn
t-1's prompt + the ENGINE's answer to it + turn t's user tokens, so a prefix
cache sees exactly the reuse a real chat server sees. `mt_bench_sessions`
takes the user turns from the bundled MT-Bench trace (Mistral token ids mapped
into the model's vocabulary with `id % vocab_size`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mambaradix.engine.engine import Engine, Result

__all__ = [
    "ConversationRun",
    "compare_cache",
    "mt_bench_sessions",
    "run_conversations",
    "trace_sessions",
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
    engine: Engine, sessions: list[list[list[int]]], max_new_tokens: int
) -> ConversationRun:
    """Serve every session turn by turn. Round t submits turn t of every
    session that has one in a single `generate` call (they interleave);
    sessions end independently."""
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
    run.seconds = time.perf_counter() - t0
    return run


def trace_sessions(
    workload: str, vocab_size: int, limit: int | None = None
) -> list[list[list[int]]]:
    """User turns of a bundled multi-turn workload (e.g. "mt-bench", which
    needs the `text` extra), sessions in order of first appearance, ids mapped
    `% vocab_size`. Turn t > 0's user tokens are what its trace prompt adds
    after the previous prompt and the previous (trace) answer."""
    from mambaradix.replay.workloads import load

    by_session: dict[object, list[tuple[int, list[int], list[int]]]] = {}
    for r in load(workload).requests:
        by_session.setdefault(r.session_id, []).append(
            (r.turn_id, list(r.input_units), list(r.output_units))
        )
    sessions: list[list[list[int]]] = []
    for turns in by_session.values():
        turns.sort(key=lambda x: x[0])
        users: list[list[int]] = []
        prev: list[int] = []
        for _, inp, out in turns:
            if inp[: len(prev)] != prev:
                raise ValueError(f"{workload}: a turn does not extend the previous turn")
            users.append([t % vocab_size for t in inp[len(prev) :]])
            prev = inp + out
        sessions.append(users)
        if limit is not None and len(sessions) >= limit:
            break
    return sessions


def mt_bench_sessions(vocab_size: int, limit: int | None = None) -> list[list[list[int]]]:
    """`trace_sessions("mt-bench", ...)`: 80 questions x 2 turns."""
    return trace_sessions("mt-bench", vocab_size, limit)


def compare_cache(
    sessions: list[list[list[int]]],
    max_new_tokens: int,
    model: str = "nemotron-h-tiny",
    seed: int = 0,
    **engine_kw: Any,
) -> dict[str, Any]:
    """Serve `sessions` with the cache on and off (same model weights) and
    summarise: identical outputs, token counts, hit rate, timings."""
    from mambaradix.engine.engine import Engine

    out: dict[str, Any] = {}
    runs: dict[str, ConversationRun] = {}
    net = None
    for label, on in (("cache", True), ("no cache", False)):
        eng = Engine(model=model, seed=seed, prefix_cache=on, net=net, **engine_kw)
        net = eng.net
        runs[label] = run = run_conversations(eng, sessions, max_new_tokens)
        eng.check()
        s = eng.stats()
        flat = [r for turns in run.results for r in turns]
        ttft = sorted(r.ttft_s for r in flat)
        out[label] = {
            **s,
            "seconds": run.seconds,
            "requests_per_s": run.num_requests / run.seconds if run.seconds else 0.0,
            "s_per_request": run.seconds / run.num_requests if run.num_requests else 0.0,
            "mean_ttft_s": sum(ttft) / len(ttft) if ttft else 0.0,
            "p50_ttft_s": ttft[len(ttft) // 2] if ttft else 0.0,
        }
    out["identical"] = runs["cache"].output_ids() == runs["no cache"].output_ids()
    out["requests"] = runs["cache"].num_requests
    kv_tokens = engine_kw.get("kv_tokens", 65536)
    state_slots = engine_kw.get("state_slots", 64)
    out["replay"] = replay_prediction(runs["cache"], kv_tokens, state_slots)
    return out


def replay_prediction(run: ConversationRun, kv_tokens: int, state_slots: int) -> dict[str, float]:
    """What `mambaradix replay` predicts for the same requests and pool sizes:
    the engine's own prompts and answers as a token trace (round t of every
    session at t * 1000 s), replayed with the `mambaradix` policy through pools
    of exactly `kv_tokens` KV tokens and `state_slots` states (a profile of one
    byte per KV token and one byte per state makes the GB budget exact)."""
    from array import array

    from mambaradix.replay.bound import bound_token_hit_rate
    from mambaradix.replay.models import ModelProfile
    from mambaradix.replay.run import replay
    from mambaradix.replay.sim import ServingConfig
    from mambaradix.replay.trace import Trace, TraceRequest

    reqs = [
        TraceRequest(
            s,
            t,
            t * 1000.0 + s * 1e-3,
            array("q", p),
            array("q", r.output_ids),
            len(p),
            len(r.output_ids),
        )
        for s, (prompts, results) in enumerate(zip(run.prompts, run.results, strict=True))
        for t, (p, r) in enumerate(zip(prompts, results, strict=True))
    ]
    trace = Trace("engine-run", reqs)
    profile = ModelProfile(
        name="unit",
        source="one byte per KV token and per state",
        kv_bytes_per_token=1,
        state_bytes=1,
        linear_flops_per_token=1,
        attn_flops_per_pair=1,
    )
    total = kv_tokens + state_slots
    cfg = ServingConfig(
        memory_gb=total / 1e9, state_fraction=(state_slots + 0.5) / total, max_running=8
    )
    r = replay(trace, profile, "mambaradix", cfg)
    return {
        "token_hit_rate": float(r["token_hit_rate"]),
        "bound_token_hit_rate": bound_token_hit_rate(trace),
    }
