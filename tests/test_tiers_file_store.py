"""FileStore scenarios: round trips, restarts, corrupt/truncated/misplaced files, a full store
(byte cap and a real full filesystem), orphan temp files, bad input. Expected values are
written out by hand."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from mambaradix.tiers import (
    HYBRID_RULES,
    KV,
    MAMBA,
    FileStore,
    HitPolicy,
    Namespace,
    ObjectKey,
    PoolRule,
    StoreError,
    StoreUnavailable,
    open_store,
    page_hashes,
    usable_prefix,
)

NS = Namespace("test/model")
CHAIN = page_hashes(list(range(80)), 16)  # 5 pages


def kv(i: int) -> ObjectKey:
    return ObjectKey(CHAIN[i], KV)


def state(i: int) -> ObjectKey:
    return ObjectKey(CHAIN[i], MAMBA)


def bin_path(store: FileStore, key: ObjectKey) -> str:
    return os.path.join(store.root, store.namespace.object_name(key) + ".bin")


def test_round_trip_of_a_multi_part_state(tmp_path):
    store = FileStore(tmp_path, NS)
    conv = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    ssm = np.full((5, 7), 0.5, dtype=np.float64)
    assert store.put([(state(2), {"conv": conv, "ssm": ssm, "empty": b""})]) == [True]
    (got,) = store.get([state(2)])
    assert got is not None and list(got) == ["conv", "ssm", "empty"]
    assert np.array_equal(np.frombuffer(got["conv"], np.float32).reshape(2, 3, 4), conv)
    assert np.array_equal(np.frombuffer(got["ssm"], np.float64).reshape(5, 7), ssm)
    assert got["empty"].nbytes == 0 and got["conv"].readonly
    conv[:] = -1  # the caller's buffer is free once put returns
    assert store.put([(state(2), {"conv": b"new"})]) == [True]
    assert np.frombuffer(got["conv"], np.float32)[5] == 5.0  # an earlier get keeps its copy
    assert bytes(store.get([state(2)])[0]["conv"]) == b"new"  # type: ignore[index]
    store.check_invariants()


def test_objects_survive_a_restart(tmp_path):
    store = FileStore(tmp_path, NS)
    store.put([(kv(i), {"kv": bytes([i]) * 100}) for i in range(3)])
    store.put([(state(1), {"conv": b"c1", "ssm": b"s1"})])
    store.close()
    again = FileStore(tmp_path, NS)
    assert again.used_bytes == store.used_bytes
    assert [bytes(p["kv"]) for p in again.get([kv(0), kv(1), kv(2)])] == [  # type: ignore[index]
        b"\x00" * 100, b"\x01" * 100, b"\x02" * 100]
    assert again.longest_prefix(CHAIN, HYBRID_RULES).restorable == (2,)
    other = FileStore(tmp_path, Namespace("test/model", layout="lother"))
    assert other.get([kv(0)]) == [None]  # another layout: other names, a miss


@pytest.mark.parametrize("damage", ["flip", "truncate", "append", "empty"])
def test_a_damaged_file_is_a_counted_miss_and_is_removed(tmp_path, damage):
    store = FileStore(tmp_path, NS)
    store.put([(state(0), {"conv": b"x" * 64, "ssm": b"y" * 64}), (kv(0), {"kv": b"k"})])
    path = bin_path(store, state(0))
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if damage == "flip":
        data[60] ^= 0x01
    elif damage == "truncate":
        data = data[:-3]
    elif damage == "append":
        data += b"\x00"
    else:
        data = bytearray()
    with open(path, "wb") as f:
        f.write(data)
    fresh = FileStore(tmp_path, NS)  # a reader that never saw the good file
    assert fresh.get([state(0), kv(0)])[0] is None
    stats = fresh.stats()
    assert (stats.gets, stats.hits, stats.misses, stats.corrupt) == (2, 1, 1, 1)
    assert fresh.exists([state(0), kv(0)]) == [False, True]
    fresh.check_invariants()


def test_a_file_moved_to_another_key_does_not_decode(tmp_path):
    store = FileStore(tmp_path, NS)
    store.put([(state(0), {"conv": b"state of page 0"})])
    shutil.copy(bin_path(store, state(0)), bin_path(store, state(3)))
    other_ns = Namespace("test/model", 1, 2)
    shutil.copy(bin_path(store, state(0)),
                os.path.join(tmp_path, other_ns.object_name(state(0)) + ".bin"))
    fresh = FileStore(tmp_path, NS)
    assert fresh.get([state(3)]) == [None] and fresh.stats().corrupt == 1
    assert FileStore(tmp_path, other_ns).get([state(0)]) == [None]
    assert bytes(fresh.get([state(0)])[0]["conv"]) == b"state of page 0"  # type: ignore[index]


def test_a_full_store_refuses_and_counts(tmp_path):
    probe = FileStore(tmp_path / "probe", NS)
    probe.put([(kv(0), {"kv": b"a" * 1000})])
    one = probe.used_bytes  # the size of one such object, frame included
    store = FileStore(tmp_path / "s", NS, capacity_bytes=2 * one)
    assert store.put([(kv(i), {"kv": bytes([i]) * 1000}) for i in range(3)]) == [True, True, False]
    assert store.stats().put_rejected == 1 and store.exists([kv(2)]) == [False]
    assert store.put([(kv(1), {"kv": b"z" * 1000})]) == [True]  # a replacement fits
    assert store.delete([kv(0), kv(4)]) == 1
    assert store.put([(kv(2), {"kv": b"2" * 1000})]) == [True]
    assert [bytes(p["kv"])[:1] for p in store.get([kv(1), kv(2)])] == [b"z", b"2"]  # type: ignore[index]
    store.check_invariants()


def test_a_full_filesystem_refuses_and_counts(tmp_path):
    """ENOSPC from a real 1 MiB tmpfs (a private mount namespace: needs root, as CI is)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = textwrap.dedent(f"""
        import os
        from mambaradix.tiers import FileStore, Namespace, ObjectKey, page_hashes
        store = FileStore({str(mnt)!r}, Namespace("m"))
        keys = [ObjectKey(h, "kv") for h in page_hashes(list(range(6)), 1)]
        ok = store.put([(k, {{"kv": bytes(300_000)}}) for k in keys])
        got = store.get(keys)
        assert all((g is not None) == o for g, o in zip(got, ok)), (ok, got)
        assert all(bytes(g["kv"]) == bytes(300_000) for g in got if g is not None)
        store.check_invariants()
        assert not [n for n in os.listdir({str(mnt)!r}) if n.endswith(".tmp")]
        print(ok, store.stats().put_rejected)
    """)
    cmd = ["unshare", "-m", "sh", "-c",
           f"mount -t tmpfs -o size=1m none {mnt} && exec {sys.executable} -c \"$0\"", script]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[True,", "True,", "True,", "False,", "False,", "False]", "3"]


