"""One worker's event stream into an `Indexer`: sequence numbers, gaps, replays, snapshots.

Batches arrive as `(seq, payload)` from a ZMQ subscription or from a replay. The rules
keep one promise: **everything credited was seen stored and not seen removed since**.

1. Batches apply in seq order; a duplicate (seq <= last applied) is dropped.
2. A gap (seq > last + 1) holds later batches (at most `max_held`) and asks for a replay
   from last + 1; the replayed batches fill it, then the held ones apply.
3. A batch that starts with `AllBlocksCleared` (a reset, or a publisher's snapshot)
   applies as soon as it is newer: nothing before it matters.
4. A gap that the replay cannot fill (its end marker arrives, it times out, or too many
   batches wait) clears the worker and resumes from the oldest held batch: what is
   credited afterwards was stored afterwards.
5. A batch that cannot be read, or has an unreadable removal, clears the worker (keeping
   what follows the bad event) and asks for a snapshot; later batches wait for it until
   it comes or times out (an engine's publisher has no snapshots: rule 4 then applies).
6. A first batch other than seq 0 asks for a replay from 0 (a cold start).
7. A live batch (from the subscription, not a replay) whose seq is not above the previous
   live one means the publisher restarted: one publisher's live batches arrive in rising
   seq order, and a new process numbers from 0 again. The worker is cleared and the feed
   starts over as at a cold start, from this batch. (A restart is missed only when the
   first live batch seen from the new process is numbered above the old one's last.)

Nothing is dropped without a count (`counts`, shown by `GET /workers`): an unreadable
event (`bad_events`; the rest of its batch applies), an unreadable batch (`malformed`), a
message that is no batch or end marker (`bad_frames`, counted by the subscriber), a
batch or replay frame laid out as another release than the worker's (`dialect_mismatch`).
"""

from __future__ import annotations

import logging

from mambaradix.events.model import AllBlocksCleared
from mambaradix.events.publisher import SNAPSHOT_REQUEST, check_seconds
from mambaradix.events.releases import AUTO, Release, ingest_release
from mambaradix.events.wire import MAPS, DecodedBatch, MalformedBatch, decode_batch
from mambaradix.index.indexer import Indexer

log = logging.getLogger("mambaradix.index")


