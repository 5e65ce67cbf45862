"""WorkerFeed: sequence numbers, duplicates, gaps, replays, snapshots, malformed batches.

A clock is passed in by hand; the "publisher" is a list of encoded batches. The claim
under test: the feed never credits a block it has not seen stored (what it credits is
at most what the worker held at the last applied seq), and with a complete replay it
ends exactly where the worker is."""

from __future__ import annotations

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import given, settings

from mambaradix import MambaRadixCache
from mambaradix.events import AllBlocksCleared, BlockRemoved, BlockStored, EventEmitter
from mambaradix.events.publisher import SNAPSHOT_REQUEST
from mambaradix.events.wire import encode_batch
from mambaradix.index import Indexer, Overlap
from mambaradix.index.feed import WorkerFeed

X = BlockStored((1,), None, [1, 2], 2)
Y = BlockStored((2,), None, [3, 4], 2)
Z = BlockStored((3,), 2, [5, 6], 2)


def enc(*events: object) -> bytes:
    return encode_batch(list(events), "vllm")  # type: ignore[arg-type]


def seq(n: int) -> bytes:
    return n.to_bytes(8, "big")


def matched(ix: Indexer, tokens: list[int]) -> int:
    return ix.query(tokens + [0])[0].longest_matched


def feed() -> tuple[Indexer, WorkerFeed]:
    ix = Indexer(2)
    return ix, WorkerFeed(ix, 0, max_held=4, timeout_s=2.0)


def test_in_order_and_duplicates() -> None:
    ix, f = feed()
    f.offer(0, enc(X), 0.0)
    f.offer(1, enc(Y, Z), 0.0)
    f.offer(1, enc(BlockRemoved((2,))), 0.0)  # a duplicate seq is dropped, whatever it says
    f.offer(0, enc(AllBlocksCleared()), 0.0)
    assert matched(ix, [3, 4, 5, 6]) == 4 and matched(ix, [1, 2]) == 2
    assert f.counts["duplicates"] == 2 and f.take_request() is None


def test_a_gap_is_replayed_and_held_batches_follow() -> None:
    ix, f = feed()
    f.offer(0, enc(X), 0.0)
    f.offer(3, enc(Z), 0.0)
    f.offer(2, enc(BlockRemoved((1,))), 0.0)
    assert f.take_request() == seq(1) and f.waiting == "replay"
    assert matched(ix, [1, 2]) == 2  # nothing after the gap is applied yet
    f.offer(1, enc(Y), 0.1)  # the replay fills the gap: 1, then the held 2 and 3 apply
    f.offer(2, enc(BlockRemoved((1,))), 0.1)  # replayed again: a duplicate
    f.replay_ended(0.1)
    assert f.last == 3 and f.waiting is None
    assert matched(ix, [1, 2]) == 0 and matched(ix, [3, 4, 5, 6]) == 4


def test_a_gap_nobody_fills_clears_the_worker() -> None:
    ix, f = feed()
    f.offer(0, enc(X), 0.0)
    f.offer(2, enc(Y), 0.0)  # seq 1 (which removed X, say) is lost for good
    assert f.take_request() == seq(1)
    f.replay_ended(0.5)
    assert matched(ix, [1, 2]) == 0  # X may be gone: not credited any more
    assert matched(ix, [3, 4]) == 2 and f.last == 2 and f.counts["cleared"] == 1


def test_a_request_that_times_out_gives_up_the_same_way() -> None:
    ix, f = feed()
    f.offer(0, enc(X), 0.0)
    f.offer(2, enc(Y), 0.0)
    assert f.take_request() == seq(1)
    f.tick(1.0)
    assert f.waiting == "replay"
    f.tick(2.5)
    assert f.waiting is None and matched(ix, [1, 2]) == 0 and matched(ix, [3, 4]) == 2


def test_too_many_held_batches_give_up() -> None:
    ix, f = feed()
    f.offer(0, enc(X), 0.0)
    for s in range(2, 7):
        f.offer(s, enc(BlockStored((10 + s,), None, [s, s], 2)), 0.0)
    assert f.waiting is None and f.last == 6
    assert matched(ix, [1, 2]) == 0 and matched(ix, [6, 6]) == 2


def test_a_reset_batch_applies_across_a_gap() -> None:
    ix, f = feed()
    f.offer(0, enc(X), 0.0)
    f.offer(5, enc(AllBlocksCleared(), Y), 0.0)
    assert f.last == 5 and f.waiting is None
    assert matched(ix, [1, 2]) == 0 and matched(ix, [3, 4]) == 2


def test_cold_start_asks_from_zero() -> None:
    ix, f = feed()
    f.start_cold(0.0)
    assert f.take_request() == seq(0)
    f.offer(4, enc(Y), 0.0)  # live, while the replay is out: held
    f.offer(3, enc(X), 0.0)
    f.replay_ended(0.1)  # the publisher kept nothing from 0: resume from the oldest held
    assert f.last == 4 and matched(ix, [1, 2]) == 2 and matched(ix, [3, 4]) == 2