def test_orphan_temp_files_of_dead_writers_are_removed_on_open(tmp_path):
    store = FileStore(tmp_path, NS)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    host = store._host
    orphan = tmp_path / f".{host}.{dead}.abc.tmp"
    live = tmp_path / f".{host}.{os.getpid()}.def.tmp"
    foreign = tmp_path / f".otherhost.{dead}.ghi.tmp"
    for path in (orphan, live, foreign):
        path.write_bytes(b"partial")
    FileStore(tmp_path, NS)
    assert (orphan.exists(), live.exists(), foreign.exists()) == (False, True, True)


def test_longest_prefix_hand_computed(tmp_path):
    store = FileStore(tmp_path, NS)
    store.put([(kv(i), {"kv": b"k"}) for i in (0, 1, 2, 3)])  # KV on pages 0-3, not 4
    store.put([(state(i), {"ssm": b"s"}) for i in (0, 2, 4)])  # states end pages 0, 2, 4
    hit = store.longest_prefix(CHAIN, HYBRID_RULES)
    assert (hit.pages, hit.restorable, hit.pool_pages) == (3, (1, 3), (("kv", 4), ("mamba", 3)))
    window2 = (PoolRule(KV), PoolRule(MAMBA, HitPolicy.TRAILING_PAGES, 2))
    # no two adjacent states; p=1 needs only page 0 (the window is clipped at the start)
    assert store.longest_prefix(CHAIN, window2).restorable == (1,)
    state_only = (PoolRule(MAMBA, HitPolicy.TRAILING_PAGES),)  # KV held in another tier
    assert store.longest_prefix(CHAIN, state_only).restorable == (1, 3, 5)
    assert store.longest_prefix([], HYBRID_RULES) == (0, (), (("kv", 0), ("mamba", 0)))


