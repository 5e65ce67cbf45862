"""Crash harness for the L3 stores: SIGKILL a writer process mid-put, again and again.

The writer (``python tests/tiers_crash.py BACKEND TARGET SEED START PART_BYTES [N_KEYS]``)
puts version after version of 12 objects (KV and state of a 6-page chain; the first N_KEYS of
them when given), one put per version; it prints ``> key version`` before each put (the put
in flight) and ``key version`` after it returns (its acknowledgement). Each object's bytes
are a pure function of (key, version), so a reader can tell exactly which version it got, or
that the bytes are no version at all.

While it writes, the test process reads every object over and over and checks: the bytes
are exactly one version's (never partial, never mixed) and that version is not older than the
last acknowledgement read before the get (never stale, never lost). After the kill, a fresh
store object (a restart) must pass the same check, with every acknowledgement read and no
version newer than the one in flight; leave no temp file behind; and answer
`longest_prefix` as a brute force over the readable objects.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from mambaradix.tiers import HYBRID_RULES, KV, MAMBA, Namespace, ObjectKey, page_hashes

CHAIN = page_hashes(list(range(48)), 8)  # 6 pages
KEYS = [ObjectKey(h, pool) for h in CHAIN for pool in (KV, MAMBA)]
NS = Namespace("crash/model")
PARTS = ("conv", "ssm")
WAIT_S = 60.0  # every wait is bounded


def make_parts(k: int, version: int, part_bytes: int) -> dict[str, bytes]:
    """The bytes of version `version` of object `k`: a pure function of both."""
    out = {}
    for name in PARTS:
        seed = hashlib.blake2b(f"{k}:{version}:{name}".encode()).digest()
        body = seed * (part_bytes // len(seed) + 1)
        out[name] = (struct.pack("<QQ", k, version) + body)[: max(part_bytes, 16)]
    return out


def version_of(k: int, parts: dict[str, Any], part_bytes: int) -> int:
    """The version these bytes are, or AssertionError when they are no version of key k."""
    got = {name: bytes(view) for name, view in parts.items()}
    assert set(got) == set(PARTS), f"key {k}: parts {sorted(got)}"
    key_in, version = struct.unpack_from("<QQ", got["conv"])
    assert key_in == k, f"key {k} holds key {key_in}'s bytes"
    assert got == make_parts(k, version, part_bytes), f"key {k}: bytes of no version"
    return int(version)


def open_store(backend: str, target: str, *, holds_data: bool = True) -> Any:
    """file: target is the directory; redis: the port; mooncake: "host|metadata|master"."""
    if backend == "file":
        from mambaradix.tiers import FileStore

        return FileStore(target, NS)
    if backend == "redis":
        from mambaradix.tiers.redis_store import RedisStore

        return RedisStore(NS, port=int(target))
    from mambaradix.tiers.mooncake_store import MooncakeStore

    host, metadata, master = target.split("|")
    return MooncakeStore(  # only the long-lived reader mounts memory: no death loses data
        NS, local_hostname=host, metadata_server=metadata, master_server_address=master,
        global_segment_size=64 << 20 if holds_data else 0, local_buffer_size=16 << 20,
    )


# --------------------------------------------------------------------------- writer


def writer_main(backend: str, target: str, seed: int, start: int, part_bytes: int,
                n_keys: int = len(KEYS)) -> None:
    store = open_store(backend, target, holds_data=False)
    rng = random.Random(seed)
    version = start
    while True:
        k = rng.randrange(n_keys)
        sys.stdout.write(f"> {k} {version}\n")
        sys.stdout.flush()
        deadline = time.monotonic() + WAIT_S
        while store.put([(KEYS[k], make_parts(k, version, part_bytes))]) != [True]:
            assert time.monotonic() < deadline, f"put of key {k} refused for {WAIT_S} s"
            time.sleep(0.05)  # Mooncake: a dead writer's unfinished put blocks the key a while
        sys.stdout.write(f"{k} {version}\n")
        sys.stdout.flush()
        version += 1


# --------------------------------------------------------------------------- harness


@dataclass
class Outcome:
    rounds: int = 0
    acks: int = 0
    reads_checked: int = 0
    missing_while_writing: int = 0  # acknowledged objects absent during a concurrent read
    lost_by_kill: int = 0  # acknowledged objects absent after the kill
    lost: set[int] = field(default_factory=set)  # keys lost to a kill, not written since
    mid_put_kills: int = 0  # kills that left a temp file (file store only)
    acked: dict[int, int] = field(default_factory=dict)  # key -> last acknowledged version


class _Acks:
    """Reads the writer's acknowledgements on a thread."""

    def __init__(self, proc: subprocess.Popen[str], acked: dict[int, int], lost: set[int]):
        self.acked, self.lost, self.last, self.count = acked, lost, -1, 0
        self.in_flight: int | None = None  # the key of a put announced, not acknowledged
        self.lock = threading.Lock()
        self.first = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(proc,), daemon=True)
        self.thread.start()

    def _run(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(">"):
                with self.lock:
                    self.in_flight = int(line.split()[1])
                continue
            k, version = map(int, line.split())
            with self.lock:
                self.in_flight = None
                self.acked[k] = version
                self.lost.discard(k)
                self.last, self.count = version, self.count + 1
            self.first.set()

    def snapshot(self) -> tuple[dict[int, int], int, frozenset[int], int | None]:
        with self.lock:
            return dict(self.acked), self.last, frozenset(self.lost), self.in_flight


def check_reads(
    results: list[Any], acked: dict[int, int], newest: int, part_bytes: int,
    may_miss: Collection[int] = (), lost: frozenset[int] = frozenset(),
) -> list[int]:
    """Every object read is exactly a version in [acknowledged before the read, newest], and
    every acknowledged object is there but those in `may_miss` and those `lost` to an earlier
    kill and not written since; returns the missing ones (those in `may_miss`)."""
    missing = [k for k, p in enumerate(results) if p is None and k in acked and k not in lost]
    unexpected = [k for k in missing if k not in may_miss]
    assert not unexpected, f"acknowledged objects lost: {unexpected}"
    for k, parts in enumerate(results):
        if parts is None:
            continue
        version = version_of(k, parts, part_bytes)
        assert version >= acked.get(k, -1), f"key {k}: stale {version} < {acked[k]}"
        assert version <= newest, f"key {k}: version {version} from nowhere (> {newest})"
    return missing


def brute_force_prefix(readable: set[ObjectKey]) -> int:
    best = 0
    for p in range(1, len(CHAIN) + 1):
        kv_ok = all(ObjectKey(CHAIN[i], KV) in readable for i in range(p))
        if kv_ok and ObjectKey(CHAIN[p - 1], MAMBA) in readable:
            best = p
    return best


def crash_rounds(
    backend: str, target: str, rounds: int, part_bytes: int, seed: int,
    count_temp_files: Callable[[], int] | None = None, overwrite_hides_old: bool = False,
) -> Outcome:
    """`rounds` times: start a writer, read while it writes, SIGKILL it at a random moment,
    reopen the store and check it. `overwrite_hides_old`: a store whose overwrite hides the
    old object until the new one is published (Mooncake's upsert) may miss objects being
    replaced while the writer runs (counted), and after the kill may have lost the object the
    dead writer was replacing (the put it announced and never acknowledged; counted), and no
    other; it never returns wrong or stale bytes."""
    while_writing = range(len(KEYS)) if overwrite_hides_old else ()
    rng = random.Random(seed)
    out = Outcome()
    reader = open_store(backend, target)
    next_version = 0
    for _ in range(rounds):
        cmd = [sys.executable, __file__, backend, target, str(rng.randrange(2**31)),
               str(next_version), str(part_bytes)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        acks = _Acks(proc, out.acked, out.lost)
        try:
            assert acks.first.wait(WAIT_S), "the writer never acknowledged a put"
            deadline = time.monotonic() + rng.uniform(0.0, 0.25)
            while time.monotonic() < deadline:  # read while the writer writes
                acked_before, _, lost, _ = acks.snapshot()
                results = reader.get(KEYS)
                # no upper bound while it runs: the writer may be puts ahead of the
                # acknowledgements read so far (they wait in the pipe)
                out.missing_while_writing += len(check_reads(
                    results, acked_before, 2**62, part_bytes, while_writing, lost))
                out.reads_checked += len(KEYS)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait(WAIT_S)
        acks.thread.join(WAIT_S)
        acked, last, lost, in_flight = acks.snapshot()
        if count_temp_files is not None:
            out.mid_put_kills += count_temp_files() > 0
        # a restart; the file store removes the dead writer's temp file
        restarted = open_store(backend, target, holds_data=False)
        replaced = () if in_flight is None or not overwrite_hides_old else (in_flight,)
        results = restarted.get(KEYS)
        out.lost_by_kill += len(check_reads(results, acked, last + 1, part_bytes, replaced, lost))
        for k in replaced:  # lost now, or once the master gets to the dead writer's put,
            if results[k] is None or version_of(k, results[k], part_bytes) <= last:
                out.lost.add(k)  # unless that put is visibly done
        out.reads_checked += len(KEYS)
        if count_temp_files is not None:
            assert count_temp_files() == 0, "a dead writer's temp file survived reopening"
        readable = {KEYS[k] for k, p in enumerate(restarted.get(KEYS)) if p is not None}
        assert restarted.longest_prefix(CHAIN, HYBRID_RULES).pages == brute_force_prefix(readable)
        restarted.close()
        out.rounds += 1
        out.acks += acks.count
        next_version = last + 2  # past the version that may have been in flight
    reader.close()
    return out


if __name__ == "__main__":
    writer_main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:]))
