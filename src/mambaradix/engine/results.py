"""`Engine.stats()`'s result. Attribute access is the typed way to read it; it is also
the read-only mapping over its JSON keys (`mambaradix.results`): `stats["hit_rate"]`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mambaradix.results import JsonResult

__all__ = ["EngineStats"]


@dataclass(frozen=True, eq=False)
class EngineStats(JsonResult):
    """Counters since construction: requests; prompt_tokens, cached_tokens and
    computed_prefill_tokens (prompt tokens the model ran in prefill, over completed
    admissions); decode_tokens, retractions, retracted_prefill_tokens (prefill work lost
    to them); forwards (model forwards), decode_forwards (those that ran decode steps),
    hit_rate (cached / prompt), evicted_kv_tokens, evicted_states, evictions (their sum).
    `host`: the host tier's counters (`HostTier.stats`), keyed `host_<name>` in the
    JSON; None (no keys) without a host tier."""

    requests: int
    prompt_tokens: int
    cached_tokens: int
    computed_prefill_tokens: int
    decode_tokens: int
    retractions: int
    retracted_prefill_tokens: int
    forwards: int
    decode_forwards: int
    hit_rate: float
    evicted_kv_tokens: int
    evicted_states: int
    evictions: int
    host: dict[str, int] | None = None

    def items_raw(self) -> Iterator[tuple[str, Any]]:
        for name, value in super().items_raw():
            if name != "host":
                yield name, value
        for name, value in (self.host or {}).items():
            yield f"host_{name}", value
