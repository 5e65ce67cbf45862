"""RedisStore against a real redis-server started here (tests/redis_server.py): round trips,
corrupt values, a full server, an unreachable one, and SIGKILLed writers (slow)."""

from __future__ import annotations

import pytest
import redis

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
from mambaradix.tiers.redis_store import RedisStore
from redis_server import free_port, redis_server
from tiers_crash import crash_rounds

NS = Namespace("redis/model")
CHAIN = page_hashes(list(range(32)), 8)  # 4 pages


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    with redis_server(tmp_path_factory.mktemp("redis")) as p:
        yield p


@pytest.fixture
def store(port):
    s = RedisStore(NS, port=port)
    redis.Redis(port=port).flushall()
    yield s
    s.close()


def test_round_trip_prefix_and_delete(store, port):
    kv = [ObjectKey(h, KV) for h in CHAIN]
    state = [ObjectKey(h, MAMBA) for h in CHAIN]
    assert store.put([(k, {"kv": bytes([i]) * 1000}) for i, k in enumerate(kv[:3])]) == [True] * 3
    assert store.put([(state[1], {"conv": b"c" * 10, "ssm": memoryview(b"s" * 20)})]) == [True]
    got = store.get([state[1], kv[2], kv[3]])
    assert {p: bytes(v) for p, v in got[0].items()} == {"conv": b"c" * 10, "ssm": b"s" * 20}
    assert bytes(got[1]["kv"]) == b"\x02" * 1000 and got[2] is None
    assert store.longest_prefix(CHAIN, HYBRID_RULES).restorable == (2,)
    names = sorted(n.decode() for n in redis.Redis(port=port).scan_iter())
    assert names == sorted(NS.object_name(k) for k in [*kv[:3], state[1]])  # HiCache names
    assert store.delete([kv[0], kv[3]]) == 1
    assert store.exists([kv[0], kv[1]]) == [False, True]
    s = store.stats()
    assert (s.puts, s.gets, s.hits, s.misses, s.deletes) == (4, 3, 2, 1, 1)


def test_open_store_from_a_url(port):
    store = open_store(f"redis://127.0.0.1:{port}/3", NS, timeout_s=2.0)
    assert isinstance(store, RedisStore)
    store.put([(ObjectKey(CHAIN[0], KV), {"kv": b"db3"})])
    assert redis.Redis(port=port, db=3).exists(NS.object_name(ObjectKey(CHAIN[0], KV))) == 1
    store.close()


def test_corrupt_value_is_a_counted_miss_and_removed(store, port):
    key = ObjectKey(CHAIN[0], MAMBA)
    store.put([(key, {"conv": b"x" * 100})])
    raw = redis.Redis(port=port)
    name = NS.object_name(key)
    value = bytearray(raw.get(name))
    value[40] ^= 0xFF
    raw.set(name, bytes(value))
    assert store.get([key]) == [None]
    assert (store.stats().corrupt, store.stats().misses) == (1, 1)
    assert raw.exists(name) == 0


def test_full_server_refuses_and_counts(tmp_path):
    with redis_server(tmp_path, "--maxmemory", "3mb", "--maxmemory-policy", "noeviction") as p:
        store = RedisStore(NS, port=p)
        keys = [ObjectKey(h, KV) for h in page_hashes(list(range(16)), 1)]
        done = store.put([(k, {"kv": bytes(512 << 10)}) for k in keys])
        assert done[0] and not done[-1], done
        assert store.stats().put_rejected == done.count(False)
        got = store.get(keys)
        assert [g is not None for g in got] == done
        assert all(bytes(g["kv"]) == bytes(512 << 10) for g in got if g is not None)


def test_unreachable_server_is_a_clear_error(tmp_path):
    with pytest.raises(StoreUnavailable, match=r"redis store at 127\.0\.0\.1:\d+/0 unreachable"):
        RedisStore(NS, port=free_port(), timeout_s=1.0)
    with redis_server(tmp_path) as p:
        store = RedisStore(NS, port=p, timeout_s=1.0)
        store.put([(ObjectKey(CHAIN[0], KV), {"kv": b"k"})])
    with pytest.raises(StoreUnavailable, match="unreachable"):  # the server is gone
        store.get([ObjectKey(CHAIN[0], KV)])
    with pytest.raises(ValueError, match="port"):
        RedisStore(NS, port=0)


@pytest.mark.slow
def test_killed_writer_many_times(port):
    redis.Redis(port=port).flushall()
    out = crash_rounds("redis", str(port), rounds=20, part_bytes=1 << 20, seed=4)
    assert out.rounds == 20 and out.acks >= 20
