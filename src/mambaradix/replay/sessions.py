"""When each request of a trace reaches the server: open or closed loop.

Open loop (``ServingConfig.open_loop``): every request at its trace time (or
its ``--rate`` slot), whether or not its session's previous answer is done.

Closed loop (the default): a session's first turn arrives at its time; each
later turn arrives ``think`` seconds after its previous turn's answer is done
(its last token, in the replay's virtual time), so a turn never overlaps the
turn before it. A turn whose previous turn was dropped arrives ``think``
seconds after the drop. ``think`` is the trace's recorded think time
(`TraceRequest.think_s`: the synthetic and text workloads record the pause
they drew, a neutral JSONL trace may give ``think_s`` or the previous turn's
``duration_s``), else the arrival gap between the two turns (open-loop
times), which is the think time of a trace recorded with instant answers.

A session is the requests sharing a ``session_id``, in ``turn_id`` order
(trace order among equal turn ids); a request alone in its session (every
Mooncake row whose previous turn could not be inferred, every
``synthetic-shared-prefix`` request) arrives at its time either way.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from mambaradix.replay.trace import Trace

__all__ = ["Releases", "previous_turns"]


def previous_turns(trace: Trace) -> list[int]:
    """Per request, the index of its session's previous turn (-1 for a first turn)."""
    sessions: dict[int | str, list[int]] = {}
    for i, r in enumerate(trace.requests):
        sessions.setdefault(r.session_id, []).append(i)
    prev = [-1] * len(trace)
    for members in sessions.values():
        members.sort(key=lambda i: (trace.requests[i].turn_id, i))
        for a, b in zip(members, members[1:], strict=False):
            prev[b] = a
    return prev


class Releases:
    """The requests still to arrive, earliest first (see the module docstring).

    `peek`/`pop` give ``(time, index)``; the driver calls `done(i, t)` when
    request i's answer is done (or i is dropped) at virtual time t, which
    schedules its session's next turn. Ties go in trace order."""

    __slots__ = ("_heap", "_next", "_think", "held")

    def __init__(self, trace: Trace, times: Sequence[float], closed: bool) -> None:
        n = len(trace)
        self._next = [-1] * n
        self._think = [0.0] * n
        prev = previous_turns(trace) if closed else [-1] * n
        for j, i in enumerate(prev):
            if i >= 0:
                self._next[i] = j
                recorded = trace.requests[j].think_s
                self._think[j] = recorded if recorded is not None else max(0.0, times[j] - times[i])
        self._heap = [(times[j], j) for j in range(n) if prev[j] < 0]
        heapq.heapify(self._heap)
        self.held = n - len(self._heap)
        """Turns waiting for their previous turn's answer."""

    @property
    def pending(self) -> bool:
        return bool(self._heap) or self.held > 0

    def peek(self) -> tuple[float, int] | None:
        return self._heap[0] if self._heap else None

    def pop(self) -> tuple[float, int]:
        return heapq.heappop(self._heap)

    def done(self, i: int, t: float) -> None:
        """Request i's answer is done (or i was dropped) at t: release its next turn."""
        j = self._next[i]
        if j >= 0:
            self._next[i] = -1
            self.held -= 1
            heapq.heappush(self._heap, (t + self._think[j], j))