def test_usable_prefix_all_pages_pool_cuts_at_its_first_gap():
    present = {"kv": [True] * 4, "swa": [True, True, False, True]}
    hit = usable_prefix(4, present, (PoolRule("kv"), PoolRule("swa")))
    assert hit == (2, (1, 2), (("kv", 4), ("swa", 2)))


def test_bad_input_is_refused_before_anything_is_written(tmp_path):
    store = FileStore(tmp_path, NS)
    store.put([(kv(0), {"kv": b"k"})])
    before = sorted(os.listdir(tmp_path))
    good = (kv(1), {"kv": b"k"})
    bad_batches = [
        ([good, (kv(2), {})], "items\\[1\\]\\[1\\]"),
        ([good, (kv(2), {"kv": 3})], "buffer protocol"),
        ([good, (kv(2), {"a b": b""})], "part name"),
        ([good, (kv(2), {"kv": np.zeros((4, 4))[:, 1]})], "C-contiguous"),
        ([good, (("x", KV), {"kv": b""})], "items\\[1\\]\\[0\\].page_hash"),
        ([good, (ObjectKey(CHAIN[0], "KV"), {"kv": b""})], "items\\[1\\]\\[0\\].pool"),
        ([good, kv(2)], "items\\[1\\]"),
        (good, "items\\[0\\]"),
        ("abc", "items"),
    ]
    for batch, match in bad_batches:
        with pytest.raises((TypeError, ValueError), match=match):
            store.put(batch)  # type: ignore[arg-type]
    for call, match in [
        (lambda: store.get(kv(0)), "one ObjectKey"),
        (lambda: store.get([kv(0), "x"]), "keys\\[1\\]"),
        (lambda: store.exists([("ab", KV)]), "keys\\[0\\].page_hash"),
        (lambda: store.delete([kv(1), (CHAIN[0], "")]), "keys\\[1\\].pool"),
        (lambda: store.longest_prefix(CHAIN + ["zz"], HYBRID_RULES), "chain\\[5\\]"),
        (lambda: store.longest_prefix(CHAIN, ()), "rules"),
        (lambda: store.longest_prefix(CHAIN, (PoolRule(KV), PoolRule(KV))), "twice"),
        (lambda: store.longest_prefix(CHAIN, (PoolRule(MAMBA, "trailing"),)), "policy"),
        (lambda: store.longest_prefix(CHAIN, (PoolRule(MAMBA, HitPolicy.TRAILING_PAGES, 0),)),
         "window"),
        (lambda: FileStore(tmp_path, NS, capacity_bytes=-1), "capacity_bytes"),
        (lambda: FileStore(tmp_path, "test/model"), "namespace"),  # type: ignore[arg-type]
    ]:
        with pytest.raises((TypeError, ValueError), match=match):
            call()
    assert sorted(os.listdir(tmp_path)) == before
    assert store.stats().puts == 1 and store.stats().gets == 0


def test_unreachable_directory_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(StoreUnavailable, match="cannot be opened"):
        FileStore(blocker / "sub", NS)
    store = FileStore(tmp_path / "s", NS)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreUnavailable, match="closed"):
        store.put([(kv(0), {"kv": b"k"})])
    assert issubclass(StoreUnavailable, StoreError)


def test_open_store_from_a_string(tmp_path):
    for spec in (f"file:{tmp_path}/a", f"file://{tmp_path}/b", str(tmp_path / "c")):
        store = open_store(spec, NS, capacity_bytes=10_000)
        assert isinstance(store, FileStore) and store.put([(kv(0), {"kv": b"k"})]) == [True]
    assert os.path.isdir(tmp_path / "a") and os.path.isdir(tmp_path / "c")
    for bad, match in [("", "spec"), ("s3://bucket", "unknown store scheme"),
                       ("redis://:6379/x", "redis://HOST"), ("mooncake://m:1", "mooncake://")]:
        with pytest.raises(ValueError, match=match):
            open_store(bad, NS)