def test_malformed_batch_clears_and_waits_for_a_snapshot() -> None:
    ix, f = feed()
    f.offer(0, enc(X), 0.0)
    f.offer(1, b"\x00not msgpack", 0.0)
    assert f.take_request() == SNAPSHOT_REQUEST and matched(ix, [1, 2]) == 0
    f.offer(2, enc(Z), 0.1)  # held until the snapshot
    assert matched(ix, [3, 4, 5, 6]) == 0
    f.offer(1, enc(AllBlocksCleared(), Y), 0.2)  # the snapshot, tagged with the latest seq
    f.replay_ended(0.2)
    assert f.last == 2 and f.counts["snapshots"] == 1
    assert matched(ix, [3, 4, 5, 6]) == 4 and matched(ix, [1, 2]) == 0


def test_no_snapshot_comes_from_an_engine() -> None:
    ix, f = feed()
    f.offer(0, enc(X), 0.0)
    f.offer(1, b"junk", 0.0)
    assert f.take_request() == SNAPSHOT_REQUEST
    f.offer(2, enc(Y), 0.0)
    f.replay_ended(0.1)  # an engine answers the snapshot request with its end marker alone
    assert f.last == 2 and matched(ix, [1, 2]) == 0 and matched(ix, [3, 4]) == 2


def test_an_unreadable_removal_clears_and_keeps_what_follows() -> None:
    ix, f = feed()
    f.offer(0, enc(X), 0.0)
    bad = [0.0, [["BlockRemoved", "?"], ["BlockStored", [2], None, [3, 4], 2, None, "GPU"]]]
    f.offer(1, msgspec.msgpack.encode(bad), 0.0)
    assert matched(ix, [1, 2]) == 0 and matched(ix, [3, 4]) == 2
    assert f.take_request() == SNAPSHOT_REQUEST


def test_bad_events_are_counted_never_dropped_silently() -> None:
    """A bad store is skipped (the rest of its batch applied) and counted; so is an
    event of a type no release sends; a bad removal is counted too (it clears)."""
    ix, f = feed()
    bad_store = ["BlockStored", [9], None, [1, 2, 3], 2, None, "GPU"]  # 3 tokens, blocks of 2
    batch = [0.0, [bad_store, ["Mystery"], ["BlockStored", [1], None, [1, 2], 2, None, "GPU"]]]
    f.offer(0, msgspec.msgpack.encode(batch), 0.0)
    assert f.counts["bad_events"] == 2 and f.counts["malformed"] == 0
    assert matched(ix, [1, 2]) == 2
    f.offer(1, msgspec.msgpack.encode([0.0, [["BlockRemoved", []]]]), 0.0)
    assert f.counts["bad_events"] == 3 and f.counts["malformed"] == 1


def test_a_release_laid_out_otherwise_is_counted() -> None:
    ix = Indexer(2)
    f = WorkerFeed(ix, 0, release="sglang-0.5.15.post1")  # arrays; these are maps
    f.offer(0, encode_batch([X], "sglang-0.5.23"), 0.0)
    f.offer(1, encode_batch([Y], "sglang-0.5.15.post1"), 0.0)
    assert f.counts["dialect_mismatch"] == 1 and f.counts["applied"] == 2
    assert matched(ix, [1, 2]) == 2 and matched(ix, [3, 4]) == 2
    assert f.status()["release"] == "sglang-0.5.15.post1"
    with pytest.raises(ValueError, match="release must be one of auto, vllm, sglang"):
        WorkerFeed(ix, 1, release="vllm-9")


# ------------------------------------------------------------- random delivery


def stream(ops: list[tuple[int, int]]) -> tuple[list[list[object]], list[list[int]]]:
    """Batches from a small tree driven by `ops`, and prompts to probe."""
    tree = MambaRadixCache(page_size=1)
    em = EventEmitter(tree, 2)
    batches: list[list[object]] = []
    probes: list[list[int]] = []
    for i, (kind, arg) in enumerate(ops):
        if kind == 0:
            key = [arg % 3, arg // 3 % 3, 1, 2, arg % 2][: 2 + arg % 4]
            tree.insert(key, list(range(1000 * i, 1000 * i + len(key))), state=i)
            probes.append(key + [9])
        elif kind == 1:
            tree.evict(kv_tokens=1 + arg % 3)
        elif kind == 2:
            tree.evict(states=1)
        else:
            tree.reset()
        events = em.take()
        if events:
            batches.append(events)  # type: ignore[arg-type]
    return batches, probes


def truth(batches: list[list[object]], last: int | None) -> Indexer:
    ix = Indexer(2)
    ix.add_worker(0)
    for events in batches[: (last if last is not None else -1) + 1]:
        ix.apply(0, events)  # type: ignore[arg-type]
    return ix


def at_most(got: Overlap, want: Overlap) -> bool:
    return got.longest_matched <= want.longest_matched and got.usable <= want.usable


OPS = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 20)), min_size=1, max_size=25)
DELIVERY = st.lists(st.sampled_from(["send", "drop", "dup", "swap", "junk"]), max_size=40)


