"""Seeded arrival times: session starts and the gaps between a session's calls.

Times are virtual seconds from the start of the trace. Every function takes an
explicit `random.Random`, so a seed fixes the whole schedule.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal, NamedTuple

Process = Literal["poisson", "uniform"]


def start_times(
    n: int, rate: float, rng: random.Random, process: Process = "poisson"
) -> list[float]:
    """`n` arrival times at `rate` per second, starting at 0.

    `poisson`: exponential gaps with mean `1/rate`; `uniform`: gaps of exactly
    `1/rate`.
    """
    if rate <= 0:
        raise ValueError("rate must be > 0")
    if process not in ("poisson", "uniform"):
        raise ValueError(f"unknown arrival process {process!r}")
    t, out = 0.0, []
    for i in range(n):
        if i:
            t += rng.expovariate(rate) if process == "poisson" else 1.0 / rate
        out.append(t)
    return out


class Chain(NamedTuple):
    """One session's arrival times, and per call the think time drawn before
    it (None for the first call): what closed-loop replay waits after the
    previous answer."""

    times: list[float]
    thinks: list[float | None]


def chain_times(
    start: float,
    output_tokens: Sequence[int],
    rng: random.Random,
    *,
    think_time_s: float,
    decode_tps: float,
) -> Chain:
    """Arrival times of one session's calls, the first at `start`.

    Each next call waits for the previous answer (`output_tokens / decode_tps`
    seconds) plus an exponential think or tool time with mean `think_time_s`.
    """
    if think_time_s < 0 or decode_tps <= 0:
        raise ValueError("think_time_s must be >= 0 and decode_tps > 0")
    t, out = start, []
    thinks: list[float | None] = [None]
    for i, n_out in enumerate(output_tokens):
        out.append(t)
        if i + 1 < len(output_tokens):
            think = rng.expovariate(1.0 / think_time_s) if think_time_s else 0.0
            t += n_out / decode_tps + think
            thinks.append(think)
    return Chain(out, thinks[: len(out)])
