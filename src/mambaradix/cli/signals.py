"""SIGTERM and SIGHUP end a command as Ctrl-C does: cleanly, with its exit code.

By default Python dies at once on SIGTERM or SIGHUP (a `kill`, a closed terminal, a
batch system's time limit), skipping every `finally`: the replay's worker processes
kept computing as orphans and temporary files stayed. Inside `as_interrupts()` both
raise `Terminated`, a KeyboardInterrupt, so the code that cleans up after Ctrl-C runs
for them too (workers are killed, nothing half-written is left), and `exit_code`
gives the shell's convention: 130 after Ctrl-C, 128 + N after signal N (143 SIGTERM,
129 SIGHUP). A signal whose handler is not the default (e.g. SIGHUP under `nohup`,
which ignores it) is left alone.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGTERM,) if sys.platform == "win32" else (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """Signal `signum` asked the process to end."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    def __str__(self) -> str:
        return signal.Signals(self.signum).name


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


@contextmanager
def as_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise `Terminated` (main thread only:
    signals reach no other); the old handlers come back after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in SIGNALS}
    for s, handler in old.items():
        if handler is signal.SIG_DFL:
            signal.signal(s, _raise)
    try:
        yield
    finally:
        for s, handler in old.items():
            if handler is signal.SIG_DFL:
                signal.signal(s, handler)


def exit_code(e: KeyboardInterrupt) -> int:
    """130 for Ctrl-C, 128 + N for signal N."""
    return 128 + e.signum if isinstance(e, Terminated) else 130


def said(e: KeyboardInterrupt) -> str:
    """How the interruption is named on stderr."""
    return f"interrupted ({e})" if isinstance(e, Terminated) else "interrupted"
