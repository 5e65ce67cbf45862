"""The forward the scheduler runs, injected: a real model (the engine), virtual
time (the replay) or a stand-in (tests, the demo).

The scheduler hands a forward, per batch, what to compute. For each item the
KV indices are already allocated in the request's row (`cache.rows`) and its
running state slot holds the state after `start` tokens (the copy-on-write or
zeroing is done). The forward must leave the state after `end` tokens in the
running slot, write K/V for the new positions, and, where `track_slot` is
set, copy the state after `track_at` tokens into that slot (extra_buffer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from mambaradix.lifecycle import CacheManager
    from mambaradix.pools import FingerprintStatePool
    from mambaradix.scheduler.sequence import Sequence


# Not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__,
# 5x the cost of a plain one (1.1 us against 0.2), and the scheduler makes one per
# sequence per prefill batch. Nothing changes an item once made.
@dataclass(slots=True)
class Extend:
    """Prefill positions [start, end) of `seq.req.tokens`."""

    seq: Sequence
    start: int
    end: int
    track_at: int | None = None
    track_slot: int | None = None


@dataclass(slots=True)
class DecodeStep:
    """One decode step of `seq`: the token at position computed - 1 goes in."""

    seq: Sequence
    track_slot: int | None = None  # copy the state after this step here


class Forward(Protocol):
    def prefill(self, batch: list[Extend]) -> list[int | None]:
        """Run every extend; the next token for those that end at the
        sequence's last token (prompt complete), None for the others. The
        scheduler ignores the token of a sequence with none left to make (a
        block-trace sequence retracted in its quiet steps)."""
        ...

    def decode(self, batch: list[DecodeStep]) -> list[int]:
        """One step for every sequence; the next token of each."""
        ...

    def pass_steps(self, n: int) -> None:
        """`n` decode steps passed with nothing to compute (a block-trace sequence's
        quiet steps): a virtual clock advances, a real model does nothing."""
        ...


def scripted_token(seq: Sequence) -> int:
    """The sequence's next scripted output token."""
    if seq.script is None:
        raise ValueError("a stand-in forward needs sequences with a script")
    return int(seq.script[len(seq.req.output_ids)])


def _makes_token(e: Extend) -> bool:
    """Whether the extend completes the prompt of a sequence with a token left
    to make (a block-trace sequence retracted in its quiet steps has none)."""
    return e.end == e.seq.req.total_len and e.seq.remaining_new > 0


class ScriptedForward:
    """Computes nothing: every next token comes from the sequence's script."""

    def prefill(self, batch: list[Extend]) -> list[int | None]:
        return [scripted_token(e.seq) if _makes_token(e) else None for e in batch]

    def decode(self, batch: list[DecodeStep]) -> list[int]:
        return [scripted_token(d.seq) for d in batch]

    def pass_steps(self, n: int) -> None:
        pass


class FingerprintForward(ScriptedForward):
    """A stand-in model whose state is a hash of exactly the tokens it consumed
    (`FingerprintStatePool`), so any state mix-up shows as a wrong fingerprint."""

    def __init__(self, cache: CacheManager, states: FingerprintStatePool) -> None:
        self.cache, self.states = cache, states

    def prefill(self, batch: list[Extend]) -> list[int | None]:
        for e in batch:
            slot, tokens = e.seq.req.slot, e.seq.req.tokens
            assert slot is not None
            if e.track_at is not None and e.track_slot is not None:
                self.states.advance(slot, tokens[e.start : e.track_at])
                self.states.copy([slot], [e.track_slot])
                self.states.advance(slot, tokens[e.track_at : e.end])
            else:
                self.states.advance(slot, tokens[e.start : e.end])
        return super().prefill(batch)

    def decode(self, batch: list[DecodeStep]) -> list[int]:
        for d in batch:
            req = d.seq.req
            assert req.slot is not None
            self.states.advance(req.slot, req.tokens[req.computed - 1 : req.computed])
            if d.track_slot is not None:
                self.states.copy([req.slot], [d.track_slot])
        return super().decode(batch)
