"""Seeded synthetic token-level workloads for tests and parameter sweeps.

* `shared_prefix`: single-turn requests of tenants that share system prompts;
* `multi_turn`: chat sessions, each prompt = previous prompt + answer + new
  user message;
* `agent_loop`: agent sessions (prompt = history of actions and tool results)
  where some calls re-run an earlier call's prompt and the session continues
  from that branch with a different continuation.

Token ids are drawn uniformly from `[1000, 32768)` (a 32k vocabulary without
its control-token range). Sizes are `(low, high)` ranges, both inclusive, drawn
uniformly. A seed fixes everything: same arguments -> identical trace.
"""

from __future__ import annotations

import random
from array import array

from mambaradix.validate import as_count, as_int, as_positive, as_real

from ..trace import Trace, TraceRequest
from .arrivals import Process, chain_times, start_times

VOCAB = (1000, 32768)
Range = tuple[int, int]
_IDS = range(*VOCAB)


class _Tokens:
    """Seeded random token blocks."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def size(self, r: Range) -> int:
        lo, hi = r
        if not 0 <= lo <= hi:
            raise ValueError(f"bad size range {r}: need 0 <= low <= high")
        return self.rng.randint(lo, hi)

    def block(self, n: int) -> array[int]:
        return array("q", self.rng.choices(_IDS, k=n))

    def sized(self, r: Range) -> array[int]:
        return self.block(self.size(r))


def _check(
    seed: object,
    counts: dict[str, object],
    reals: dict[str, tuple[object, float, bool]],
    ranges: dict[str, object],
) -> None:
    """TypeError / ValueError naming the first bad parameter, before any work:
    an int seed (a float or a string would silently seed another trace), counts
    >= 0, finite reals above their low end (open when the flag is set), and
    `(low, high)` int ranges with 0 <= low <= high."""
    as_int(seed, "seed")
    for name, n in counts.items():
        as_count(n, name)
    for name, (x, low, low_open) in reals.items():
        as_real(x, name, low=low, low_open=low_open)
    for name, r in ranges.items():
        if not isinstance(r, tuple) or len(r) != 2:
            raise TypeError(f"{name} must be a (low, high) pair of ints, got {r!r}")
        lo, hi = as_int(r[0], f"{name}[0]"), as_int(r[1], f"{name}[1]")
        if not 0 <= lo <= hi:
            raise ValueError(f"{name} must have 0 <= low <= high, got {r}")


def _trace(name: str, requests: list[TraceRequest], meta: dict[str, object]) -> Trace:
    return Trace(name, requests, unit_tokens=1, source="synthetic (mambaradix)", meta=meta)


def shared_prefix(
    *,
    requests: int = 200,
    tenants: int = 4,
    system_tokens: Range = (1024, 2048),
    question_tokens: Range = (64, 512),
    output_tokens: Range = (32, 256),
    tenant_skew: float = 1.0,
    rate: float = 2.0,
    arrival: Process = "poisson",
    seed: int = 0,
) -> Trace:
    """Single-turn requests: a tenant's system prompt + a fresh question.

    Tenant i is picked with weight `1 / (i + 1) ** tenant_skew` (0 = uniform).
    Session id = request index. Arrivals at `rate` per second.
    """
    _check(
        seed,
        {"requests": requests},
        {"tenant_skew": (tenant_skew, 0.0, False), "rate": (rate, 0.0, True)},
        {
            "system_tokens": system_tokens,
            "question_tokens": question_tokens,
            "output_tokens": output_tokens,
        },
    )
    as_positive(tenants, "tenants")
    rng = random.Random(f"shared-prefix:{seed}")
    tok = _Tokens(rng)
    systems = [tok.sized(system_tokens) for _ in range(tenants)]
    weights = [1.0 / (i + 1) ** tenant_skew for i in range(tenants)]
    out = []
    for i, ts in enumerate(start_times(requests, rate, rng, arrival)):
        t = rng.choices(range(tenants), weights)[0]
        inp = systems[t] + tok.sized(question_tokens)
        if not inp:
            inp = tok.block(1)
        ans = tok.sized(output_tokens)
        out.append(TraceRequest(i, 0, ts, inp, ans, len(inp), len(ans)))
    return _trace("synthetic-shared-prefix", out, {"seed": seed, "tenants": tenants})


def multi_turn(
    *,
    sessions: int = 32,
    turns: Range = (2, 8),
    system_tokens: Range = (256, 1024),
    shared_system: bool = True,
    user_tokens: Range = (32, 256),
    output_tokens: Range = (32, 256),
    session_rate: float = 0.5,
    arrival: Process = "poisson",
    think_time_s: float = 10.0,
    decode_tps: float = 50.0,
    seed: int = 0,
) -> Trace:
    """Chat sessions: turn k+1's prompt = turn k's prompt + answer + user message.

    With `shared_system`, all sessions start with one system prompt. Sessions
    start at `session_rate` per second; a session's next turn comes after the
    answer (`output / decode_tps` s) plus an exponential think time.
    """
    _check(
        seed,
        {"sessions": sessions},
        {
            "session_rate": (session_rate, 0.0, True),
            "think_time_s": (think_time_s, 0.0, False),
            "decode_tps": (decode_tps, 0.0, True),
        },
        {
            "turns": turns,
            "system_tokens": system_tokens,
            "user_tokens": user_tokens,
            "output_tokens": output_tokens,
        },
    )
    rng = random.Random(f"multi-turn:{seed}")
    tok = _Tokens(rng)
    shared = tok.sized(system_tokens)
    out = []
    for s, t0 in enumerate(start_times(sessions, session_rate, rng, arrival)):
        history = shared if shared_system else tok.sized(system_tokens)
        calls = []
        for _ in range(tok.size(turns)):
            inp = history + tok.block(max(1, tok.size(user_tokens)))
            ans = tok.sized(output_tokens)
            calls.append((inp, ans))
            history = inp + ans
        chain = chain_times(
            t0, [len(a) for _, a in calls], rng, think_time_s=think_time_s, decode_tps=decode_tps
        )
        for k, ((inp, ans), ts, think) in enumerate(
            zip(calls, chain.times, chain.thinks, strict=True)
        ):
            out.append(TraceRequest(s, k, ts, inp, ans, len(inp), len(ans), think))
    return _trace("synthetic-multi-turn", out, {"seed": seed, "sessions": sessions})


def agent_loop(
    *,
    sessions: int = 16,
    steps: Range = (4, 16),
    system_tokens: Range = (2048, 4096),
    task_tokens: Range = (128, 512),
    action_tokens: Range = (16, 128),
    observation_tokens: Range = (64, 1024),
    branch_prob: float = 0.2,
    session_rate: float = 0.2,
    arrival: Process = "poisson",
    tool_time_s: float = 2.0,
    decode_tps: float = 50.0,
    seed: int = 0,
) -> Trace:
    """Agent sessions with tool-call branching.

    All sessions share one system prompt; each has its own task. Call k's
    prompt is the history; its output is an action, after which a tool result
    (observation) is appended. With probability `branch_prob` a call instead
    re-runs an earlier call j of the session (same prompt, a different action)
    and the session continues from that branch: the history becomes
    prompt_j + new action + new observation. `meta["branches"]` lists the
    re-runs as `(session, turn, rerun_of_turn)`.
    """
    _check(
        seed,
        {"sessions": sessions},
        {
            "session_rate": (session_rate, 0.0, True),
            "tool_time_s": (tool_time_s, 0.0, False),
            "decode_tps": (decode_tps, 0.0, True),
        },
        {
            "steps": steps,
            "system_tokens": system_tokens,
            "task_tokens": task_tokens,
            "action_tokens": action_tokens,
            "observation_tokens": observation_tokens,
        },
    )
    as_real(branch_prob, "branch_prob", low=0.0, high=1.0)
    rng = random.Random(f"agent-loop:{seed}")
    tok = _Tokens(rng)
    system = tok.sized(system_tokens)
    out, branches = [], []
    for s, t0 in enumerate(start_times(sessions, session_rate, rng, arrival)):
        history = system + tok.block(max(1, tok.size(task_tokens)))
        prompts: list[array[int]] = []
        calls = []
        for k in range(tok.size(steps)):
            if prompts and rng.random() < branch_prob:
                j = rng.randrange(len(prompts))
                history = array("q", prompts[j])
                branches.append((s, k, j))
            action = tok.block(max(1, tok.size(action_tokens)))
            prompts.append(history)
            calls.append((history, action))
            history = history + action + tok.sized(observation_tokens)
        chain = chain_times(
            t0, [len(a) for _, a in calls], rng, think_time_s=tool_time_s, decode_tps=decode_tps
        )
        for k, ((inp, ans), ts, think) in enumerate(
            zip(calls, chain.times, chain.thinks, strict=True)
        ):
            out.append(TraceRequest(s, k, ts, inp, ans, len(inp), len(ans), think))
    meta: dict[str, object] = {"seed": seed, "sessions": sessions, "branches": branches}
    return _trace("synthetic-agent", out, meta)