@settings(max_examples=80, deadline=None)
@given(ops=OPS, delivery=DELIVERY, replay=st.booleans())
def test_never_over_credits_and_catches_up(
    ops: list[tuple[int, int]], delivery: list[str], replay: bool
) -> None:
    batches, probes = stream(ops)
    payloads = [encode_batch(b, "vllm") for b in batches]  # type: ignore[arg-type]
    ix, f = feed()
    f.max_held = 1_000
    now, queue = 0.0, list(range(len(payloads)))

    def serve() -> None:  # the publisher: replays (and snapshots) when `replay`
        request = f.take_request()
        if request is None:
            return
        start = int.from_bytes(request, "big", signed=True)
        if replay and start >= 0:
            for s in range(start, len(payloads)):
                f.offer(s, payloads[s], now)
        elif replay and payloads:  # a snapshot of the latest published state
            last = len(payloads) - 1
            f.offer(last, encode_batch(truth(batches, last).dump(0), "vllm"), now)
        f.replay_ended(now)

    def check() -> None:
        want = truth(batches, f.last)
        for q in probes:
            assert at_most(ix.query(q)[0], want.query(q)[0]), q

    plan = iter(delivery)
    while queue:
        how = next(plan, "send")
        s = queue.pop(0)
        now += 0.01
        if how == "drop":
            continue
        if how == "swap" and queue:
            queue.insert(1, s)
            continue
        f.offer(s, b"\x01junk" if how == "junk" else payloads[s], now)
        if how == "dup":
            f.offer(s, payloads[s], now)
        serve()
        check()
    serve()
    f.tick(now + 10)
    check()
    if replay and payloads:  # nothing lost for good: caught up exactly
        f.offer(len(payloads) - 1, payloads[-1], now)  # a last live batch would reveal a gap
        serve()
        want = truth(batches, len(payloads) - 1)
        assert f.last == len(payloads) - 1
        for q in probes:
            assert ix.query(q)[0] == want.query(q)[0], q


def test_bad_settings_name_the_parameter() -> None:
    ix = Indexer(2)
    for kw, name in (
        ({"max_held": 0}, "max_held"),
        ({"timeout_s": -1.0}, "timeout_s"),
        ({"timeout_s": float("inf")}, "timeout_s"),  # a wait that never ends
        ({"timeout_s": float("nan")}, "timeout_s"),
    ):
        with pytest.raises(ValueError, match=name):
            WorkerFeed(ix, 1, **kw)  # type: ignore[arg-type]
    assert ix.worker_ids() == []


def test_a_live_stream_that_goes_back_is_a_restarted_publisher() -> None:
    """Live batches of one publisher come in strictly rising seq order (PUB/SUB never
    repeats or reorders): a live seq not above the previous live one means the publisher
    restarted, numbering from 0 again. What the old one stored is then gone."""
    ix, f = feed()
    for n, batch in enumerate((enc(X), enc(Y), enc(Z))):
        f.offer(n, batch, 0.0, live=True)
    assert matched(ix, [3, 4, 5, 6]) == 4
    f.offer(0, enc(BlockStored((7,), None, [9, 9], 2)), 1.0, live=True)  # the new process
    assert matched(ix, [1, 2]) == 0 and matched(ix, [3, 4, 5, 6]) == 0  # the old blocks
    assert matched(ix, [9, 9]) == 2 and f.last == 0  # the new stream, from its start
    assert f.counts["restarts"] == 1 and f.counts["cleared"] == 1
    f.offer(1, enc(BlockStored((8,), 7, [9, 8], 2)), 1.0, live=True)
    assert matched(ix, [9, 9, 9, 8]) == 4 and f.counts["duplicates"] == 0


def test_a_restart_first_seen_part_way_asks_the_new_publisher_from_zero() -> None:
    ix, f = feed()
    for n in range(3):
        f.offer(n, enc(X), 0.0, live=True)
    f.offer(1, enc(Y), 1.0, live=True)  # the new process's seq 0 was lost
    assert matched(ix, [1, 2]) == 0 and f.take_request() == seq(0)
    f.offer(0, enc(Z), 1.1)  # the replay, from the new publisher
    f.replay_ended(1.1)
    assert f.last == 1 and matched(ix, [3, 4]) == 2 and f.counts["restarts"] == 1


def test_replayed_and_held_batches_are_not_a_restart() -> None:
    ix, f = feed()
    f.offer(0, enc(X), 0.0, live=True)
    f.offer(2, enc(Z), 0.0, live=True)  # a gap: 1 is asked for
    f.offer(1, enc(Y), 0.1)  # replayed (not live): fills the gap
    f.offer(2, enc(Z), 0.1)  # replayed again: a duplicate, not a restart
    f.offer(3, enc(BlockRemoved((3,))), 0.2, live=True)
    assert f.counts["restarts"] == 0 and f.last == 3 and matched(ix, [3, 4]) == 2
