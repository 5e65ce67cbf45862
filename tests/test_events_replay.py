"""Replays across releases, over loopback ZMQ (ipc:// sockets in a temporary directory:
the engines' publishers bind only those or wildcards), with each release's own
`ZmqEventPublisher` loaded from its wheel (`tests/upstream_kv_events.py`).

* Their publisher feeds our subscriber: batches published before it subscribes (a cold
  start) and batches it loses live (a gap) are recovered from their replay socket, with
  no worker cleared, whatever framing the release uses (vLLM >= 0.26 and SGLang >=
  0.5.22 put the topic frame in replay replies).
* Our publisher answers a replay request frame for frame as theirs does.

vLLM 0.33.0 runs in the default tier, every other release under `-m slow`."""

from __future__ import annotations

import atexit
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from mambaradix import MambaRadixCache
from mambaradix.events import EventEmitter
from mambaradix.events.publisher import END_SEQ, ZmqPublisher
from mambaradix.events.releases import RELEASES
from mambaradix.events.wire import encode_batch
from mambaradix.index import Indexer
from mambaradix.index.feed import WorkerFeed
from mambaradix.index.subscriber import ZmqSubscriber
from upstream_kv_events import SGLANG, VLLM, kv_events

B = 4
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 9, 9, 9, 9, 0], [5, 5, 5, 5, 5, 5, 5, 5, 0]]
KEYS = [[1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8], [5] * 8, [1, 2, 3, 4, 9, 9, 9, 9]]


def each(names: list[str]) -> list[Any]:
    return [n if n == "vllm-0.33.0" else pytest.param(n, marks=pytest.mark.slow) for n in names]


