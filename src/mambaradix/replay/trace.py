"""The request trace every workload loader produces.

A trace is a list of requests in arrival order. Each request carries its input
and output as *units*: token ids for token-level traces, or block ids for
block-level traces (Mooncake: one unit = a 512-token block, equal ids = equal
prefix), plus its true token counts. The replay works in units and converts to
tokens with `unit_tokens` (the last input unit of a block trace may be partial;
token counts always come from `input_tokens` / `output_tokens`).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TraceRequest:
    session_id: int | str
    turn_id: int
    ts: float  # arrival time in seconds from the start of the trace
    input_units: array[int]
    output_units: array[int]
    input_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        if not self.input_units:
            raise ValueError(f"request {self.session_id}/{self.turn_id} has no input")
        if self.input_tokens < len(self.input_units) or self.output_tokens < 0:
            raise ValueError(f"request {self.session_id}/{self.turn_id}: bad token counts")


@dataclass(slots=True)
class Trace:
    name: str
    requests: list[TraceRequest]
    unit_tokens: int = 1  # tokens per unit: 1 for token traces, 512 for Mooncake
    source: str = ""  # where the data comes from, with its license
    meta: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.unit_tokens < 1:
            raise ValueError("unit_tokens must be >= 1")
        self.requests.sort(key=lambda r: r.ts)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.input_tokens for r in self.requests)

    def __len__(self) -> int:
        return len(self.requests)
