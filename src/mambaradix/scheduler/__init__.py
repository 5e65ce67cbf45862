"""The one request driver: `Scheduler` batches requests as SGLang's scheduler
does and drives them through the cache (`CacheManager`) and an injected
forward (a real model, virtual time or a stand-in)."""

from __future__ import annotations

from mambaradix.scheduler.budget import admission_need, fits_alone, kv_needed_alone, slots_alone
from mambaradix.scheduler.config import SchedulerConfig
from mambaradix.scheduler.forward import (
    DecodeStep,
    Extend,
    FingerprintForward,
    Forward,
    ScriptedForward,
)
from mambaradix.scheduler.loop import DECODE, IDLE, PREEMPTED, PREFILL, STALLED, Scheduler, Step
from mambaradix.scheduler.sequence import Sequence, Status

__all__ = [
    "DECODE",
    "IDLE",
    "PREEMPTED",
    "PREFILL",
    "STALLED",
    "DecodeStep",
    "Extend",
    "FingerprintForward",
    "Forward",
    "Scheduler",
    "SchedulerConfig",
    "ScriptedForward",
    "Sequence",
    "Status",
    "Step",
    "admission_need",
    "fits_alone",
    "kv_needed_alone",
    "slots_alone",
]
