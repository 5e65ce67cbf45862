"""`mambaradix index`: the indexer as a process, fed by ZMQ publishers, queried over HTTP.

    mambaradix index --block-size 16 --workers 1=tcp://127.0.0.1:5557,2=tcp://127.0.0.1:5559 \\
        --replay 1=tcp://127.0.0.1:5558 --release 1=vllm-0.33.0,2=sglang-0.5.23 --port 8090

`--release` names what the workers run (see `events/releases.py`): NAME for all of them,
ID=NAME for one; "auto" (the default) reads every listed release. Every release is read
whatever it says; a stream laid out otherwise is counted as `dialect_mismatch` in
`GET /workers`.

Binds HTTP on 127.0.0.1 unless `--host` says otherwise; prints one line with the address
once it listens; stops after `--duration` seconds (exit 0) or on SIGINT, SIGTERM or
SIGHUP (exit 130, 143, 129).
"""

from __future__ import annotations

import argparse
import logging
import math
import signal
import sys
import threading
import time
from typing import Any

from mambaradix.events.releases import ingest_release

# signals that stop the server (SIGHUP does not exist on Windows)
STOP = (signal.SIGINT, signal.SIGTERM) + (() if sys.platform == "win32" else (signal.SIGHUP,))


def _endpoints(text: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        wid, sep, endpoint = item.partition("=")
        if not sep or not wid.strip().isdigit():
            raise argparse.ArgumentTypeError(f"expected WORKER_ID=ENDPOINT, got {item!r}")
        if not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            raise argparse.ArgumentTypeError(f"{endpoint!r} is not a tcp://, ipc:// or inproc://")
        port = endpoint.rpartition(":")[2]
        if endpoint.startswith("tcp://") and port.isdigit() and not 0 < int(port) <= 65535:
            # ZMQ would connect to it without a word
            raise argparse.ArgumentTypeError(f"{endpoint!r} has no port 1-65535")
        if int(wid) in out:
            raise argparse.ArgumentTypeError(f"worker {int(wid)} is given twice")
        out[int(wid)] = endpoint
    if not out:
        raise argparse.ArgumentTypeError("expected at least one WORKER_ID=ENDPOINT")
    return out


def _releases(text: str) -> dict[int | None, str]:
    """NAME (every worker) and/or ID=NAME items, separated by commas."""
    out: dict[int | None, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        wid, sep, name = item.rpartition("=")
        if sep and not wid.strip().isdigit():
            raise argparse.ArgumentTypeError(f"expected NAME or WORKER_ID=NAME, got {item!r}")
        key = int(wid) if sep else None
        if key in out:
            raise argparse.ArgumentTypeError(f"{item!r}: that worker's release is given twice")
        try:
            ingest_release(name.strip())
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        out[key] = name.strip()
    return out


def _ids(text: str) -> set[int]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not all(x.isdigit() for x in items):
        raise argparse.ArgumentTypeError(f"expected worker ids separated by commas, got {text!r}")
    return {int(x) for x in items}


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return int(text)


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port 0-65535, got {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value > 0 and math.isfinite(value)):  # every wait stays bounded
        raise argparse.ArgumentTypeError(
            f"expected a positive finite number of seconds, got {text!r}"
        )
    return value


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "index", help="a hybrid-aware KV indexer fed by engine events, queried over HTTP"
    )
    p.add_argument("--block-size", type=_positive_int, default=16, help="tokens per block")
    p.add_argument(
        "--workers", type=_endpoints, required=True, help="ID=PUB_ENDPOINT,... of the publishers"
    )
    p.add_argument("--replay", type=_endpoints, default={}, help="ID=REPLAY_ENDPOINT,...")
    p.add_argument(
        "--release",
        type=_releases,
        default={},
        help="what the workers run: NAME or ID=NAME,... (vllm-0.33.0, sglang-0.5.23, ...; "
        "default auto: any)",
    )
    p.add_argument(
        "--attention-workers", type=_ids, default=set(), help="IDs of attention-only models"
    )
    p.add_argument("--host", default="127.0.0.1", help="HTTP address (default loopback)")
    p.add_argument("--port", type=_port, default=8090, help="HTTP port (0: any free one)")
    p.add_argument("--model-name", default="default", help="the model_name queries must carry")
    p.add_argument(
        "--timeout", type=_seconds, default=2.0, help="seconds to wait for a replay or snapshot"
    )
    p.add_argument("--duration", type=_seconds, default=None, help="exit after this many seconds")
    p.set_defaults(func=run)


def _error(message: str) -> int:
    print(f"mambaradix index: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    named = {w for w in args.release if w is not None}
    unknown = sorted((set(args.replay) | args.attention_workers | named) - set(args.workers))
    if unknown:
        return _error(f"worker {unknown[0]} is not in --workers")
    try:
        import zmq

        from mambaradix.index.indexer import Indexer
        from mambaradix.index.server import IndexServer
        from mambaradix.index.subscriber import ZmqSubscriber
    except ImportError as e:
        return _error(f"needs the events extra ({e.name} is missing)")
    logging.basicConfig(level=logging.WARNING, format="mambaradix index: %(message)s")
    indexer = Indexer(args.block_size)
    for wid in args.workers:
        indexer.add_worker(wid, hybrid=wid not in args.attention_workers)
    for flag, endpoints in (("--workers", args.workers), ("--replay", args.replay)):
        for wid, endpoint in endpoints.items():
            bad = _bad_endpoint(zmq, endpoint)
            if bad:
                return _error(f"{flag} {wid}={endpoint}: {bad}")
    lock = threading.Lock()
    default = args.release.get(None, "auto")
    subscriber = ZmqSubscriber(indexer, lock, timeout_s=args.timeout, release=default)
    try:
        for wid, endpoint in args.workers.items():
            subscriber.add(wid, endpoint, args.replay.get(wid), args.release.get(wid))
        server = IndexServer((args.host, args.port), indexer, lock, subscriber, args.model_name)
    except (zmq.ZMQError, OSError) as e:  # an unknown host, a port in use or not allowed
        subscriber.close()
        return _error(f"--host {args.host} --port {args.port}: {e.strerror}")
    return _serve(server, subscriber, args.duration)


def _bad_endpoint(zmq: Any, endpoint: str) -> str | None:
    """Why ZMQ cannot connect to `endpoint` (a malformed address), or None.
    Connecting only checks the address: the connection itself is made later."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as e:
        return str(e.strerror)
    finally:
        sock.close(linger=0)
    return None


def _serve(server: Any, subscriber: Any, duration: float | None) -> int:
    """Serve until --duration (exit 0) or a signal: 130 after Ctrl-C, 128 + N after
    signal N (SIGTERM 143, SIGHUP 129), as every command exits."""
    stop = threading.Event()
    got: list[int] = []

    def ask_stop(signum: int, frame: Any) -> None:
        got.append(signum)
        stop.set()

    old: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():  # signals reach only that one
        old = {sig: signal.signal(sig, ask_stop) for sig in STOP}
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    thread.start()
    host, port = server.server_address[:2]
    print(f"mambaradix index: listening on http://{host}:{port}", flush=True)
    deadline = None if duration is None else time.monotonic() + duration
    try:
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            subscriber.poll(0.1)
    finally:
        server.shutdown()
        thread.join(timeout=5)
        server.server_close()
        subscriber.close()
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if not got:
        return 0
    name = signal.Signals(got[0]).name
    print(f"mambaradix index: interrupted ({name}); stopped", file=sys.stderr)
    return 130 if got[0] == signal.SIGINT else 128 + got[0]
