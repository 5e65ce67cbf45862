"""The indexer's per-tier answer (`query_tiers`) against a brute-force recomputation from
the event log, and hand-computed cases.

The oracle (`Oracle`) keeps, per worker and tier, a dict hash -> the block's whole token
path, a set of paths with a state, and the states announced before their block; it
follows the rules of `indexer.py`'s docstring with no trie, no aliases counted and no
node sharing. Per tier T it answers by scanning the prompt's block paths. Random seeded
streams (KV stores with and without tokens, states, removals by group, unknown groups,
resets; three workers, one attention-only) go to an indexer in-process and to a second
one through vLLM 0.33.0's wire format; after every event: invariants, both indexers
equal the oracle on every probe and tier, the device tier equals `query`, and a cold
indexer fed `dump()` answers the same.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from mambaradix.events import AllBlocksCleared, BlockRemoved, BlockStored
from mambaradix.events.model import DEVICE, DISK, HOST, MEDIA
from mambaradix.events.wire import decode_batch, encode_batch
from mambaradix.index import Indexer, Overlap, TierOverlap
from mambaradix.index.server import IndexServer

B = 2
RANK = {DEVICE: 0, HOST: 1, DISK: 2}
Path = tuple[int, ...]


class Oracle:
    """One worker's holdings, by hash and path, per tier (0 device, 1 host, 2 disk)."""

    def __init__(self, hybrid: bool) -> None:
        self.hybrid = hybrid
        self.kinds: dict[int, str] = {}  # survives resets, as the indexer's does
        self.clear()

    def clear(self) -> None:
        self.kv: list[dict[int, Path]] = [{}, {}, {}]
        self.states: list[set[Path]] = [set(), set(), set()]
        self.pending: list[set[int]] = [set(), set(), set()]

    def name(self, h: int) -> Path | None:
        for held in self.kv:
            if h in held:
                return held[h]
        return None

    def holds(self, t: int, p: Path) -> bool:
        return p in self.kv[t].values()

    def apply(self, e: Any) -> None:
        if isinstance(e, AllBlocksCleared):
            return self.clear()
        t = RANK[e.medium]
        if isinstance(e, BlockStored):
            if e.group is not None and e.kind is not None:
                self.kinds[e.group] = e.kind
            if e.kind == "mamba":
                for h in e.block_hashes:
                    p = self.name(h)
                    self.states[t].add(p) if p is not None else self.pending[t].add(h)
            elif e.block_size == 0:  # a placeholder: blocks known by hash only
                for h in e.block_hashes:
                    p = self.name(h)
                    if p is not None:
                        self.hold(t, h, p)
            else:
                base = () if e.parent_block_hash is None else self.name(e.parent_block_hash)
                if base is None:
                    return None
                for i, h in enumerate(e.block_hashes):
                    base = base + tuple(e.token_ids[i * B : (i + 1) * B])
                    self.hold(t, h, base)
            return None
        kind = self.kinds.get(e.group) if e.group is not None else None
        for h in e.block_hashes:
            self.pending[t].discard(h)
            if kind == "mamba":
                p = self.name(h)
                if p is not None:
                    self.states[t].discard(p)
            elif h in self.kv[t]:  # KV, or a group never described
                self.release(t, self.kv[t].pop(h))
        return None

    def hold(self, t: int, h: int, p: Path) -> None:
        old = self.kv[t].get(h)
        self.kv[t][h] = p
        if old is not None and old != p:
            self.release(t, old)
        for u in range(3):
            if h in self.pending[u]:
                self.pending[u].discard(h)
                self.states[u].add(p)

    def release(self, t: int, p: Path) -> None:
        if not self.holds(t, p):
            self.states[t].discard(p)
        if not any(self.holds(u, p) for u in range(3)):
            for u in range(3):
                self.states[u].discard(p)

    def answer(self, prompt: list[int], medium: str) -> TierOverlap:
        t = RANK[medium]
        cap = (len(prompt) - 1) // B * B if prompt else 0
        paths = [tuple(prompt[: k * B]) for k in range(1, len(prompt) // B + 1)]
        kv_tier = []
        for p in paths:
            tiers = [u for u in range(t + 1) if self.holds(u, p)]
            if not tiers:
                break
            kv_tier.append(min(tiers))
        matched = len(kv_tier) * B
        k = min(matched, cap) // B
        state_tier = None
        if self.hybrid:
            while k:
                found = [u for u in range(t + 1) if paths[k - 1] in self.states[u]]
                if found:
                    state_tier = MEDIA[min(found)]
                    break
                k -= 1
        load: dict[str, int] = {}
        for u in kv_tier[:k]:
            if u:
                load[MEDIA[u]] = load.get(MEDIA[u], 0) + B
        return TierOverlap(matched, k * B, matched - k * B, load, state_tier)


def hash_of(path: Path, alias: int) -> int:
    """A block's hash: its path (and an extra key, 0 or 1), as a chained hash would be."""
    return hash((path, alias)) & ((1 << 62) - 1)


def random_event(rng: random.Random, trie: list[Path]) -> Any:
    """One event about the small trie of paths `trie` (every path's prefixes in it)."""
    medium = rng.choice(MEDIA)
    roll = rng.random()
    path = rng.choice(trie)
    if roll < 0.40:  # KV store of the path's last blocks, under its parent
        start = rng.randrange(len(path) // B)
        parent = None if start == 0 else hash_of(path[: start * B], rng.randrange(2))
        if rng.random() < 0.05:
            parent = 12345  # a parent never stored
        blocks = range(start, len(path) // B)
        hashes = [hash_of(path[: (i + 1) * B], rng.randrange(2)) for i in blocks]
        return BlockStored(tuple(hashes), parent, list(path[start * B :]), B, medium=medium)
    if roll < 0.47 and medium != DEVICE:  # an offload placeholder: hashes alone
        return BlockStored((hash_of(path, rng.randrange(2)),), None, [], 0, medium=medium)
    if roll < 0.65:  # a state at the path's end
        h = hash_of(path, rng.randrange(2))
        return BlockStored((h,), None, list(path[-B:]), B, 1, "mamba", medium)
    if roll < 0.85:  # KV removal (group 0)
        return BlockRemoved((hash_of(path, rng.randrange(2)),), 0, medium)
    if roll < 0.95:
        return BlockRemoved((hash_of(path, rng.randrange(2)),), 1, medium)  # a state
    if roll < 0.98:
        return BlockRemoved((hash_of(path, rng.randrange(2)),), 7, medium)  # unknown group
    return AllBlocksCleared()


def make_trie(rng: random.Random) -> list[Path]:
    paths: set[Path] = set()
    for _ in range(6):
        p = tuple(rng.randrange(2) for _ in range(B * rng.randrange(1, 5)))
        paths.update(p[: k * B] for k in range(1, len(p) // B + 1))
    return sorted(paths)


def probes_of(trie: list[Path]) -> list[list[int]]:
    return [list(p) + extra for p in trie for extra in ([], [9])]


def run(seed: int, steps: int) -> None:
    rng = random.Random(seed)
    trie = make_trie(rng)
    probes = probes_of(trie)
    hybrid = {0: True, 1: True, 2: False}
    direct, wired = Indexer(B), Indexer(B)
    for ix in (direct, wired):
        for w, h in hybrid.items():
            ix.add_worker(w, hybrid=h)
    oracles = {w: Oracle(h) for w, h in hybrid.items()}
    for step in range(steps):
        w = rng.randrange(3)
        e = random_event(rng, trie)
        oracles[w].apply(e)
        direct.apply(w, [e])
        batch = decode_batch(encode_batch([e], "vllm-0.33.0"))
        assert batch.events == [e] and not batch.problems
        wired.apply(w, batch.events)
        direct.check_invariants()
        wired.check_invariants()
        for q in probes:
            got = direct.query_tiers(q)
            assert wired.query_tiers(q) == got
            device = direct.query(q)
            for v, o in oracles.items():
                for medium in MEDIA:
                    assert got[v][medium] == o.answer(q, medium), (seed, step, v, medium, q, e)
                d = got[v][DEVICE]
                assert device[v] == Overlap(d.longest_matched, d.usable, d.tail_recompute)
        if step % 10 == 9:
            for v in oracles:
                cold = Indexer(B)
                cold.add_worker(v, hybrid=hybrid[v])
                cold.apply(v, direct.dump(v))
                cold.check_invariants()
                for q in probes:
                    assert cold.query_tiers(q)[v] == direct.query_tiers(q)[v], (seed, step, v)


@pytest.mark.parametrize("seed", range(4))
def test_per_tier_answers_equal_a_brute_force_recomputation(seed: int) -> None:
    run(seed, 150)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4, 40))
def test_per_tier_answers_equal_a_brute_force_recomputation_more_seeds(seed: int) -> None:
    run(seed, 400)


# ---------------------------------------------------------------- by hand

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # four full blocks and a token: states up to 8 count


def kv(hashes: list[int], parent: int | None, tokens: list[int], medium: str) -> BlockStored:
    return BlockStored(tuple(hashes), parent, tokens, B, medium=medium)


def state(h: int, medium: str) -> BlockStored:
    return BlockStored((h,), None, [0, 0], B, 1, "mamba", medium)


def test_each_tier_adds_what_it_holds() -> None:
    """Blocks 1-2 on the device with a state at 4; blocks 1-4 on the host; a state at 8
    on disk. By hand: the device reuses 4; the host matches 8 but its deepest state is
    still at 4; disk reuses 8, loading blocks 3-4 (4 tokens) from the host."""
    ix = Indexer(B)
    ix.apply(0, [kv([1, 2], None, PROMPT[:4], DEVICE), state(2, DEVICE)])
    ix.apply(0, [kv([1, 2, 3, 4], None, PROMPT[:8], HOST), state(4, DISK)])
    got = ix.query_tiers(PROMPT)[0]
    assert got[DEVICE] == TierOverlap(4, 4, 0, {}, DEVICE)
    assert got[HOST] == TierOverlap(8, 4, 4, {}, DEVICE)
    assert got[DISK] == TierOverlap(8, 8, 0, {HOST: 4}, DISK)
    assert ix.query(PROMPT)[0] == Overlap(4, 4, 0)  # the device alone, as before


def test_kv_on_the_device_and_the_state_on_the_host_is_usable_with_a_load() -> None:
    ix = Indexer(B)
    ix.apply(0, [kv([1, 2, 3, 4], None, PROMPT[:8], DEVICE), state(3, HOST)])
    got = ix.query_tiers(PROMPT)[0]
    assert got[DEVICE] == TierOverlap(8, 0, 8, {}, None)
    assert got[HOST] == TierOverlap(8, 6, 2, {}, HOST)
    ix.apply(0, [BlockRemoved((3,), 1, HOST)])  # the host state goes
    assert ix.query_tiers(PROMPT)[0][HOST] == TierOverlap(8, 0, 8, {}, None)


def test_a_block_evicted_from_the_device_is_still_usable_from_the_host() -> None:
    ix = Indexer(B)
    ix.apply(0, [kv([1, 2], None, PROMPT[:4], DEVICE), state(2, DEVICE)])
    ix.apply(0, [kv([1, 2], None, PROMPT[:4], HOST), state(2, HOST)])  # demoted copies
    ix.apply(0, [BlockRemoved((2,), 1, DEVICE), BlockRemoved((2, 1), 0, DEVICE)])
    got = ix.query_tiers(PROMPT)[0]
    assert got[DEVICE] == TierOverlap(0, 0, 0, {}, None)
    assert got[HOST] == TierOverlap(4, 4, 0, {HOST: 4}, HOST)
    assert ix.worker_info(0)["blocks"] == 0
    ix.apply(0, [BlockRemoved((2,), 0, HOST)])  # block 2 leaves the host: its state too
    assert ix.query_tiers(PROMPT)[0][DISK] == TierOverlap(2, 0, 2, {}, None)
    ix.check_invariants()


def test_placeholders_name_blocks_known_on_another_tier() -> None:
    """vLLM's offload connector may store blocks by hash alone (block_size 0)."""
    ix = Indexer(B)
    ix.apply(0, [kv([1, 2], None, PROMPT[:4], DEVICE)])
    ix.apply(0, [BlockStored((1, 2, 99), None, [], 0, medium=DISK)])  # 99: never seen
    ix.apply(0, [BlockRemoved((1, 2), 0, DEVICE)])
    assert ix.query_tiers(PROMPT, [DISK])[0][DISK] == TierOverlap(4, 0, 4, {}, None)
    assert ix.worker_info(0)["media"] == {DISK: {"kv": 3}}  # 99 counted, not placed
    ix.apply(0, [state(2, DISK)])
    assert ix.query_tiers(PROMPT, [DISK])[0][DISK] == TierOverlap(4, 4, 0, {DISK: 4}, DISK)


def test_attention_only_workers_and_the_media_argument() -> None:
    ix = Indexer(B, hybrid=False)
    ix.apply(0, [kv([1], None, PROMPT[:2], DEVICE), kv([2], 1, PROMPT[2:4], DISK)])
    assert ix.query_tiers(PROMPT, [DISK, DEVICE]) == {
        0: {DISK: TierOverlap(4, 4, 0, {DISK: 2}, None), DEVICE: TierOverlap(2, 2, 0, {}, None)}
    }
    for bad in ([], "host", ["gpu"], [HOST, 3], None, {"host": 1}):
        with pytest.raises(ValueError, match="media"):
            ix.query_tiers(PROMPT, bad)
    with pytest.raises(TypeError, match="token_ids"):
        ix.query_tiers({1, 2})


def test_unknown_media_are_counted_not_placed() -> None:
    ix = Indexer(B)
    ix.apply(0, [kv([1], None, PROMPT[:2], "TAPE"), BlockRemoved((1,), 0, "TAPE")])
    assert ix.worker_info(0)["skipped"] == {"medium TAPE": 2}
    assert all(o.longest_matched == 0 for o in ix.query_tiers(PROMPT)[0].values())


# ---------------------------------------------------------------- over HTTP


@pytest.fixture(scope="module")
def address() -> Iterator[tuple[str, int]]:
    ix = Indexer(B)
    ix.apply(1, [kv([1, 2, 3, 4], None, PROMPT[:8], DEVICE), state(3, HOST)])
    srv = IndexServer(("127.0.0.1", 0), ix, threading.Lock(), read_timeout_s=2.0)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield "127.0.0.1", srv.server_port
    srv.shutdown()
    thread.join(5)
    srv.server_close()


def post(address: tuple[str, int], body: dict[str, Any]) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(*address, timeout=10)
    try:
        data = json.dumps(body).encode()
        conn.request("POST", "/query", data, {"Content-Length": str(len(data))})
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        conn.close()


def test_http_tiers_are_asked_for_and_the_plain_answer_is_unchanged(
    address: tuple[str, int],
) -> None:
    plain = {"longest_matched": 8, "gpu": 8, "usable": 0, "tail_recompute": 8}
    assert post(address, {"token_ids": PROMPT})[1]["instances"]["1"] == plain
    assert post(address, {"token_ids": PROMPT, "tiers": False})[1]["instances"]["1"] == plain
    status, body = post(address, {"token_ids": PROMPT, "tiers": True})
    assert status == 200
    device = {"longest_matched": 8, "usable": 0, "tail_recompute": 8, "load": {}}
    host = {"longest_matched": 8, "usable": 6, "tail_recompute": 2, "load": {}}
    assert body["instances"]["1"] == {
        **plain,
        "cpu": 8,
        "disk": 8,
        "tiers": {
            "device": {**device, "state_medium": None},
            "host": {**host, "state_medium": "host"},
            "disk": {**host, "state_medium": "host"},
        },
    }
    status, body = post(address, {"token_ids": PROMPT, "tiers": ["host"]})
    assert body["instances"]["1"]["tiers"] == {"host": {**host, "state_medium": "host"}}
    assert body["instances"]["1"]["cpu"] == 8 and "disk" not in body["instances"]["1"]


@pytest.mark.parametrize(
    ("tiers", "message"),
    [
        ("host", "tiers must be true, false or a list of media; got string"),
        (1, "tiers must be true, false or a list of media; got number"),
        ({"host": True}, "got object"),
        ([], "tiers: media must be a non-empty list"),
        (["GPU"], "tiers: media must name tiers from device, host, disk; got 'GPU'"),
        (["host", None], "got None"),
    ],
)
def test_http_a_malformed_tiers_field_is_a_400(
    address: tuple[str, int], tiers: Any, message: str
) -> None:
    status, body = post(address, {"token_ids": PROMPT, "tiers": tiers})
    assert status == 400 and message in body["error"]
    assert post(address, {"token_ids": PROMPT})[0] == 200  # still serving


def test_a_lookahead_cut_applies_on_every_tier() -> None:
    """vLLM 0.33 with EAGLE: a block hashed with the tokens after it is reused only where
    the prompt goes on with them; a copy on a lower tier keeps its hash, so its cut too.
    By hand: block [3, 4] was hashed with lookahead [5]; the prompt goes on with 9."""
    ix = Indexer(B)
    ahead = BlockStored((1, 2), None, [1, 2, 3, 4], B, lookahead=((3,), (5,)))
    ix.apply(0, [ahead, kv([1, 2], None, [1, 2, 3, 4], HOST), kv([3], 2, [5, 0], HOST)])
    got = ix.query_tiers([1, 2, 3, 4, 9, 9, 9])[0]
    assert got[DEVICE].longest_matched == got[HOST].longest_matched == 2
    got = ix.query_tiers([1, 2, 3, 4, 5, 0, 0])[0]
    assert (got[DEVICE].longest_matched, got[HOST].longest_matched) == (4, 6)
    assert ix.query([1, 2, 3, 4, 9, 9, 9])[0].longest_matched == 2
