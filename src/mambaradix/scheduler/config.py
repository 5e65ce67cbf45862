"""`SchedulerConfig`: SGLang's scheduling knobs that decide cache behaviour."""

from __future__ import annotations

import math
from dataclasses import dataclass

# SGLang 0.5.15.post1 defaults (environ.py, schedule_policy.py).
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION


@dataclass(frozen=True)
class SchedulerConfig:
    """How requests are batched (SGLang server arguments of the same meaning).

    chunk_tokens: `--chunked-prefill-size`, tokens per prefill batch (None:
        no chunking, a prompt is prefilled whole).
    max_running: `--max-running-requests` (also the rows of the request table).
    max_prefill_tokens: `--max-prefill-tokens`.
    conservativeness: `--schedule-conservativeness` (scales the share of
        each running request's remaining output reserved at admission).
    track_interval: `--mamba-track-interval` (extra_buffer: a state is
        tracked during decode whenever the sequence length is a multiple).
    truncation_align_size: SGLang's knob of that name (deterministic
        inference): prefill extends are cut on a grid of this many tokens.
        None (default): no grid. See `PrefillBudget` for the rule.
    """

    chunk_tokens: int | None = 8192
    max_running: int = 256
    max_prefill_tokens: int = 16384
    conservativeness: float = 1.0
    track_interval: int = 256
    truncation_align_size: int | None = None

    def __post_init__(self) -> None:
        if self.chunk_tokens is not None:
            _positive("chunk_tokens", self.chunk_tokens)
        _positive("max_running", self.max_running)
        _positive("max_prefill_tokens", self.max_prefill_tokens)
        _positive("track_interval", self.track_interval)
        align = self.truncation_align_size
        if align is not None:
            _positive("truncation_align_size", align)
            if self.chunk_tokens is not None and align > self.chunk_tokens:
                raise ValueError(
                    f"truncation_align_size ({align}) must be <= chunk_tokens "
                    f"({self.chunk_tokens}): no truncated chunk could reach the grid"
                )
        c = self.conservativeness
        if isinstance(c, bool) or not isinstance(c, int | float) or not math.isfinite(c) or c < 0:
            raise ValueError(f"conservativeness must be a finite number >= 0, got {c!r}")


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


class NewTokenRatio:
    """The share of each running request's remaining output that admission
    reserves (SGLang's NewTokenRatioTracker): starts at 0.7 x conservativeness,
    decays linearly to 14% of that over 600 decode steps, and is re-estimated
    from the running requests after a retraction."""

    def __init__(self, conservativeness: float) -> None:
        self.init = min(INIT_NEW_TOKEN_RATIO * conservativeness, 1.0)
        self.min = min(self.init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.decay = (self.init - self.min) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.current = self.init

    def decay_step(self) -> None:
        self.current = max(self.current - self.decay, self.min)

    def decay_steps(self, n: int) -> None:
        """`decay_step` n times (one at a time: the same floats); at the floor it stays."""
        for _ in range(n):
            if self.current == self.min:
                return
            self.decay_step()

    def after_retract(self, decoded: int, max_new: int, running: int) -> None:
        """decoded / max_new: sums over the requests still running."""
        ratio = (decoded + RETRACT_DECODE_STEPS * running) / (max_new + 1)
        self.current = min(1.0, ratio)
