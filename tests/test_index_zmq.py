"""End to end on loopback: publisher -> ZMQ -> subscriber -> indexer -> HTTP.

Every socket binds 127.0.0.1 (or an ipc:// path in a temporary directory); every wait is
a loop bounded in time. The publisher and the subscriber run in this one thread, each
loop turn serving replays and polling."""

from __future__ import annotations

import atexit
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from mambaradix import MambaRadixCache
from mambaradix.events import EventEmitter
from mambaradix.events.publisher import END_SEQ, ZmqPublisher
from mambaradix.events.wire import encode_batch
from mambaradix.index import Indexer
from mambaradix.index.server import IndexServer
from mambaradix.index.subscriber import ZmqSubscriber
from upstream_kv_events import sglang_kv_events

pytestmark = pytest.mark.slow  # ZMQ sockets, subprocesses and timeouts

B = 4
LOOPBACK = "tcp://127.0.0.1:0"


def wait_until(
    done: Callable[[], bool], step: Callable[[], object], timeout_s: float = 10.0
) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out"
        step()


class Producer:
    """A tree with an emitter and a publisher; `truth` gets the same events in-process."""

    def __init__(self, publisher_cls: type[ZmqPublisher] | None = ZmqPublisher, **kw: Any) -> None:
        self.tree = MambaRadixCache(page_size=1)
        self.emitter = EventEmitter(self.tree, B)
        self.pub = (
            publisher_cls(LOOPBACK, LOOPBACK, snapshot=self.emitter.dump, **kw)
            if publisher_cls
            else None
        )
        self.truth = Indexer(B)
        self.truth.add_worker(1)
        self.n = 0

    def insert(self, key: list[int]) -> None:
        self.tree.insert(key, list(range(self.n, self.n + len(key))), state=self.n)
        self.n += len(key)
        self.flush()

    def flush(self) -> None:
        events = self.emitter.take()
        self.truth.apply(1, events)
        if self.pub is not None:
            self.pub.publish(events)


PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 9, 9, 9, 9, 0], [5, 5, 5, 5, 5, 5, 5, 5, 0]]


def keys(i: int) -> list[int]:
    return [[1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8], [5] * 8, [1, 2, 3, 4, 9, 9, 9, 9]][i % 4]


def same_answers(ix: Indexer, truth: Indexer) -> bool:
    return all(ix.query(q).get(1) == truth.query(q)[1] for q in PROMPTS)


def test_cold_start_gets_a_snapshot_when_the_buffer_is_short() -> None:
    prod = Producer(buffer_steps=2)
    for i in range(5):
        prod.insert(keys(i))
    prod.tree.evict(states=1)
    prod.flush()
    ix = Indexer(B)
    sub = ZmqSubscriber(ix)
    try:
        sub.add(1, prod.pub.endpoint, prod.pub.replay_endpoint)
        feed = sub.feeds[1]
        wait_until(
            lambda: feed.last == prod.pub.last_seq,
            lambda: (prod.pub.serve_replay(0.01), sub.poll(0.01)),
        )
        assert feed.counts["applied"] == 1  # one snapshot, not the six batches
        assert same_answers(ix, prod.truth)
        prod.insert([1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9])  # then live batches follow
        wait_until(lambda: feed.last == prod.pub.last_seq, lambda: sub.poll(0.01))
        assert same_answers(ix, prod.truth)
    finally:
        sub.close()
        prod.pub.close()


class LossyPublisher(ZmqPublisher):
    """Drops the live send of chosen batches; they stay in the replay buffer."""

    lose: set[int] = set()

    def _send(self, frames: list[bytes]) -> None:
        if int.from_bytes(frames[1], "big") not in self.lose:
            super()._send(frames)


