"""ZMQ publisher of event batches, framed as the chosen release of vLLM or SGLang frames them.

* PUB socket: multipart `(topic, seq, payload)`, `seq` 8 bytes big-endian from 0, one
  per published batch, `payload` a msgpack `EventBatch` (`wire.encode_batch`).
* Replay ROUTER socket (optional): a client sends `(b"", start_seq)` and receives, for
  every buffered batch with `seq >= start_seq`, `(b"", seq, payload)` (vLLM <= 0.25,
  SGLang <= 0.5.21) or `(b"", topic, seq, payload)` (vLLM >= 0.26, SGLang >= 0.5.22),
  then the end marker `(b"", -1, b"")` or `(b"", b"", -1, b"")` (-1 as 8 signed bytes).
  The buffer keeps `buffer_steps` batches.
* Cold start, our extension: with a `snapshot` callable (e.g. `EventEmitter.dump`), a
  request older than the buffer, or the 8 bytes of -2 (`SNAPSHOT_REQUEST`, which an
  engine's publisher answers with the end marker alone), is answered by one batch tagged
  with the latest seq whose events (`AllBlocksCleared` first) rebuild the contents.

Single-threaded by design: the thread that changes the tree calls `publish()` and, between
steps, `serve_replay()`, so a snapshot always matches the latest published seq (call it
after publishing the emitter's pending events).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from mambaradix.events import releases
from mambaradix.events.model import Event
from mambaradix.events.releases import Release
from mambaradix.events.wire import check_rank, encode_batch

END_SEQ = (-1).to_bytes(8, "big", signed=True)
SNAPSHOT_REQUEST = (-2).to_bytes(8, "big", signed=True)


def check_seconds(name: str, value: Any, positive: bool = False) -> None:
    """A finite number of seconds, >= 0 (> 0 with `positive`): every wait stays bounded."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
        low = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be finite and {low} seconds, got {value!r}")


class ZmqPublisher:
    """Publish batches on `endpoint` (bound; port 0 picks one, see `endpoint`) as
    `release` does (a name from `releases.py`; "vllm" / "sglang": the newest)."""

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        release: str | Release = "vllm",
        buffer_steps: int = 10_000,
        snapshot: Callable[[], Sequence[Event]] | None = None,
        topic: str = "",
        rank: int = 0,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        dialect = releases.release(release)
        if isinstance(buffer_steps, bool) or not isinstance(buffer_steps, int) or buffer_steps < 1:
            raise ValueError(f"buffer_steps must be a positive int, got {buffer_steps!r}")
        check_rank(rank)
        if not isinstance(topic, str):
            raise TypeError(f"topic must be a str, got {topic!r}")
        if snapshot is not None and not callable(snapshot):
            raise TypeError(f"snapshot must be a callable or None, got {snapshot!r}")
        self.release, self.rank, self._snapshot = dialect, rank, snapshot
        self._topic = topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._next_seq = 0
        self._ctx = context or zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            self._pub.setsockopt(zmq.LINGER, 0)
            self._pub.bind(endpoint)
            if replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(replay_endpoint)
        except zmq.ZMQError:
            self.close()
            raise

    @property
    def endpoint(self) -> str:
        """The PUB address actually bound."""
        return self._pub.getsockopt_string(zmq.LAST_ENDPOINT)

    @property
    def replay_endpoint(self) -> str | None:
        return None if self._replay is None else self._replay.getsockopt_string(zmq.LAST_ENDPOINT)

    @property
    def last_seq(self) -> int:
        """The seq of the latest published batch (-1: none yet)."""
        return self._next_seq - 1

    def publish(self, events: Sequence[Event], ts: float | None = None) -> int | None:
        """Send one batch; returns its seq (None for no events: nothing is sent)."""
        if not events:
            return None
        payload = encode_batch(events, self.release, ts, self.rank)
        seq = self._next_seq
        self._send([self._topic, seq.to_bytes(8, "big"), payload])
        self._buffer.append((seq, payload))
        self._next_seq += 1
        return seq

    def _send(self, frames: list[bytes]) -> None:
        self._pub.send_multipart(frames)

    def serve_replay(self, timeout_s: float = 0.0) -> int:
        """Answer the replay requests waiting (or arriving within `timeout_s`); returns
        how many were answered."""
        check_seconds("timeout_s", timeout_s)
        if self._replay is None:
            return 0
        served = 0
        wait_ms = int(timeout_s * 1000)
        while self._replay.poll(wait_ms if served == 0 else 0):
            frames = self._replay.recv_multipart()
            if len(frames) == 3 and len(frames[2]) == 8:
                self._answer(frames[0], frames[2])
                served += 1
        return served

    def _answer(self, client: bytes, request: bytes) -> None:
        start = int.from_bytes(request, "big", signed=True)
        oldest = self._buffer[0][0] if self._buffer else self._next_seq
        if self._snapshot is not None and self.last_seq >= 0 and (start == -2 or start < oldest):
            payload = encode_batch(list(self._snapshot()), self.release, None, self.rank)
            self._reply(client, self.last_seq.to_bytes(8, "big"), payload)
        elif start >= 0:
            for seq, payload in self._buffer:
                if seq >= start:
                    self._reply(client, seq.to_bytes(8, "big"), payload)
        self._reply(client, END_SEQ, b"")

    def _reply(self, client: bytes, seq: bytes, payload: bytes) -> None:
        """One replay frame: the topic frame first where the release sends one (empty
        before the end marker)."""
        assert self._replay is not None
        head = [client, b""]
        if self.release.replay_topic:
            head.append(b"" if seq == END_SEQ else self._topic)
        self._replay.send_multipart([*head, seq, payload])

    def close(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
