"""Token-level traces from real multi-turn text (needs the `text` extra).

Every assistant message is one LLM call. Its prompt is the whole conversation
before it through the Mistral v7 chat template (see `chat`); its output units
are the answer's tokens including `</s>`. So within a session each call's
input is an exact extension of the previous call's input + output, as a
prefix cache sees it from a real serving stack.

Timestamps:

* SWE-agent and MT-Bench have none. They are synthesized, seeded: sessions
  start as a Poisson process (`session_rate` per second, in a seeded shuffled
  order); a session's next call arrives when the previous answer would be done
  (`output tokens / decode_tps`) plus an exponential think/tool time with mean
  `think_time_s`.
* chitchat has real per-message times (2018, spread over 212 days). A
  conversation's first call keeps its place in time, mapped linearly into
  `[0, window_s]`; inside a conversation the real gaps are kept, each capped at
  `max_gap_s` (some people answered days later). The think time before a call
  (what closed-loop replay waits after the previous answer) is the real pause
  between the answering person's last message and the user's next one.

The synthetic schedules record the think time they drew (`TraceRequest.think_s`).
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence
from typing import TypeAlias

from ..progress import track
from ..trace import Trace, TraceRequest
from ._io import PathLike
from .arrivals import Chain, chain_times, start_times
from .chat import ChatTokenizer, chat_tokenizer
from .sources import (
    Conversation,
    chitchat_conversations,
    mt_bench_conversations,
    swe_agent_conversations,
)

Call: TypeAlias = "tuple[array[int], array[int]]"  # (prompt tokens, answer tokens)

SWE_AGENT_SOURCE = (
    "SWE-agent trajectories (princeton-nlp/SWE-agent@0772c99; MIT, (c) 2024 John Yang, "
    "Carlos E. Jimenez et al.); Mistral v7 tokenizer from mistral-common (Apache-2.0)"
)
MT_BENCH_SOURCE = (
    "MT-Bench questions and GPT-4 reference answers (lm-sys/FastChat@0e6d3e4; Apache-2.0); "
    "Mistral v7 tokenizer from mistral-common (Apache-2.0)"
)
CHITCHAT_SOURCE = (
    "chitchat-dataset 0.9.0 (PyPI; MIT; BYU PCC Chit Chat Challenge); "
    "Mistral v7 tokenizer from mistral-common (Apache-2.0)"
)


def conversation_calls(
    conv: Conversation, tok: ChatTokenizer, max_prompt_tokens: int | None = None
) -> list[Call]:
    """The LLM calls of one conversation, stopping before the first prompt
    longer than `max_prompt_tokens`."""
    enc = tok.encode(conv.messages)
    calls = []
    for start, end in enc.calls:
        if max_prompt_tokens is not None and start > max_prompt_tokens:
            break
        calls.append((enc.tokens[:start], enc.tokens[start:end]))
    return calls


def _tokenize(
    name: str, convs: Sequence[Conversation], tok: ChatTokenizer, max_prompt_tokens: int | None
) -> list[list[Call]]:
    """Every conversation's calls, with a progress bar when bars are on."""
    todo = track(convs, f"tokenizing {name}", len(convs), " conversations")
    return [conversation_calls(c, tok, max_prompt_tokens) for c in todo]


def _requests(session: int | str, calls: Sequence[Call], chain: Chain) -> list[TraceRequest]:
    return [
        TraceRequest(session, k, ts, inp, out, len(inp), len(out), think)
        for k, ((inp, out), ts, think) in enumerate(
            zip(calls, chain.times, chain.thinks, strict=True)
        )
    ]


def _conversation_trace(
    name: str,
    source: str,
    convs: Sequence[Conversation],
    calls: Sequence[Sequence[Call]],
    times: Sequence[Chain],
    tok: ChatTokenizer,
    timestamps: str,
) -> Trace:
    """A token-level trace of conversations: one request per call, in session order."""
    requests = [
        r
        for c, cs, chain in zip(convs, calls, times, strict=True)
        for r in _requests(c.session_id, cs, chain)
    ]
    meta: dict[str, object] = {
        "tokenizer": tok.file,
        "sessions": len(convs),
        "timestamps": timestamps,
    }
    return Trace(name, requests, unit_tokens=1, source=source, meta=meta)


def synthetic_schedule(
    outputs: Sequence[Sequence[int]],
    rng: random.Random,
    *,
    session_rate: float,
    think_time_s: float,
    decode_tps: float,
) -> list[Chain]:
    """Arrival and think times per session (see the module docstring);
    `outputs[s]` holds the output token counts of session s's calls."""
    order = list(range(len(outputs)))
    rng.shuffle(order)
    starts = start_times(len(order), session_rate, rng)
    times = [Chain([], []) for _ in outputs]
    for s, t0 in zip(order, starts, strict=True):
        times[s] = chain_times(
            t0, outputs[s], rng, think_time_s=think_time_s, decode_tps=decode_tps
        )
    return times


