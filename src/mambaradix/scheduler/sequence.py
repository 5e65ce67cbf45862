"""`Sequence`: one request as the scheduler sees it."""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from mambaradix.core.keys import as_int_array, check_hashable
from mambaradix.lifecycle import Request
from mambaradix.names import Names
from mambaradix.pools._checks import as_int


class Status(Names):
    """Where a sequence is (a `Names`: `Status.WAITING == "waiting"`): queued, part-way
    through its prefill, decoding, or ended (finished, or aborted without finishing)."""

    WAITING = "waiting"
    PREFILLING = "prefilling"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


WAITING, PREFILLING, RUNNING, FINISHED, ABORTED = Status


@dataclass(eq=False)
class Sequence:
    """A prompt to serve and up to `max_new_tokens` tokens to generate.

    `req` is its cache record (input = prompt, output = generated so far; the
    generated tokens survive a retraction, after which input + output is
    prefilled again). Statistics are of the admission whose prefill
    completed: `cached_tokens` of `prompt_tokens` came from the cache.

    `decode_steps` (default `max_new_tokens - 1`, one decode step per token
    after the first) may be larger when a position stands for several tokens
    (the replay's block traces): the sequence then decodes that many steps,
    producing its positions evenly spread over them, and holds its memory the
    whole time.
    """

    prompt: array[int]
    max_new_tokens: int
    extra_key: Hashable | None = None
    script: array[int] | None = None  # the tokens to generate, for stand-in forwards
    decode_steps: int | None = None  # decode steps after the first token (see below)
    id: int = 0
    arrival: float = 0.0
    req: Request = field(init=False)
    status: Status = WAITING
    stops: list[int] = field(default_factory=list)  # planned prefill stops (positions)
    cached_tokens: int = 0
    prompt_tokens: int = 0
    kv_hit_tokens: int = 0
    prefill_tokens: int = 0  # tokens run through prefill by admissions that completed
    retracted_tokens: int = 0  # prefill work lost to retractions
    admission_prefill: int = 0  # prefill tokens run by the current admission
    retractions: int = 0
    first_token_time: float | None = None
    finish_time: float | None = None
    admitted_len: int = 0  # total_len when the current admission matched
    steps_done: int = 0  # decode steps run so far
    to_finish: bool = False  # aborted while decoding (SGLang rules): finish after one more step
    submitted: bool = field(default=False, init=False)  # handed to a scheduler (once)

    def __post_init__(self) -> None:
        self.max_new_tokens = as_int(self.max_new_tokens, "max_new_tokens")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        prompt = array("q", as_int_array(self.prompt, "prompt"))  # our own copy
        if len(prompt) == 0:
            raise ValueError("a sequence needs at least one prompt token")
        if self.script is not None:
            self.script = as_int_array(self.script, "script")
            if len(self.script) < self.max_new_tokens:
                raise ValueError("script must hold at least max_new_tokens tokens")
        if self.decode_steps is not None:
            self.decode_steps = as_int(self.decode_steps, "decode_steps")
            if self.decode_steps < self.max_new_tokens - 1:
                raise ValueError("decode_steps must be at least max_new_tokens - 1")
        # a tree keys its namespaces by it: refuse here, not in the middle of a step
        check_hashable(self.extra_key, "extra_key")
        self.req = Request(prompt, self.extra_key)
        # Fixed from here on; read on every decode step of every running sequence.
        self._outputs = self.req.output_ids
        self._total = self.max_new_tokens - 1 if self.decode_steps is None else self.decode_steps

    @property
    def outputs(self) -> array[int]:
        return self.req.output_ids

    @property
    def total_steps(self) -> int:
        return self._total

    @property
    def done(self) -> bool:
        if self.to_finish:
            return True
        return len(self._outputs) >= self.max_new_tokens and self.steps_done >= self._total

    def _produced_after(self, steps: int) -> int:
        """Tokens generated once `steps` decode steps ran (evenly spread)."""
        total = self._total
        if total == 0:
            return self.max_new_tokens
        return 1 + steps * (self.max_new_tokens - 1) // total

    def token_due(self) -> bool:
        """Does the next decode step generate a token? (Always, unless
        `decode_steps` exceeds the tokens to generate.)"""
        if self.to_finish:
            return True
        total = self._total
        if total == 0:
            return self.max_new_tokens > len(self._outputs)
        return 1 + (self.steps_done + 1) * (self.max_new_tokens - 1) // total > len(self._outputs)

    def steps_to_event(self) -> int:
        """Decode steps until one generates a token or the sequence ends."""
        if self.to_finish:
            return 1  # it decodes one more token and ends
        made, extra, total = len(self._outputs), self.max_new_tokens - 1, self._total
        if made > extra or extra == 0:
            left = total - self.steps_done
            return left if left > 1 else 1
        at = -(-made * total // extra)  # first step count with `made + 1` tokens
        left = (at if at < total else total) - self.steps_done
        return left if left > 1 else 1

    @property
    def remaining_new(self) -> int:
        return self.max_new_tokens - len(self._outputs)


def outputs_left(running: Iterable[Sequence], clip: int) -> int:
    """The sum of each sequence's `remaining_new`, each clipped at `clip` (read once per
    prefill batch formed, over every running sequence)."""
    total = 0
    for s in running:
        left = s.max_new_tokens - len(s._outputs)
        total += left if left < clip else clip
    return total
