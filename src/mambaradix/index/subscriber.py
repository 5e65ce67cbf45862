"""Feed an `Indexer` from ZMQ publishers (vLLM, SGLang, or `events.ZmqPublisher`).

Per worker: a SUB socket connected to its PUB endpoint (frames `(topic, seq, payload)`),
and, when given, a DEALER socket to its replay ROUTER. What a worker's `WorkerFeed`
asks for (a replay from a seq, or a snapshot) is sent there; the answers are offered to
the feed like live batches, and the end marker closes the request. Replies come as
`(seq, payload)` (vLLM <= 0.25, SGLang <= 0.5.21, after the empty delimiter) or with the
topic first, `(topic, seq, payload)` (vLLM >= 0.26, SGLang >= 0.5.22); the frame count
tells them apart, so every release is read whatever `release` says (see `WorkerFeed`).
Every wait is bounded: `poll(timeout_s)` returns after at most about `timeout_s`.

Answers carry no request id, so a request the feed forgot (it timed out, or the publisher
restarted) could still be answered later, and its end marker would close the request sent
after it. The DEALER is therefore replaced before the first request that follows: late
answers go to a socket that no longer exists.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import AbstractContextManager, nullcontext

import zmq

from mambaradix.events.publisher import END_SEQ, check_seconds
from mambaradix.events.releases import AUTO, Release, ingest_release
from mambaradix.index.feed import WorkerFeed
from mambaradix.index.indexer import Indexer, check_worker_id

log = logging.getLogger("mambaradix.index")


class ZmqSubscriber:
    """`lock` (optional) is held while the indexer changes, for readers in other threads.
    `release`: what the workers run, unless `add` says otherwise ("auto": any)."""

    def __init__(
        self,
        indexer: Indexer,
        lock: threading.Lock | None = None,
        timeout_s: float = 2.0,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        release: str | Release = AUTO,
    ) -> None:
        if not isinstance(indexer, Indexer):
            raise TypeError(f"indexer must be an Indexer, got {type(indexer).__name__}")
        check_seconds("timeout_s", timeout_s, positive=True)
        self.release = ingest_release(release)
        self.indexer, self.timeout_s = indexer, timeout_s
        self._lock: AbstractContextManager[object] = lock if lock is not None else nullcontext()
        self._ctx = context or zmq.Context.instance()
        self._poller = zmq.Poller()
        self.feeds: dict[int, WorkerFeed] = {}
        self._by_socket: dict[zmq.Socket[bytes], tuple[WorkerFeed, bool]] = {}
        # worker id -> (DEALER, its endpoint, the feed's `forgotten` when it was made)
        self._replay: dict[int, tuple[zmq.Socket[bytes], str, int]] = {}
        self.bad_frames = 0

    def add(
        self,
        worker_id: int,
        endpoint: str,
        replay_endpoint: str | None = None,
        release: str | Release | None = None,
    ) -> None:
        """Subscribe to a worker's publisher (and its replay socket, if any); `release`:
        what it runs (None: the subscriber's `release`)."""
        check_worker_id(worker_id)  # before any socket is made
        if worker_id in self.feeds:
            raise ValueError(f"worker {worker_id} is already subscribed")
        expect = self.release if release is None else ingest_release(release)
        sockets: list[zmq.Socket[bytes]] = []
        try:  # a bad address fails here, before anything is registered
            sockets.append(self._socket(zmq.SUB, endpoint))
            if replay_endpoint is not None:
                sockets.append(self._socket(zmq.DEALER, replay_endpoint))
        except zmq.ZMQError:
            for sock in sockets:
                sock.close(linger=0)
            raise
        sockets[0].setsockopt(zmq.SUBSCRIBE, b"")
        with self._lock:
            feed = WorkerFeed(
                self.indexer, worker_id, timeout_s=self.timeout_s, release=expect or AUTO
            )
        for sock, is_replay in zip(sockets, (False, True), strict=False):
            self._by_socket[sock] = (feed, is_replay)
            self._poller.register(sock, zmq.POLLIN)
        if replay_endpoint is not None:
            self._replay[worker_id] = (sockets[1], replay_endpoint, 0)
            with self._lock:
                feed.start_cold(time.monotonic())
        self.feeds[worker_id] = feed

    def _socket(self, kind: int, endpoint: str) -> zmq.Socket[bytes]:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(endpoint)
        except zmq.ZMQError:
            sock.close(linger=0)
            raise
        return sock

    def poll(self, timeout_s: float = 0.1) -> int:
        """Receive and apply what arrives within `timeout_s`; returns batches received."""
        check_seconds("timeout_s", timeout_s)
        got = 0
        deadline = time.monotonic() + timeout_s
        while True:
            self._send_requests()
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            ready = dict(self._poller.poll(left_ms if got == 0 else 0))
            if not ready:
                break
            for sock in ready:
                got += self._receive(sock)
        now = time.monotonic()
        with self._lock:
            for feed in self.feeds.values():
                feed.tick(now)
        self._send_requests()
        return got

    def run(self, stop: threading.Event, interval_s: float = 0.1) -> None:
        """Poll until `stop` is set."""
        while not stop.is_set():
            self.poll(interval_s)

    def _receive(self, sock: zmq.Socket[bytes]) -> int:
        feed, is_replay = self._by_socket[sock]
        return self._handle(feed, is_replay, sock.recv_multipart(zmq.NOBLOCK))

    def _handle(self, feed: WorkerFeed, is_replay: bool, frames: list[bytes]) -> int:
        """One message from a worker's SUB (live) or DEALER (replay) socket; returns
        the batches it carried (0 or 1)."""
        if is_replay:
            frames = frames[1:] if frames and frames[0] == b"" else frames
            topic = len(frames) == 3  # the topic first: vLLM >= 0.26, SGLang >= 0.5.22
            frames = frames[1:] if topic else frames
            if len(frames) == 2:
                with self._lock:
                    feed.replay_framed(topic)
        elif len(frames) == 3:
            frames = frames[1:]
        if len(frames) != 2 or len(frames[0]) != 8:
            self.bad_frames += 1
            with self._lock:
                feed.counts["bad_frames"] += 1
            log.warning("worker %s: a message of %d frames ignored", feed.worker_id, len(frames))
            return 0
        if is_replay and frames[0] == END_SEQ:
            with self._lock:
                feed.replay_ended(time.monotonic())
            return 0
        with self._lock:
            feed.offer(int.from_bytes(frames[0], "big"), frames[1], time.monotonic(), not is_replay)
        return 1

    def _send_requests(self) -> None:
        for worker_id, feed in self.feeds.items():
            request = feed.take_request()
            if request is None:
                continue
            dealer = self._dealer(worker_id, feed)
            try:
                if dealer is None:
                    raise zmq.Again
                # never blocks: with nobody reading, requests fill the queue (SNDHWM)
                dealer.send_multipart([b"", request], zmq.NOBLOCK)
            except zmq.Again:
                with self._lock:
                    feed.replay_ended(time.monotonic())  # nobody to ask

    def _dealer(self, worker_id: int, feed: WorkerFeed) -> zmq.Socket[bytes] | None:
        """The worker's replay socket, a fresh one if the feed forgot requests since it
        was made (None: no replay endpoint, or it cannot be reconnected)."""
        if worker_id not in self._replay:
            return None
        old, endpoint, forgotten = self._replay[worker_id]
        if forgotten == feed.forgotten:
            return old
        self._poller.unregister(old)
        del self._by_socket[old]
        old.close(linger=0)
        del self._replay[worker_id]
        try:
            new = self._socket(zmq.DEALER, endpoint)
        except zmq.ZMQError as e:  # it connected before; if not now, nobody answers
            log.warning("worker %s: replay socket not reconnected: %s", worker_id, e)
            return None
        self._replay[worker_id] = (new, endpoint, feed.forgotten)
        self._by_socket[new] = (feed, True)
        self._poller.register(new, zmq.POLLIN)
        return new

    def close(self) -> None:
        for sock in self._by_socket:
            self._poller.unregister(sock)
            sock.close(linger=0)
        self._by_socket.clear()