class WorkerFeed:
    """Sequencing for one worker. Call `offer` per batch, `replay_ended` when a replay's
    end marker arrives and `tick` now and then; send what `take_request` returns.

    `release` is the release the worker runs ("auto": any). Every listed release is read
    whatever it says; a batch or replay frame laid out as another release lays it out
    is counted (`dialect_mismatch`), so a misconfigured worker shows in the stats."""

    def __init__(
        self,
        indexer: Indexer,
        worker_id: int,
        max_held: int = 10_000,
        timeout_s: float = 2.0,
        release: str | Release = AUTO,
    ) -> None:
        if isinstance(max_held, bool) or not isinstance(max_held, int) or max_held < 1:
            raise ValueError(f"max_held must be a positive int, got {max_held!r}")
        check_seconds("timeout_s", timeout_s, positive=True)
        self.release = ingest_release(release)
        self.indexer, self.worker_id = indexer, worker_id
        self.max_held, self.timeout_s = max_held, timeout_s
        self.last: int | None = None
        self.held: dict[int, DecodedBatch] = {}
        self.waiting: str | None = None  # "replay" or "snapshot" while a request is out
        self._since = 0.0
        self._request: bytes | None = None
        self._in_flight = 0  # requests sent whose end marker has not arrived
        self.counts = dict.fromkeys(
            (
                "applied",
                "duplicates",
                "replays",
                "malformed",
                "cleared",
                "snapshots",
                "timeouts",
                "restarts",
                "bad_events",  # events skipped as unreadable (the batch was applied)
                "bad_frames",  # ZMQ messages that are no batch, replay reply or end marker
                "dialect_mismatch",  # batches or replay frames of another release
            ),
            0,
        )
        self._live_last: int | None = None  # the seq of the latest live batch
        # Bumped when requests in flight are forgotten (a timeout, a restart): their late
        # answers must then be dropped by the transport (see ZmqSubscriber).
        self.forgotten = 0
        if worker_id not in indexer.worker_ids():
            indexer.add_worker(worker_id)

    def status(self) -> dict[str, object]:
        release = AUTO if self.release is None else self.release.name
        return {
            "last_seq": self.last,
            "held": len(self.held),
            "waiting": self.waiting,
            "release": release,
        }

    def replay_framed(self, topic: bool) -> None:
        """A replay frame arrived with (`topic`) or without a topic frame."""
        if self.release is not None and self.release.replay_topic != topic:
            self._mismatch("replay replies " + ("with" if topic else "without") + " a topic")

    def start_cold(self, now: float) -> None:
        """Ask for everything so far (a replay from 0; our publisher answers a snapshot
        when its buffer no longer reaches back): a router that starts late catches up."""
        if self.last is None and self.waiting is None:
            self._ask_replay(0, now)

    def take_request(self) -> bytes | None:
        """The replay request to send now (8 bytes), if one is due."""
        out, self._request = self._request, None
        self._in_flight += out is not None
        return out

    def offer(self, seq: int, payload: bytes, now: float, live: bool = False) -> None:
        """One batch: `live` when it came from the subscription, not from a replay."""
        if live:
            if self._live_last is not None and seq <= self._live_last:
                self._restart(seq, now)
            self._live_last = seq
        snapshot_wait = self.waiting == "snapshot"
        if self.last is not None and seq <= self.last and not (snapshot_wait and seq == self.last):
            self.counts["duplicates"] += 1
            return
        try:
            batch = decode_batch(payload, self.release)
        except MalformedBatch as e:
            return self._bad(seq, None, str(e), now)
        if batch.problems:
            self.counts["bad_events"] += len(batch.problems)
            log.warning("worker %s seq %s: %s", self.worker_id, seq, "; ".join(batch.problems))
        release = self.release
        if release is not None and batch.layout and (batch.layout == MAPS) != release.event_maps:
            self._mismatch(f"events as {batch.layout}")
        if batch.unsafe:
            return self._bad(seq, batch, "a removal could not be read", now)
        if batch.events and isinstance(batch.events[0], AllBlocksCleared):  # rule 3
            self.counts["snapshots"] += snapshot_wait
            self.waiting = None
            return self._apply(seq, batch, now)
        if self.last is not None and seq == self.last:  # the snapshot we wait for is not this
            self.counts["duplicates"] += 1
            return None
        if not snapshot_wait and seq == (0 if self.last is None else self.last + 1):
            return self._apply(seq, batch, now)
        self._hold(seq, batch, now)

    def replay_ended(self, now: float) -> None:
        """A replay's end marker arrived: a gap still open then cannot be filled."""
        self._in_flight = max(0, self._in_flight - 1)
        if self.waiting is not None and self._in_flight == 0 and self._request is None:
            self._give_up(f"the {self.waiting} did not fill the gap", now)

    def tick(self, now: float) -> None:
        if self.waiting is not None and now - self._since > self.timeout_s:
            self._in_flight = 0
            self.forgotten += 1
            self.counts["timeouts"] += 1
            self._give_up(f"no answer to the {self.waiting} request in {self.timeout_s} s", now)

    # ----------------------------------------------------------------- helpers

    def _mismatch(self, what: str) -> None:
        if not self.counts["dialect_mismatch"]:
            assert self.release is not None
            log.warning("worker %s sends %s, unlike %s", self.worker_id, what, self.release.name)
        self.counts["dialect_mismatch"] += 1

    def _apply(self, seq: int, batch: DecodedBatch, now: float) -> None:
        self.indexer.apply(self.worker_id, batch.events)
        self.last = seq
        self.counts["applied"] += 1
        self._drain(now)

    def _drain(self, now: float) -> None:
        """Apply held batches that now follow in order; ask for what still misses."""
        if self.waiting == "snapshot" or self.last is None:
            return
        for seq in [s for s in self.held if s <= self.last]:
            del self.held[seq]
        while self.last + 1 in self.held:
            self.last += 1
            self.indexer.apply(self.worker_id, self.held.pop(self.last).events)
            self.counts["applied"] += 1
        if not self.held:
            self.waiting = None
        elif self.waiting is None:
            self._ask_replay(self.last + 1, now)

    def _hold(self, seq: int, batch: DecodedBatch, now: float) -> None:
        self.held[seq] = batch
        if len(self.held) > self.max_held:
            return self._give_up(f"more than {self.max_held} batches wait", now)
        if self.waiting is None:
            self._ask_replay(0 if self.last is None else self.last + 1, now)

    def _ask_replay(self, start: int, now: float) -> None:
        log.warning("worker %s: asking a replay from seq %s", self.worker_id, start)
        self.counts["replays"] += 1
        self.waiting, self._since, self._request = "replay", now, start.to_bytes(8, "big")

    def _bad(self, seq: int, batch: DecodedBatch | None, why: str, now: float) -> None:
        log.warning("worker %s seq %s (%s): cleared, asking a snapshot", self.worker_id, seq, why)
        self.counts["malformed"] += 1
        self._clear()
        if batch is not None:
            self.indexer.apply(self.worker_id, batch.events[batch.trusted_from :])
        self.last = seq if self.last is None else max(self.last, seq)
        self.waiting, self._since, self._request = "snapshot", now, SNAPSHOT_REQUEST

    def _restart(self, seq: int, now: float) -> None:
        """Rule 7: forget the old publisher (its blocks, held batches and requests)."""
        log.warning(
            "worker %s: live seq %s after %s: the publisher restarted; cleared",
            self.worker_id,
            seq,
            self._live_last,
        )
        self.counts["restarts"] += 1
        self._clear()
        self.last, self.waiting, self._request = None, None, None
        self.held.clear()
        self._in_flight = 0
        self.forgotten += 1

    def _clear(self) -> None:
        self.indexer.clear_worker(self.worker_id)
        self.counts["cleared"] += 1

    def _give_up(self, why: str, now: float) -> None:
        """Rule 4 (rule 5 when no snapshot comes: the worker is already cleared)."""
        log.warning("worker %s: %s; resuming from the batches that follow", self.worker_id, why)
        if self.waiting != "snapshot":
            self._clear()
            if self.held:
                self.last = min(self.held) - 1
        self.waiting, self._request = None, None
        self._drain(now)