def wait_until(done: Callable[[], bool], step: Callable[[], object], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out"
        step()


class Upstream:
    """Release `name`'s own publisher on ipc:// sockets, fed the batches of a tree with an
    emitter (`truth`: an indexer given the same events in-process)."""

    def __init__(self, name: str, where: Path, topic: str = "") -> None:
        self.name, self.up = name, kv_events(name)
        self.endpoints = (f"ipc://{where}/pub", f"ipc://{where}/replay")
        self.pub = self.up.ZmqEventPublisher(0, *self.endpoints, 100, topic=topic)
        self.tree = MambaRadixCache(page_size=1)
        self.emitter = EventEmitter(self.tree, B)
        self.truth = Indexer(B)
        self.truth.add_worker(1)
        self.published = 0

    def insert(self, i: int) -> list[Any]:
        """One batch (returned): a key with a state; a KV-only stream for SGLang, which
        sends no state events."""
        key = KEYS[i % 4] + [100 + i] * B
        self.tree.insert(key, list(range(1000 * i, 1000 * i + len(key))), state=i)
        events = self.emitter.take()
        if RELEASES[self.name].engine == "sglang":
            events = [e for e in events if getattr(e, "group", 0) in (0, None)]
        self.truth.apply(1, events)
        payload = encode_batch(events, self.name, ts=float(self.published))
        self.pub.publish(msgspec.msgpack.decode(payload, type=self.up.KVEventBatch))
        self.published += 1
        return events

    def flushed(self) -> bool:
        """Every batch handed over is in the publisher's replay buffer: its thread publishes
        from a queue, and a replay served before that would miss the queued ones (which the
        late SUB then never sees live either)."""
        return bool(self.pub._event_queue.unfinished_tasks == 0)

    def close(self) -> None:
        self.pub.shutdown()
        atexit.unregister(self.pub.shutdown)  # SGLang's registers itself; once is enough


class LossySubscriber(ZmqSubscriber):
    """Loses the live copies of chosen batches (their replays still arrive)."""

    lose: set[int] = set()

    def _handle(self, feed: WorkerFeed, is_replay: bool, frames: list[bytes]) -> int:
        if not is_replay and len(frames) == 3 and int.from_bytes(frames[1], "big") in self.lose:
            return 0
        return super()._handle(feed, is_replay, frames)


def _settles(sub: ZmqSubscriber, done: Callable[[], bool], timeout_s: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        sub.poll(0.02)
    return True


def recovered(name: str, where: Path, expect: str) -> dict[str, int]:
    """Batches 0-3 before we subscribe, then 4-7 with 5 and 6 lost live: the counts."""
    src = Upstream(name, where)
    sub = LossySubscriber(Indexer(B), timeout_s=5.0, release=expect)
    sub.lose = {5, 6}
    try:
        for i in range(4):
            src.insert(i)
        wait_until(src.flushed, lambda: time.sleep(0.01))
        sub.add(1, *src.endpoints)
        feed = sub.feeds[1]
        wait_until(lambda: feed.last == 3 and feed.waiting is None, lambda: sub.poll(0.02))
        time.sleep(0.3)  # the SUB connects (what is published before that is lost live)
        for i in range(4, 8):
            src.insert(i)
        # A loaded machine may connect the SUB later still: then a later live batch
        # reveals the gap (what comes live first is replayed from its predecessor on).
        while not _settles(sub, lambda: feed.last == src.published - 1 and not feed.waiting):
            assert src.published < 20, "no batch arrived live"
            src.insert(src.published)
        for q in PROMPTS + [KEYS[i % 4] + [100 + i] * B + [0] for i in range(src.published)]:
            assert sub.indexer.query(q)[1] == src.truth.query(q)[1]
        return dict(feed.counts)
    finally:
        sub.close()
        src.close()


@pytest.mark.parametrize("name", each(VLLM + SGLANG))
def test_their_replay_recovers_what_we_missed(name: str, tmp_path: Path) -> None:
    counts = recovered(name, tmp_path, expect=name)
    assert counts["replays"] >= 2  # the cold start, then the gap
    assert counts["cleared"] == 0 and counts["timeouts"] == 0
    assert counts["bad_frames"] == counts["bad_events"] == counts["dialect_mismatch"] == 0


def test_a_wrong_release_is_counted_and_still_read(tmp_path: Path) -> None:
    """vLLM 0.33.0's replies carry the topic frame; a subscriber told the worker runs
    0.25.1 (replies without one) counts each reply as a mismatch and reads it anyway."""
    counts = recovered("vllm-0.33.0", tmp_path, expect="vllm-0.25.1")
    # Counted (each replayed reply, how many depends on when the SUB connects: 4 to 7 seen
    # on a loaded machine) and read anyway (`recovered` compares every answer with the truth).
    assert counts["dialect_mismatch"] >= 1
    assert counts["cleared"] == 0 and counts["bad_frames"] == 0


def replay_frames(
    endpoint: str, start: int, replies: int, serve: Callable[[], object] = lambda: None
) -> list[list[bytes]]:
    """Ask `endpoint` for a replay from `start`; the messages up to the end marker (asked
    again until `replies` batches come: a publisher thread may not have them yet).
    `serve` runs while waiting (our publisher answers in the caller's thread)."""
    ctx = zmq.Context.instance()
    deadline = time.monotonic() + 10
    while True:
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(endpoint)
        got: list[list[bytes]] = []
        try:
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while time.monotonic() < deadline and not (got and END_SEQ in got[-1]):
                serve()
                if dealer.poll(10):
                    got.append(dealer.recv_multipart())
        finally:
            dealer.close(linger=0)
        if len(got) == replies + 1 or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


@pytest.mark.parametrize("name", each(VLLM + SGLANG))
def test_our_replay_answers_as_theirs(name: str, tmp_path: Path) -> None:
    (tmp_path / "theirs").mkdir()
    src = Upstream(name, tmp_path / "theirs", topic="kv-events")
    ours = ZmqPublisher(
        f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay", name, topic="kv-events"
    )
    try:
        for i in range(3):
            ours.publish(src.insert(i), ts=float(i))
        theirs = replay_frames(src.endpoints[1], 1, 2)
        mine = replay_frames(ours.replay_endpoint or "", 1, 2, lambda: ours.serve_replay(0.01))
        assert len(theirs) == 3 and mine == theirs
        # (b"", [topic,] seq, payload) twice, then the end marker
        assert [len(m) for m in mine] == ([4, 4, 4] if RELEASES[name].replay_topic else [3, 3, 3])
        assert mine[-1][-2:] == [END_SEQ, b""]
    finally:
        ours.close()
        src.close()
