"""MooncakeStore checks, run inside a private network namespace by test_tiers_mooncake.py.

Mooncake's transfer engine needs a non-loopback address, so the test gives this script a
namespace holding a veth pair with ``ADDR`` on one end (``python mooncake_driver.py ADDR``).
Here it starts ``mooncake_master`` (with its HTTP metadata server) on loopback, checks the
store against hand-written expectations, kills SIGKILLed writers (tests/tiers_crash.py), reads
an object a writer rewrites in place, stops the master, and prints one JSON line of what
it saw. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

import mooncake

from mambaradix.tiers import (
    HYBRID_RULES,
    KV,
    MAMBA,
    Namespace,
    ObjectKey,
    StoreUnavailable,
    open_store,
    page_hashes,
)
from mambaradix.tiers.mooncake_store import MooncakeStore

sys.path.insert(0, os.path.dirname(__file__))
import tiers_crash  # noqa: E402  (tests/ is not a package)

NS = Namespace("mooncake/model")
CHAIN = page_hashes(list(range(32)), 8)  # 4 pages
WAIT_S = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_master() -> tuple[subprocess.Popen[bytes], str, str]:
    rpc, meta, metrics = free_port(), free_port(), free_port()
    binary = os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master")
    cmd = [binary, f"--rpc_port={rpc}", "--enable_http_metadata_server=true",
           "--http_metadata_server_host=127.0.0.1", f"--http_metadata_server_port={meta}",
           f"--metrics_port={metrics}", "--enable_metric_reporting=false",
           # a killed writer's unfinished put blocks its key until discarded (default 30 s)
           "--put_start_discard_timeout_sec=1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            socket.create_connection(("127.0.0.1", rpc), 0.2).close()
            socket.create_connection(("127.0.0.1", meta), 0.2).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mooncake_master not up (exit {proc.poll()})") from None
            time.sleep(0.05)
    return proc, f"http://127.0.0.1:{meta}/metadata", f"127.0.0.1:{rpc}"


def scenarios(addr: str, metadata: str, master: str) -> dict[str, object]:
    seen: dict[str, object] = {}
    store = open_store(f"mooncake://{master}?local={addr}&metadata={metadata}", NS,
                       global_segment_size=32 << 20, local_buffer_size=8 << 20)
    assert isinstance(store, MooncakeStore)
    kv = [ObjectKey(h, KV) for h in CHAIN]
    state = [ObjectKey(h, MAMBA) for h in CHAIN]
    # round trip, overwrite, prefix
    assert store.put([(k, {"kv": bytes([i]) * 4096}) for i, k in enumerate(kv[:3])]) == [True] * 3
    assert store.put([(state[1], {"conv": b"old", "ssm": b"old"})]) == [True]
    assert store.put([(state[1], {"conv": b"c" * 100, "ssm": memoryview(b"s" * 300)})]) == [True]
    (got,) = store.get([state[1]])
    assert got is not None
    assert {p: bytes(v) for p, v in got.items()} == {"conv": b"c" * 100, "ssm": b"s" * 300}
    assert store.get([kv[3]]) == [None]
    hit = store.longest_prefix(CHAIN, HYBRID_RULES)
    assert (hit.pages, hit.restorable) == (2, (2,)), hit
    assert store.exists([kv[0], kv[3]]) == [True, False]
    # a corrupt object under our name: a counted miss, then gone
    raw = store._store
    assert raw.upsert(NS.object_name(state[2]), b"MRXB not a frame") == 0
    assert store.get([state[2]]) == [None] and store.stats().corrupt == 1
    assert store.exists([state[2]]) == [False]
    # larger than the client's local buffer: refused and counted
    assert store.put([(kv[3], {"kv": bytes(9 << 20)})]) == [False]
    seen["too_big_code"] = store.last_refusal
    # full: 3 MiB objects into a 32 MiB segment; Mooncake refuses or evicts, never corrupts
    keys = [ObjectKey(h, KV) for h in page_hashes(list(range(24)), 1)]
    done = store.put([(k, {"kv": bytes([i]) * (3 << 20)}) for i, k in enumerate(keys)])
    got_all = store.get(keys)
    for i, parts in enumerate(got_all):
        assert parts is None or bytes(parts["kv"]) == bytes([i]) * (3 << 20), i
    seen["full_refused"] = done.count(False)
    seen["full_readable"] = sum(p is not None for p in got_all)
    assert seen["full_refused"] or seen["full_readable"] < len(keys)
    seen["stats"] = store.stats()._asdict()
    store.close()
    return seen


class CountingRemoves:
    """The Mooncake client, counting the `remove` calls the store makes through it."""

    def __init__(self, client: Any) -> None:
        self.client, self.removes = client, 0

    def remove(self, *args: Any) -> int:
        self.removes += 1
        return int(self.client.remove(*args))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def torn_reads(addr: str, metadata: str, master: str, seconds: float) -> dict[str, int]:
    """Read one object for `seconds` while a writer process rewrites it with objects of the
    same size (Mooncake's upsert then reuses the buffers, in place): every object read is a
    whole version, and a torn read (a counted corrupt miss) must not remove the object."""
    target = f"{addr}|{metadata}|{master}"
    reader = tiers_crash.open_store("mooncake", target)
    counting = reader._store = CountingRemoves(reader._store)
    cmd = [sys.executable, tiers_crash.__file__, "mooncake", target, "7", "0", str(1 << 20), "1"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writer = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
    reads = 0
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and writer.poll() is None:
            (parts,) = reader.get(tiers_crash.KEYS[:1])
            if parts is not None:
                tiers_crash.version_of(0, parts, 1 << 20)
            reads += 1
        assert writer.poll() is None, f"the writer exited with {writer.returncode}"
    finally:
        writer.kill()
        writer.wait(WAIT_S)
    seen = {"reads": reads, "torn": reader.stats().corrupt, "removed": counting.removes}
    reader.close()
    return seen


def crash(addr: str, metadata: str, master: str, rounds: int) -> dict[str, int]:
    out = tiers_crash.crash_rounds("mooncake", f"{addr}|{metadata}|{master}", rounds=rounds,
                                   part_bytes=1 << 20, seed=6, overwrite_hides_old=True)
    return {"rounds": out.rounds, "acks": out.acks, "reads_checked": out.reads_checked,
            "missing_while_writing": out.missing_while_writing,
            "lost_by_kill": out.lost_by_kill}


def unreachable(addr: str, metadata: str) -> str:
    try:
        MooncakeStore(NS, local_hostname=addr, metadata_server=metadata,
                      master_server_address=f"127.0.0.1:{free_port()}", connect_timeout_s=1.0)
    except StoreUnavailable as e:
        return str(e)
    raise AssertionError("a store with no master opened")


def main() -> None:
    addr, rounds = sys.argv[1], int(sys.argv[2])
    master_proc, metadata, master = start_master()
    try:
        report: dict[str, object] = scenarios(addr, metadata, master)
        report["crash"] = crash(addr, metadata, master, rounds)
        report["torn_reads"] = torn_reads(addr, metadata, master, 3.0)  # after: crash's keys
        report["unreachable"] = unreachable(addr, metadata)
    finally:
        master_proc.kill()
        master_proc.wait(WAIT_S)
    print(json.dumps(report), flush=True)
    os._exit(0)  # Mooncake's client threads can hold a normal exit


if __name__ == "__main__":
    main()