def test_a_lost_batch_is_replayed() -> None:
    prod = Producer(LossyPublisher)
    LossyPublisher.lose = {1, 2}
    ix = Indexer(B)
    sub = ZmqSubscriber(ix)
    try:
        sub.add(1, prod.pub.endpoint, prod.pub.replay_endpoint)
        feed = sub.feeds[1]
        prod.insert(keys(0))
        wait_until(lambda: feed.last == 0, lambda: (prod.pub.serve_replay(0.01), sub.poll(0.01)))
        for i in (1, 2, 3):
            prod.insert(keys(i))  # seq 1 and 2 never arrive live; seq 3 reveals the gap
        wait_until(lambda: feed.last == 3, lambda: (prod.pub.serve_replay(0.01), sub.poll(0.01)))
        assert feed.counts["replays"] >= 2  # the cold start, then the gap
        assert feed.counts["cleared"] == 0
        assert same_answers(ix, prod.truth)
    finally:
        sub.close()
        prod.pub.close()


def test_sglang_publisher_feeds_our_subscriber(tmp_path: Path) -> None:
    """SGLang 0.5.15.post1's own ZmqEventPublisher (ipc:// sockets: it binds only those
    or wildcards) publishes our SGLang-format batches; our subscriber replays from 0."""
    up = sglang_kv_events()
    prod = Producer(None)
    publisher = up.ZmqEventPublisher(
        0, f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay", buffer_steps=100
    )
    ix = Indexer(B)
    sub = ZmqSubscriber(ix)
    try:
        for i in range(4):
            prod.tree.insert(keys(i), list(range(1000 * i, 1000 * i + len(keys(i)))), state=i)
            events = prod.emitter.take()
            prod.truth.apply(1, events)
            payload = encode_batch(events, "sglang-0.5.15.post1")
            batch = msgspec.msgpack.decode(payload, type=up.KVEventBatch)
            publisher.publish(batch)
        sub.add(1, f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay")
        wait_until(lambda: sub.feeds[1].last == 3, lambda: sub.poll(0.02))
        for q in PROMPTS:  # a KV-only stream: the overlap, and no state proven
            got, want = ix.query(q)[1], prod.truth.query(q)[1]
            assert (got.longest_matched, got.usable) == (want.longest_matched, 0)
    finally:
        sub.close()
        publisher.shutdown()
        atexit.unregister(publisher.shutdown)  # it registered itself; once is enough


# ------------------------------------------------------------------------ HTTP


def request(url: str, body: Any = None) -> tuple[int, Any]:
    data = (
        None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    )
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data), timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def server() -> Any:
    prod = Producer(None)
    prod.insert([1, 2, 3, 4, 5, 6, 7, 8])
    prod.tree.insert(
        [1, 2, 3, 4], [0, 1, 2, 3], state=99, prev_prefix_len=4
    )  # a state at 4, KV to 8
    prod.flush()
    srv = IndexServer(("127.0.0.1", 0), prod.truth, threading.Lock(), read_timeout_s=2.0)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()
    thread.join(5)
    srv.server_close()


def test_http_query_workers_dump(server: str) -> None:
    status, body = request(
        server + "/query", {"model_name": "default", "token_ids": [1, 2, 3, 4, 5, 6, 7, 8, 0]}
    )
    assert status == 200
    assert body == {
        "instances": {"1": {"longest_matched": 8, "gpu": 8, "usable": 8, "tail_recompute": 0}},
        "block_size": B,
    }
    status, body = request(
        server + "/query", {"model_name": "default", "token_ids": [1, 2, 3, 4, 5, 6, 7, 8]}
    )
    assert body["instances"]["1"] == {
        "longest_matched": 8,
        "gpu": 8,
        "usable": 4,
        "tail_recompute": 4,
    }
    status, body = request(server + "/workers")
    assert status == 200 and body[0]["instance_id"] == 1 and body[0]["states"] == 2
    status, body = request(server + "/dump")
    assert status == 200 and body["workers"]["1"][0] == {"type": "AllBlocksCleared"}
    assert [e["token_ids"] for e in body["workers"]["1"][1:]] == [[1, 2, 3, 4]] * 2 + [
        [5, 6, 7, 8]
    ] * 2


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/query", b"{not json", 400, "not JSON"),
        ("/query", [1, 2], 400, "JSON object"),
        ("/query", {"token_ids": "abc"}, 400, "token_ids"),
        ("/query", {"token_ids": [1, True]}, 400, "token_ids"),
        ("/query", {"token_ids": [2**70]}, 400, "64-bit"),
        ("/query", {"model_name": "other", "token_ids": [1]}, 404, "model_name"),
        ("/nope", {"token_ids": [1]}, 404, "unknown path"),
    ],
)
def test_http_bad_requests(server: str, path: str, body: Any, status: int, message: str) -> None:
    got, answer = request(server + path, body)
    assert got == status and message in answer["error"]


