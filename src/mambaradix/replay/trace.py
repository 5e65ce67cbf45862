"""The request trace every workload loader produces.

A trace is a list of requests in arrival order; a session's turns share a
`session_id` and count up in `turn_id` (a turn follows its session's previous
turn: closed-loop replay releases it only after that turn's answer). Each request carries its input
and output as *units*: token ids for token-level traces, or block ids for
block-level traces (Mooncake: one unit = a 512-token block, equal ids = equal
prefix), plus its true token counts. The replay works in units and converts to
tokens with `unit_tokens` (the last input unit of a block trace may be partial;
token counts always come from `input_tokens` / `output_tokens`).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from mambaradix.validate import as_count, as_real, as_type

_INT_CODES = frozenset("bBhHiIlLqQ")


@dataclass(frozen=True, slots=True)
class TraceRequest:
    session_id: int | str
    turn_id: int
    ts: float  # arrival time in seconds from the start of the trace
    input_units: array[int]
    output_units: array[int]
    input_tokens: int
    output_tokens: int
    think_s: float | None = None
    """Seconds from the previous turn's answer (its last token) to this turn's
    arrival, as recorded; None when the trace does not record it (closed-loop
    replay then takes the arrival gap; `replay.sessions`)."""

    def __post_init__(self) -> None:
        sid = self.session_id
        if isinstance(sid, bool) or not isinstance(sid, (int, str)):
            raise TypeError(f"session_id must be an int or a str, got {type(sid).__name__}")
        where = f"request {sid}/{self.turn_id}"
        as_count(self.turn_id, f"{where}: turn_id")
        as_real(self.ts, f"{where}: ts", low=0)
        for name in ("input_units", "output_units"):
            units = getattr(self, name)
            if not isinstance(units, array) or units.typecode not in _INT_CODES:
                raise TypeError(
                    f"{where}: {name} must be an array of ints, got {type(units).__name__}"
                )
        as_count(self.input_tokens, f"{where}: input_tokens")
        as_count(self.output_tokens, f"{where}: output_tokens")
        if self.think_s is not None:
            as_real(self.think_s, f"{where}: think_s", low=0)
        if not self.input_units:
            raise ValueError(f"{where} has no input")
        if self.input_tokens < len(self.input_units):
            raise ValueError(f"{where}: bad token counts")


@dataclass(slots=True)
class Trace:
    name: str
    requests: list[TraceRequest]
    unit_tokens: int = 1  # tokens per unit: 1 for token traces, 512 for Mooncake
    source: str = ""  # where the data comes from, with its license
    meta: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        as_type(self.name, str, "name")
        if isinstance(self.unit_tokens, bool) or not isinstance(self.unit_tokens, int):
            raise TypeError(f"unit_tokens must be an int, got {type(self.unit_tokens).__name__}")
        if self.unit_tokens < 1:
            raise ValueError("unit_tokens must be >= 1")
        as_type(self.requests, list, "requests")
        self._check_requests()
        self.requests.sort(key=lambda r: r.ts)

    def _check_requests(self) -> None:
        """Each a TraceRequest, and in a token-level
        trace (`unit_tokens == 1`) token counts equal to the unit counts (a
        block-level request mixed in would not). Block traces are not held to
        ceil(tokens / unit_tokens) units: `load_mooncake(check_lengths=False)`
        keeps such rows on purpose."""
        u = self.unit_tokens
        for i, r in enumerate(self.requests):
            as_type(r, TraceRequest, f"requests[{i}]")
            if u == 1 and (r.input_tokens, r.output_tokens) != (
                len(r.input_units),
                len(r.output_units),
            ):
                raise ValueError(
                    f"requests[{i}]: {r.input_tokens}/{r.output_tokens} tokens in "
                    f"{len(r.input_units)}/{len(r.output_units)} units of unit_tokens=1"
                )

    @property
    def prompt_tokens(self) -> int:
        return sum(r.input_tokens for r in self.requests)

    def __len__(self) -> int:
        return len(self.requests)
