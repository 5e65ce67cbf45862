"""The engine next to the replay (a module above both: the engine never
imports the replay).

    engine_sessions(workload, vocab)   user turns of a bundled multi-turn workload
    compare_cache(sessions, ...)       the engine with the cache on and off
    engine_trace(run)                  an engine run as a replay trace
    replay_prediction(run, engine)     what `mambaradix replay` predicts for the
                                       same requests, pools and policy (a fresh
                                       copy of the engine's own), per request
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mambaradix.results import FLAT, JsonResult, json_key

if TYPE_CHECKING:
    from mambaradix.engine import Engine
    from mambaradix.engine.results import EngineStats
    from mambaradix.engine.workload import ConversationRun
    from mambaradix.geometry.profile import ModelProfile
    from mambaradix.policies import Policy
    from mambaradix.replay.trace import Trace

ROUND_GAP_S = 1e6  # round t arrives at t * ROUND_GAP_S: after round t - 1 finished


def engine_sessions(
    workload: str, vocab_size: int, limit: int | None = None
) -> list[list[list[int]]]:
    """User turns of a bundled token-level multi-turn workload (e.g. "mt-bench",
    which needs the `text` extra), sessions in order of first appearance, ids
    mapped `% vocab_size`. Turn t > 0's user tokens are what its trace prompt
    adds after the previous prompt and the previous (trace) answer."""
    from mambaradix.replay.workloads import load

    trace = load(workload)
    if trace.unit_tokens != 1:
        raise ValueError(
            f"{workload} is a block-level trace (units of {trace.unit_tokens} tokens, hash ids, "
            "no token ids): the engine needs token-level text workloads such as mt-bench"
        )
    by_session: dict[object, list[tuple[int, list[int], list[int]]]] = {}
    for r in trace.requests:
        by_session.setdefault(r.session_id, []).append(
            (r.turn_id, list(r.input_units), list(r.output_units))
        )
    sessions: list[list[list[int]]] = []
    for turns in by_session.values():
        sessions.append(_user_turns(workload, turns, vocab_size))
        if limit is not None and len(sessions) >= limit:
            break
    return sessions


def _user_turns(
    workload: str, turns: list[tuple[int, list[int], list[int]]], vocab: int
) -> list[list[int]]:
    turns.sort(key=lambda x: x[0])
    users: list[list[int]] = []
    prev: list[int] = []
    for _, inp, out in turns:
        if inp[: len(prev)] != prev:
            raise ValueError(f"{workload}: a turn does not extend the previous turn")
        users.append([t % vocab for t in inp[len(prev) :]])
        prev = inp + out
    return users


def engine_trace(run: ConversationRun) -> Trace:
    """The engine's own prompts and answers as a token trace: round t of every
    session arrives at t * ROUND_GAP_S, in session order (as `run_conversations`
    submits them)."""
    from mambaradix.replay.trace import Trace, TraceRequest

    reqs = [
        TraceRequest(
            s,
            t,
            t * ROUND_GAP_S,
            array("q", p),
            array("q", r.output_ids),
            len(p),
            len(r.output_ids),
        )
        for t in range(max((len(x) for x in run.prompts), default=0))
        for s, (prompts, results) in enumerate(zip(run.prompts, run.results, strict=True))
        if t < len(prompts)
        for p, r in [(prompts[t], results[t])]
    ]
    return Trace("engine-run", reqs)


def replay_prediction(
    run: ConversationRun,
    engine: Engine,
    policy: Policy | None = None,
    profile: ModelProfile | None = None,
) -> list[int]:
    """Cached tokens per request (session-major, turn order) that the replay
    predicts for this engine run: same prompts and answers, same pool sizes,
    chunk size, page size, running limit, strategy and policy (default: a fresh
    copy of the engine's own, `Engine.fresh_policy`), attached to the same model
    profile (default: the engine's, `Engine.profile`)."""
    from mambaradix.replay.serving import ServingConfig, ServingModel

    trace = engine_trace(run)
    mgr, sched = engine.mgr, engine.scheduler.config
    unit = engine.profile if profile is None else profile
    policy = engine.fresh_policy() if policy is None else policy
    cfg = ServingConfig(
        memory_gb=1.0,
        chunk_tokens=sched.chunk_tokens or 1 << 40,
        max_running=sched.max_running,
        page_size=mgr.page_size,
        track_interval=sched.track_interval,
        kv_units=mgr.kv.capacity,
        state_slots=mgr.slots.capacity,
        open_loop=True,  # the engine submits each round at its time (`ROUND_GAP_S`)
    )
    model = ServingModel(trace, unit, policy, cfg)
    model.run()
    by_request = {o.request: o.cached_units for o in model.outcomes}
    order = sorted(range(len(trace)), key=lambda i: (trace.requests[i].session_id, i))
    return [by_request.get(i, 0) for i in order]


def compare_cache(
    sessions: list[list[list[int]]],
    max_new_tokens: int,
    model: str = "nemotron-h-tiny",
    seed: int = 0,
    on_round: Callable[[int], None] | None = None,
    net: Any = None,
    **engine_kw: Any,
) -> CompareResult:
    """Serve `sessions` with the cache on and off (same model weights: `net`,
    or the one the first engine builds) and
    summarise: identical outputs, token counts, hit rate, timings, and the
    replay's prediction for the cached run (None for a deterministic engine:
    the replay does not cut prefills on its grid). `on_round(n)`: called after each
    round of either run with its number of requests (a progress bar).
    ValueError unless max_new_tokens >= 1."""
    from mambaradix.engine import Engine
    from mambaradix.engine.workload import run_conversations
    from mambaradix.replay.bound import bound_token_hit_rate
    from mambaradix.validate import as_positive

    as_positive(max_new_tokens, "max_new_tokens")  # 0 would run and count nothing
    runs: dict[str, ConversationRun] = {}
    engines: dict[str, Engine] = {}
    summaries: dict[str, RunSummary] = {}
    for label, on in (("cache", True), ("no cache", False)):
        eng = Engine(model=model, seed=seed, prefix_cache=on, net=net, **engine_kw)
        net, engines[label] = eng.net, eng
        runs[label] = run = run_conversations(eng, sessions, max_new_tokens, on_round)
        eng.check()
        summaries[label] = _summary(eng, run)
    cached, prompt = engines["cache"], summaries["cache"].stats.prompt_tokens
    predicted_rate = None  # the replay does not model the deterministic grid
    if not cached.deterministic:
        predicted = replay_prediction(runs["cache"], cached)
        predicted_rate = sum(predicted) / prompt if prompt else 0.0
    return CompareResult(
        cache=summaries["cache"],
        no_cache=summaries["no cache"],
        identical=runs["cache"].output_ids() == runs["no cache"].output_ids(),
        requests=runs["cache"].num_requests,
        replay=ReplayCheck(predicted_rate, bound_token_hit_rate(engine_trace(runs["cache"]))),
    )


def _summary(eng: Engine, run: ConversationRun) -> RunSummary:
    flat = [r for turns in run.results for r in turns]
    ttft = sorted(r.ttft_s for r in flat)
    n = run.num_requests
    return RunSummary(
        stats=eng.stats(),
        seconds=run.seconds,
        requests_per_s=n / run.seconds if run.seconds else 0.0,
        s_per_request=run.seconds / n if n else 0.0,
        mean_ttft_s=sum(ttft) / len(ttft) if ttft else 0.0,
        p50_ttft_s=ttft[len(ttft) // 2] if ttft else 0.0,
    )


@dataclass(frozen=True, eq=False)
class RunSummary(JsonResult):
    """One run of `compare_cache`: the engine's counters, then its wall time, requests
    per second, seconds per request and mean and median TTFT."""

    stats: EngineStats = field(metadata=FLAT)
    seconds: float
    requests_per_s: float
    s_per_request: float
    mean_ttft_s: float
    p50_ttft_s: float


@dataclass(frozen=True, eq=False)
class ReplayCheck(JsonResult):
    """The replay's token hit rate for the cached run (None for a deterministic
    engine: the replay does not cut prefills on its grid), and the trace's bound."""

    token_hit_rate: float | None
    bound_token_hit_rate: float


@dataclass(frozen=True, eq=False)
class CompareResult(JsonResult):
    """`compare_cache`'s result: each run's summary (JSON keys "cache" and "no cache"),
    whether the outputs are identical, the requests of one run and the replay's
    prediction. Attribute access is the typed way to read it; it is also the read-only
    mapping over its JSON keys (`mambaradix.results`)."""

    cache: RunSummary
    no_cache: RunSummary = field(metadata=json_key("no cache"))
    identical: bool
    requests: int
    replay: ReplayCheck