# ------------------------------------------------------------------------- CLI


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "mambaradix.cli", "index", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "1=http://x"], "tcp://"),
        (["--workers", "x=tcp://127.0.0.1:1"], "WORKER_ID=ENDPOINT"),
        (["--workers", "1=tcp://127.0.0.1:1,1=tcp://127.0.0.1:2"], "twice"),
        (["--workers", "1=tcp://127.0.0.1:1", "--block-size", "0"], "positive int"),
        (["--workers", "1=tcp://127.0.0.1:1", "--replay", "2=tcp://127.0.0.1:2"], "worker 2"),
        (["--workers", "1=tcp://127.0.0.1:1", "--port", "70000"], "port"),
    ],
)
def test_cli_bad_input(args: list[str], message: str) -> None:
    done = run_cli(*args)
    assert done.returncode == 2 and message in done.stderr
    assert done.stdout == ""


W1 = ["--workers", "1=tcp://127.0.0.1:1"]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        # every wait must stay bounded: no infinite --timeout (nor --duration)
        (
            [*W1, "--timeout", "inf"],
            "argument --timeout: expected a positive finite number of seconds, got 'inf'",
        ),
        (
            [*W1, "--duration", "1e400"],
            "argument --duration: expected a positive finite number of seconds, got '1e400'",
        ),
        # what only binding or connecting finds is still bad input: exit 2, the option named
        (["--workers", "1=tcp://127.0.0.1"], "--workers 1=tcp://127.0.0.1: Invalid argument"),
        ([*W1, "--replay", "1=tcp://127.0.0.1:"], "--replay 1=tcp://127.0.0.1:: Invalid argument"),
        ([*W1, "--host", "no-such-host.invalid", "--port", "0"], "--host no-such-host.invalid "),
        ([*W1, "--replay", "2=tcp://127.0.0.1:2"], "worker 2 is not in --workers"),
        # ZMQ connects to tcp://host:99999 without a word (no such port exists)
        (["--workers", "1=tcp://127.0.0.1:99999"], "'tcp://127.0.0.1:99999' has no port 1-65535"),
        ([*W1, "--replay", "1=tcp://127.0.0.1:0"], "'tcp://127.0.0.1:0' has no port 1-65535"),
        # a release nobody ships: named, with the ones that exist
        (
            [*W1, "--release", "vllm-0.99.0"],
            "argument --release: release must be one of auto, vllm, sglang, vllm-0.24.0, ",
        ),
        ([*W1, "--release", "1=sglang-0.6"], "sglang-0.5.23; got 'sglang-0.6'"),
        ([*W1, "--release", "x=vllm"], "expected NAME or WORKER_ID=NAME, got 'x=vllm'"),
        ([*W1, "--release", "1=vllm,1=sglang"], "that worker's release is given twice"),
        ([*W1, "--release", "2=vllm"], "worker 2 is not in --workers"),
    ],
)
def test_cli_refuses_with_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], line: str
) -> None:
    from mambaradix.cli import main

    assert main(["index", *args, "--duration", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("mambaradix index: error: ") and line in err
    assert len(err.strip().splitlines()) == 1


def test_cli_port_in_use(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    from mambaradix.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["index", *W1, "--port", str(port), "--duration", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"mambaradix index: error: --host 127.0.0.1 --port {port}: ")
    assert "in use" in err


def test_http_errors_are_json(server: str) -> None:
    # an unsupported method, a bad request line: the same {"error": ...} as every error
    import http.client

    host, port = server.removeprefix("http://").split(":")
    for method, path in (("PUT", "/query"), ("DELETE", "/workers"), ("GET /x", "y")):
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        conn.request(method, path)
        answer = conn.getresponse()
        assert answer.status in (400, 501)
        assert answer.getheader("Content-Type") == "application/json"
        assert "error" in json.loads(answer.read())
        conn.close()


def test_http_a_stalled_client_is_dropped(server: str) -> None:
    # a client that announces 100 bytes and sends one must not hold its thread forever
    import socket

    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /query HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
        start = time.monotonic()
        reply = s.recv(4096)  # the server answers (or closes) once its read times out
        assert time.monotonic() - start < 10
    assert reply == b"" or b" 408 " in reply.split(b"\r\n")[0]


def test_cli_serves_what_it_is_fed() -> None:
    prod = Producer()
    prod.insert([1, 2, 3, 4, 5, 6, 7, 8])
    prod.tree.insert([1, 2, 3, 4], [0, 1, 2, 3], state=99, prev_prefix_len=4)
    prod.flush()
    args = [
        "--block-size",
        str(B),
        "--workers",
        f"1={prod.pub.endpoint}",
        "--replay",
        f"1={prod.pub.replay_endpoint}",
        "--port",
        "0",
        "--duration",
        "20",
        "--release",
        "1=vllm-0.33.0",
    ]
    cmd = [sys.executable, "-m", "mambaradix.cli", "index", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("mambaradix index: listening on http://127.0.0.1:")
        url = line.split()[-1] + "/query"
        query = {"model_name": "default", "token_ids": [1, 2, 3, 4, 5, 6, 7, 8]}
        answer: dict[str, Any] = {}

        def ask() -> None:
            prod.pub.serve_replay(0.02)
            answer.update(request(url, query)[1])

        want = {"longest_matched": 8, "gpu": 8, "usable": 4, "tail_recompute": 4}
        # waits for both batches (a query between them sees the first alone: usable 0)
        wait_until(lambda: answer.get("instances", {}).get("1") == want, ask)
        status, workers = request(line.split()[-1] + "/workers")
        assert status == 200 and workers[0]["release"] == "vllm-0.33.0"
        assert workers[0]["counts"]["dialect_mismatch"] == workers[0]["counts"]["bad_events"] == 0
    finally:
        proc.terminate()
        assert proc.wait(10) == 143  # 128 + SIGTERM, as every command exits on it
        prod.pub.close()


def test_bad_addresses_leave_nothing_behind() -> None:
    ix = Indexer(B)
    sub = ZmqSubscriber(ix)
    with pytest.raises(zmq.ZMQError):
        sub.add(1, "tcp://127.0.0.1:1", "tcp://no-such-host-name:-1")
    assert sub.feeds == {} and ix.worker_ids() == []
    with pytest.raises(ValueError, match="release must be one of .* got 'json'"):
        ZmqPublisher(LOOPBACK, release="json")
    with pytest.raises(ValueError, match="buffer_steps"):
        ZmqPublisher(LOOPBACK, buffer_steps=0)
    sub.close()


def _terminates(ctx: zmq.Context[zmq.Socket[bytes]]) -> bool:
    """Whether `ctx` terminates: it does not while any of its sockets is open."""
    done = threading.Thread(target=ctx.term, daemon=True)
    done.start()
    done.join(timeout=2.0)
    return not done.is_alive()


def test_bad_arguments_name_themselves_and_leak_no_socket() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ix = Indexer(B)
    sub = ZmqSubscriber(ix, context=ctx)
    with pytest.raises(ValueError, match="worker_id"):
        sub.add(-1, "tcp://127.0.0.1:1", "tcp://127.0.0.1:2")
    assert sub.feeds == {} and ix.worker_ids() == []
    for bad in (-1.0, float("nan"), float("inf"), "1"):
        with pytest.raises((TypeError, ValueError), match="timeout_s"):
            sub.poll(bad)  # type: ignore[arg-type]
        with pytest.raises((TypeError, ValueError), match="timeout_s"):
            ZmqSubscriber(ix, timeout_s=bad, context=ctx)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="indexer"):
        ZmqSubscriber(None, context=ctx)  # type: ignore[arg-type]
    for kw, name in (
        ({"topic": 5}, "topic"),
        ({"rank": "0"}, "rank"),
        ({"snapshot": 5}, "snapshot"),
    ):
        with pytest.raises((TypeError, ValueError), match=name):
            ZmqPublisher(LOOPBACK, context=ctx, **kw)  # type: ignore[arg-type]
    sub.close()
    assert _terminates(ctx)


def test_serve_replay_waits_a_bounded_time() -> None:
    pub = ZmqPublisher(LOOPBACK, LOOPBACK)
    try:
        for bad in (-1.0, float("nan"), float("inf"), "1"):  # -1 was ZMQ's "wait forever"
            with pytest.raises((TypeError, ValueError), match="timeout_s"):
                pub.serve_replay(bad)  # type: ignore[arg-type]
    finally:
        pub.close()


def test_a_replay_endpoint_nobody_serves_never_blocks(tmp_path: Path) -> None:
    """Requests to a replay socket nobody binds queue up in ZMQ until its high-water mark
    (1000 by default; 1 here), after which a blocking send would wait forever."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ctx.setsockopt(zmq.SNDHWM, 1)  # the default of the sockets made from it
    prod = Producer(LossyPublisher)
    LossyPublisher.lose = set(range(1, 40, 2))  # every odd batch: a gap, a request each
    sub = ZmqSubscriber(Indexer(B), timeout_s=0.01, context=ctx)
    sub.add(1, prod.pub.endpoint, f"ipc://{tmp_path}/nobody")

    def drive() -> None:
        for i in range(40):
            prod.insert(keys(i) + [100 + i] * B)  # a new block: one batch each
            sub.poll(0.02)

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    thread.join(timeout=20.0)
    LossyPublisher.lose = set()
    # a socket blocked in another thread must not be closed (libzmq aborts): left behind
    assert not thread.is_alive(), "the subscriber blocked on a replay request"
    try:
        assert sub.feeds[1].counts["replays"] >= 3
        for q in PROMPTS:  # what arrived is applied, and nothing more
            got, want = sub.indexer.query(q).get(1), prod.truth.query(q)[1]
            assert got is not None and got.longest_matched <= want.longest_matched
    finally:
        sub.close()
        prod.pub.close()


def test_a_late_end_marker_does_not_end_the_next_replay() -> None:
    """A replay request that timed out may still be answered; its end marker must not be
    taken for the end of the request sent after it (the protocol has no request ids)."""
    tree = MambaRadixCache(page_size=1)
    emitter = EventEmitter(tree, B)
    truth = Indexer(B)
    truth.add_worker(1)
    payloads = []
    for i in range(3):  # three batches, seq 0-2
        tree.insert(keys(i), list(range(10 * i, 10 * i + len(keys(i)))), state=i)
        events = emitter.take()
        truth.apply(1, events)
        payloads.append(encode_batch(events))
    ctx = zmq.Context.instance()
    pub, router = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
    for sock in (pub, router):
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(LOOPBACK)
    sub = ZmqSubscriber(Indexer(B), timeout_s=0.5)
    try:
        endpoints = [s.getsockopt_string(zmq.LAST_ENDPOINT) for s in (pub, router)]
        sub.add(1, *endpoints)
        feed = sub.feeds[1]
        sub.poll(0.01)  # sends the cold start's request (from seq 0)
        assert router.poll(5000), "no cold-start request"
        first = router.recv_multipart()
        wait_until(lambda: feed.waiting is None, lambda: sub.poll(0.05))  # unanswered: gave up
        assert feed.counts["cleared"] == 1
        # seq 2 arrives live; 0 and 1 are missing, so a second request goes out
        live = [b"", (2).to_bytes(8, "big"), payloads[2]]
        wait_until(
            lambda: feed.waiting == "replay", lambda: (pub.send_multipart(live), sub.poll(0.05))
        )
        assert router.poll(5000), "no request for the gap"
        second = router.recv_multipart()
        while router.poll(0):  # the live sends above may have asked more than once
            second = router.recv_multipart()
        assert second[-1] == (0).to_bytes(8, "big")
        router.send_multipart([first[0], b"", END_SEQ, b""])  # the first request's late end
        deadline = time.monotonic() + 0.2  # well inside the 0.5 s the second may take
        while time.monotonic() < deadline:
            sub.poll(0.02)
        assert feed.waiting == "replay", "the first request's end marker ended the second"
        for seq in (0, 1):
            router.send_multipart([second[0], b"", seq.to_bytes(8, "big"), payloads[seq]])
        router.send_multipart([second[0], b"", END_SEQ, b""])
        wait_until(lambda: feed.last == 2 and feed.waiting is None, lambda: sub.poll(0.02))
        assert feed.counts["cleared"] == 1  # only the cold start's give-up
        assert all(sub.indexer.query(q).get(1) == truth.query(q)[1] for q in PROMPTS)
    finally:
        sub.close()
        pub.close(linger=0)
        router.close(linger=0)


def test_a_restarted_publisher_is_not_credited_with_its_old_blocks(tmp_path: Path) -> None:
    """The publisher process restarts on the same endpoints and numbers from 0 again: what
    the old one stored is gone, and what the new one stores is credited."""
    endpoints = (f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay")
    old, new = Producer(publisher_cls=None), Producer(publisher_cls=None)
    old.pub = ZmqPublisher(*endpoints, snapshot=old.emitter.dump)
    ix = Indexer(B)
    sub = ZmqSubscriber(ix, timeout_s=1.0)
    try:
        sub.add(1, *endpoints)
        feed = sub.feeds[1]
        wait_until(
            lambda: feed.waiting is None, lambda: (old.pub.serve_replay(0.01), sub.poll(0.01))
        )
        time.sleep(0.2)  # the SUB connects (what is published before that is lost)
        for i in range(4):
            old.insert(keys(i))
        wait_until(lambda: feed.last == 3, lambda: (old.pub.serve_replay(0.01), sub.poll(0.01)))
        assert same_answers(ix, old.truth) and ix.query(PROMPTS[0])[1].longest_matched == 8
        old.pub.close()
        new.pub = ZmqPublisher(*endpoints, snapshot=new.emitter.dump)  # the new process
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:  # the SUB reconnects
            sub.poll(0.05)
        new.insert([5] * 8)  # seq 0, 1: below the old publisher's last live seq, 3
        new.insert([7] * 8)
        wait_until(
            lambda: feed.last == new.pub.last_seq and feed.waiting is None,
            lambda: (new.pub.serve_replay(0.01), sub.poll(0.01)),
        )
        assert feed.counts["restarts"] == 1
        assert same_answers(ix, new.truth)
        assert ix.query(PROMPTS[0])[1].longest_matched == 0  # the old process's blocks
        assert ix.query([7] * 8 + [0])[1].longest_matched == 8
    finally:
        sub.close()
        for prod in (old, new):
            if prod.pub is not None:
                prod.pub.close()