def _synthetic_trace(
    name: str,
    source: str,
    convs: Sequence[Conversation],
    *,
    seed: int,
    session_rate: float,
    think_time_s: float,
    decode_tps: float,
    max_prompt_tokens: int | None,
) -> Trace:
    tok = chat_tokenizer()
    calls = _tokenize(name, convs, tok, max_prompt_tokens)
    times = synthetic_schedule(
        [[len(out) for _, out in cs] for cs in calls],
        random.Random(f"{name}:{seed}"),
        session_rate=session_rate,
        think_time_s=think_time_s,
        decode_tps=decode_tps,
    )
    timestamps = (
        f"synthetic (seed {seed}): Poisson session starts at {session_rate}/s, "
        f"call gap = output/{decode_tps} tok/s + Exp(mean {think_time_s} s)"
    )
    return _conversation_trace(name, source, convs, calls, times, tok, timestamps)


def load_swe_agent(
    paths: Sequence[PathLike] | None = None,
    *,
    seed: int = 0,
    session_rate: float = 0.05,
    think_time_s: float = 5.0,
    decode_tps: float = 50.0,
    max_prompt_tokens: int | None = None,
) -> Trace:
    """SWE-agent sessions (22 bundled trajectories, 230 calls, or your `.traj` files).

    Each assistant message is one call; its prompt is every message before it.
    Tool results are encoded as `[TOOL_RESULTS]...`, tool calls after the
    answer text (see `chat`). Timestamps are synthetic (module docstring).
    """
    return _synthetic_trace(
        "swe-agent",
        SWE_AGENT_SOURCE,
        swe_agent_conversations(paths),
        seed=seed,
        session_rate=session_rate,
        think_time_s=think_time_s,
        decode_tps=decode_tps,
        max_prompt_tokens=max_prompt_tokens,
    )


def load_mt_bench(
    *,
    seed: int = 0,
    session_rate: float = 0.5,
    think_time_s: float = 30.0,
    decode_tps: float = 50.0,
) -> Trace:
    """MT-Bench: 80 questions x 2 turns = 160 calls, no system prompt.

    Answers: GPT-4 reference answers for 30 questions, seeded synthetic ones of
    plausible length for the other 50 (see `sources.mt_bench_conversations`).
    Timestamps are synthetic (module docstring).
    """
    return _synthetic_trace(
        "mt-bench",
        MT_BENCH_SOURCE,
        mt_bench_conversations(seed),
        seed=seed,
        session_rate=session_rate,
        think_time_s=think_time_s,
        decode_tps=decode_tps,
        max_prompt_tokens=None,
    )


def real_schedule(
    times: Sequence[Sequence[float]],
    *,
    window_s: float,
    max_gap_s: float,
    answered: Sequence[Sequence[float]] | None = None,
) -> list[Chain]:
    """Real per-session epoch times to trace times (see the module docstring).
    `answered[s][k]`, when given, is when call k's answer was complete; the
    think time before call k+1 is then the real pause from it to call k+1
    (capped at `max_gap_s` like every gap), else unknown (None)."""
    if window_s < 0 or max_gap_s < 0:
        raise ValueError("window_s and max_gap_s must be >= 0")
    firsts = [ts[0] for ts in times if ts]
    lo, hi = min(firsts, default=0.0), max(firsts, default=0.0)
    scale = window_s / (hi - lo) if hi > lo else 0.0
    out = []
    for s, ts in enumerate(times):
        t = (ts[0] - lo) * scale if ts else 0.0
        chain = Chain([], [])
        for i, real in enumerate(ts):
            think = None
            if i:
                t += min(max(real - ts[i - 1], 0.0), max_gap_s)
                if answered is not None:
                    think = min(max(real - answered[s][i - 1], 0.0), max_gap_s)
            chain.times.append(t)
            chain.thinks.append(think)
        out.append(chain)
    return out


def load_chitchat(
    n: int = 300,
    *,
    window_s: float = 3600.0,
    max_gap_s: float = 300.0,
    max_prompt_tokens: int | None = 16384,
    path: PathLike | None = None,
) -> Trace:
    """The first `n` chitchat conversations as chat sessions, real timestamps.

    Speakers alternate user/assistant (the first speaker is the user); a
    conversation stops before the first prompt over `max_prompt_tokens`.
    `path` overrides the dataset.json of the installed `chitchat-dataset`.
    """
    tok = chat_tokenizer()
    convs = chitchat_conversations(n, path)
    calls = _tokenize("chitchat", convs, tok, max_prompt_tokens)
    real = [list(c.times or ())[: len(cs)] for c, cs in zip(convs, calls, strict=True)]
    answered = [list(c.answered or ())[: len(cs)] for c, cs in zip(convs, calls, strict=True)]
    times = real_schedule(real, window_s=window_s, max_gap_s=max_gap_s, answered=answered)
    timestamps = (
        f"real: conversation starts mapped into [0, {window_s}] s, "
        f"gaps inside a conversation kept, capped at {max_gap_s} s"
    )
    return _conversation_trace("chitchat", CHITCHAT_SOURCE, convs, calls, times, tok, timestamps)
