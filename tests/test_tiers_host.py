"""The data path below the tree: host (L2) pools, `Mover` copies and `StoreIO` (L3 bundles).

Every check compares bytes with an independent copy of what was written (a clone taken
before the copy, compared through integer views, so NaN payloads count): round trips device
-> host -> device and device -> store -> device for every dtype a pool supports; a full host
pool refuses and leaks nothing; a seeded random run against a reference model, with
conservation checked after every step; a missing, corrupt or malformed store object is a
counted miss that leaves its destination as it was; bad input changes nothing.
Runs on MAMBARADIX_TEST_DEVICE (cpu by default; cuda in bench/gpu_check.sh)."""

from __future__ import annotations

import os
import random

import pytest
import torch

from engine_device import ENGINE_DEVICE as DEVICE
from mambaradix.pools import StateGeometry
from mambaradix.pools.host import HostKVPool, HostStatePool, kv_group, state_group
from mambaradix.pools.store_io import StoreIO, cache_namespace
from mambaradix.pools.torch_state import TorchStatePool
from mambaradix.pools.transfer import Mover, Transfer
from mambaradix.tiers import KV, MAMBA, FileStore, Namespace, ObjectKey, page_hashes

DTYPES = [
    torch.float64, torch.float32, torch.bfloat16, torch.float16,
    torch.float8_e4m3fn, torch.float8_e5m2, torch.int8,
]  # fmt: skip
INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
CHAIN = page_hashes(list(range(256)), 4)


def bits(t: torch.Tensor) -> torch.Tensor:
    """`t`'s bit patterns (a CPU clone): equal bits, equal tensors, NaNs included."""
    return t.detach().view(INT[t.element_size()]).cpu().clone()


def randomize(group: dict[str, torch.Tensor], gen: torch.Generator) -> None:
    """Random bit patterns in every tensor (every float8 / bf16 NaN and -0 possible)."""
    for t in group.values():
        view = t.view(INT[t.element_size()])
        rnd = torch.randint(-(2**62), 2**62, view.shape, generator=gen, dtype=torch.int64)
        view.copy_(rnd.to(view.dtype).to(view.device))


def state_pool(dtype: torch.dtype, slots: int = 6) -> TorchStatePool:
    name = str(dtype).removeprefix("torch.")
    geom = StateGeometry(3, ((5, 4), (3, 2)), (2, 3, 4), conv_dtype=name, ssm_dtype=name)
    return TorchStatePool(geom, slots, device=DEVICE)


def kv_tensors(dtype: torch.dtype, tokens: int = 32) -> dict[str, torch.Tensor]:
    return kv_group(*(torch.zeros((2, tokens, 2, 8), dtype=dtype, device=DEVICE) for _ in "kv"))


def equal_units(a: dict[str, torch.Tensor], ia: list[int], b: dict[str, torch.Tensor],
                ib: list[int]) -> bool:  # fmt: skip
    return all(torch.equal(bits(a[p][:, ia]), bits(b[p][:, ib])) for p in a)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


# ---------------------------------------------------------------- round trips, every dtype


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_device_host_device_is_bitwise(dtype: torch.dtype, gen: torch.Generator) -> None:
    dev, back = state_pool(dtype), state_pool(dtype)
    src, dst = state_group(dev), state_group(back)
    randomize(src, gen)
    before = {p: bits(t) for p, t in src.items()}
    host = HostStatePool(src, 4)
    mover = Mover(DEVICE)
    got = host.demote(mover, src, [4, 1, 2])
    assert got is not None
    units, copy = got
    assert list(units) == [0, 1, 2] and isinstance(copy, Transfer)
    copy.wait()
    assert copy.done() and host.tensors["ssm"].device.type == "cpu"
    assert host.pinned == torch.cuda.is_available()
    host.load(mover, [2, 0], dst, [0, 5]).wait()  # other slots, other order
    for part, t in dst.items():
        assert torch.equal(bits(t[:, 0]), before[part][:, 2])
        assert torch.equal(bits(t[:, 5]), before[part][:, 4])
        assert not bits(t[:, 1]).any()  # untouched slots stay zero
    kv, kv_back = kv_tensors(dtype), kv_tensors(dtype)
    randomize(kv, gen)
    host_kv = HostKVPool(kv, 16, page_size=4)
    got = host_kv.demote(mover, kv, list(range(8, 16)))
    assert got is not None
    got[1].wait()
    host_kv.load(mover, got[0], kv_back, list(range(20, 28))).wait()
    assert equal_units(kv, list(range(8, 16)), kv_back, list(range(20, 28)))
    host.check_invariants()
    host_kv.check_invariants()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_device_store_device_is_bitwise(dtype: torch.dtype, gen: torch.Generator, tmp_path) -> None:
    dev, back = state_pool(dtype), state_pool(dtype)
    src, dst = state_group(dev), state_group(back)
    kv, kv_back = kv_tensors(dtype), kv_tensors(dtype)
    randomize(src, gen)
    randomize(kv, gen)
    store = FileStore(tmp_path, cache_namespace("m", src, kv, 4))
    io = StoreIO(store, src, kv, 4)
    assert io.save_states([(CHAIN[0], 3), (CHAIN[1], 0)], src).wait() == [True, True]
    pages = [(CHAIN[i], list(range(4 * i, 4 * i + 4))) for i in range(3)]
    assert io.save_kv(pages, kv).wait() == [True] * 3
    assert io.load_states([(CHAIN[1], 2), (CHAIN[0], 4)], dst).wait() == [True, True]
    assert equal_units(src, [0, 3], dst, [2, 4])
    to = [(h, [31 - u for u in units]) for h, units in pages]  # other tokens, reversed
    assert io.load_kv(to, kv_back).wait() == [True] * 3
    assert equal_units(kv, list(range(12)), kv_back, [31 - u for u in range(12)])
    s = io.stats()
    assert (s.saved, s.loaded, s.missed, s.refused, s.malformed) == (5, 5, 0, 0, 0)
    width = torch.empty((), dtype=dtype).element_size()
    state_bytes = 3 * (5 * 4 + 3 * 2 + 2 * 3 * 4) * width  # layers x (conv0 + conv1 + ssm)
    page_bytes = 2 * (2 * 4 * 2 * 8) * width  # k and v: layers x tokens x heads x dim
    assert s.bytes_saved == s.bytes_loaded == 2 * state_bytes + 3 * page_bytes


def test_background_store_io_is_asynchronous_to_the_caller(tmp_path, gen) -> None:
    src, kv = state_group(state_pool(torch.float32)), kv_tensors(torch.float32)
    dst = state_group(state_pool(torch.float32))
    randomize(src, gen)
    store = FileStore(tmp_path, cache_namespace("m", src, kv, 4))
    io = StoreIO(store, src, kv, 4, background=True)
    saved = io.save_states([(CHAIN[i], i) for i in range(6)], src)
    loaded = io.load_states([(CHAIN[i], 5 - i) for i in range(6)], dst)  # queued after it
    assert loaded.wait() == [True] * 6 and saved.done() and saved.wait() == [True] * 6
    assert equal_units(src, list(range(6)), dst, list(range(5, -1, -1)))
    io.close()
    io.close()


# ---------------------------------------------------------------- pressure and bad input


def test_a_full_host_pool_refuses_and_leaks_nothing(gen) -> None:
    src = state_group(state_pool(torch.float32))
    randomize(src, gen)
    host, mover = HostStatePool(src, 3), Mover(DEVICE)
    first = host.demote(mover, src, [0, 1])
    assert first is not None
    first[1].wait()
    snapshot = {p: bits(t) for p, t in host.tensors.items()}
    assert host.demote(mover, src, [2, 3]) is None  # 2 asked, 1 free
    assert host.available_size() == 1
    assert all(torch.equal(bits(host.tensors[p]), snapshot[p]) for p in snapshot)
    host.check_conservation([first[0]])
    last = host.demote(mover, src, [5])
    assert last is not None and list(last[0]) == [2]
    last[1].wait()
    assert host.demote(mover, src, [4]) is None and host.available_size() == 0
    host.check_conservation([first[0], last[0]])
    with pytest.raises(AssertionError, match="leak"):
        host.check_conservation([first[0]])  # slot 2 is neither free nor held
    with pytest.raises(AssertionError, match="held twice"):
        host.check_conservation([first[0], last[0], [1]])
    host.free([*first[0], *last[0]])
    host.check_conservation([])
    kv = kv_tensors(torch.float32)
    host_kv = HostKVPool(kv, 8, page_size=4)
    one = host_kv.demote(mover, kv, range(4))
    assert one is not None and host_kv.demote(mover, kv, range(4, 12)) is None
    host_kv.check_conservation([list(one[0])[:1]])  # any token of a page holds the page
    with pytest.raises(AssertionError, match="held and free"):
        host_kv.check_conservation([one[0], [4]])


def test_bad_input_is_refused_before_anything_moves(gen) -> None:
    src = state_group(state_pool(torch.float32))
    randomize(src, gen)
    other = state_group(state_pool(torch.bfloat16))
    host, mover = HostStatePool(src, 4), Mover(DEVICE)
    before = {p: bits(t) for p, t in host.tensors.items()}
    cases = [
        (lambda: host.demote(mover, other, [0]), ValueError, "differ"),
        (lambda: host.demote(mover, src, [9]), ValueError, "out of range"),
        (lambda: host.demote(mover, src, [0.5]), TypeError, "src_idx"),
        (lambda: mover.copy(src, [0, 1], host.tensors, [2, 2]), ValueError, "more than once"),
        (lambda: mover.copy(src, [0], host.tensors, [1, 2]), ValueError, "differ in length"),
        (lambda: mover.copy(src, [0], {"ssm": host.tensors["ssm"]}, [1]), ValueError, "differ"),
        (lambda: mover.copy({}, [0], host.tensors, [1]), TypeError, "src"),
        (lambda: HostStatePool(src, 0), ValueError, "size"),
        (lambda: HostKVPool(kv_tensors(torch.float32), 10, page_size=4), ValueError, "multiple"),
    ]
    for call, exc, match in cases:
        with pytest.raises(exc, match=match):
            call()
        assert host.available_size() == 4
        assert all(torch.equal(bits(host.tensors[p]), before[p]) for p in before)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="pin=True needs CUDA"):
            HostStatePool(src, 2, pin=True)


def test_store_io_refuses_a_store_of_another_layout_and_bad_items(tmp_path) -> None:
    src, kv = state_group(state_pool(torch.float32)), kv_tensors(torch.float32)
    with pytest.raises(ValueError, match="store: its namespace has layout"):
        StoreIO(FileStore(tmp_path, Namespace("m")), src, kv, 4)
    with pytest.raises(ValueError, match="store: its namespace"):
        StoreIO(FileStore(tmp_path, cache_namespace("m", src, kv, 8)), src, kv, 4)
    store = FileStore(tmp_path, cache_namespace("m", src, kv, 4))
    io = StoreIO(store, src, kv, 4)
    bf16 = state_group(state_pool(torch.bfloat16))
    cases = [
        (lambda: io.save_states([("nothex", 0)], src), ValueError, "page hash"),
        (lambda: io.save_states([(CHAIN[0], 9)], src), ValueError, "out of range"),
        (lambda: io.save_states([(CHAIN[0], 0), (CHAIN[0], 1)], src), ValueError, "more than"),
        (lambda: io.save_states([(CHAIN[0], 0)], bf16), ValueError, "layout"),
        (lambda: io.save_kv([(CHAIN[0], [0, 1])], kv), ValueError, "4"),
        (lambda: io.load_states(CHAIN[0], src), TypeError, "pairs"),
    ]
    for call, exc, match in cases:
        with pytest.raises(exc, match=match):
            call()
    assert store.stats().puts == 0 and store.stats().gets == 0 and os.listdir(tmp_path) == []


# ---------------------------------------------------------------- misses are never wrong states


def test_missing_corrupt_and_malformed_objects_are_counted_misses(tmp_path, gen) -> None:
    src, kv = state_group(state_pool(torch.float32)), kv_tensors(torch.float32)
    dst = state_group(state_pool(torch.float32))
    randomize(src, gen)
    randomize(dst, gen)
    ns = cache_namespace("m", src, kv, 4)
    store = FileStore(tmp_path, ns)
    io = StoreIO(store, src, kv, 4)
    assert io.save_states([(CHAIN[i], i) for i in range(3)], src).wait() == [True] * 3
    name = ns.object_name(ObjectKey(CHAIN[1], MAMBA))
    with open(tmp_path / f"{name}.bin", "r+b") as f:  # flip one payload byte
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 0x40]))
    # a verified object under the right name, with a part of the wrong size
    assert store.put([(ObjectKey(CHAIN[2], MAMBA), {"conv0": b"x", "conv1": b"", "ssm": b""})])
    before = {p: bits(t) for p, t in dst.items()}
    flags = io.load_states([(CHAIN[i], i + 2) for i in range(4)], dst).wait()
    assert flags == [True, False, False, False]  # ok, corrupt, malformed, missing
    for part, t in dst.items():
        assert torch.equal(bits(t[:, 2]), bits(src[part][:, 0]))
        assert torch.equal(bits(t[:, 3:]), before[part][:, 3:])  # the misses: untouched
    s, st = io.stats(), store.stats()
    assert (s.loaded, s.missed, s.malformed) == (1, 3, 1)
    assert (st.corrupt, st.hits, st.misses) == (1, 2, 2)
    assert store.exists([ObjectKey(CHAIN[1], MAMBA)]) == [False]  # the store removed it
    # a store of another dtype has other names: everything misses, nothing is decoded
    bf16 = state_group(state_pool(torch.bfloat16))
    kv16 = kv_tensors(torch.bfloat16)
    io16 = StoreIO(FileStore(tmp_path, cache_namespace("m", bf16, kv16, 4)), bf16, kv16, 4)
    assert io16.load_states([(CHAIN[0], 0)], bf16).wait() == [False]
    assert not bits(bf16["ssm"]).any()
    assert io.load_kv([(CHAIN[0], [0, 1, 2, 3])], kv).wait() == [False]
    assert store.exists([ObjectKey(CHAIN[0], KV)]) == [False]


def test_a_full_store_refuses_and_counts(tmp_path, gen) -> None:
    src, kv = state_group(state_pool(torch.float32)), kv_tensors(torch.float32)
    randomize(src, gen)
    store = FileStore(tmp_path, cache_namespace("m", src, kv, 4), capacity_bytes=1500)
    io = StoreIO(store, src, kv, 4)
    assert io.save_states([(CHAIN[i], i) for i in range(3)], src).wait() == [True, False, False]
    s = io.stats()
    assert (s.saved, s.refused) == (1, 2) and store.stats().put_rejected == 2


# ---------------------------------------------------------------- a seeded run with a model


class RandomRun:
    """Demote, load, free, save and load through a store at random; after every step the
    host pools' conservation and invariants hold and every load gives the reference bytes
    (`held`, `held_kv`, `stored`: clones taken when the bytes left the device)."""

    def __init__(self, seed: int, tmp_path) -> None:
        self.rng, self.gen = random.Random(seed), torch.Generator().manual_seed(seed)
        dtype = self.rng.choice(DTYPES)
        self.dev, self.kv = state_group(state_pool(dtype, slots=8)), kv_tensors(dtype, tokens=48)
        self.host, self.host_kv = HostStatePool(self.dev, 5), HostKVPool(self.kv, 24, page_size=4)
        self.mover = Mover(DEVICE)
        store = FileStore(tmp_path, cache_namespace("m", self.dev, self.kv, 4))
        self.io = StoreIO(store, self.dev, self.kv, 4)
        self.held: dict[int, dict[str, torch.Tensor]] = {}  # host slot -> its bytes
        self.held_kv: list[tuple[list[int], dict[str, torch.Tensor]]] = []
        self.stored: dict[str, dict[str, torch.Tensor]] = {}  # page hash -> a state's bytes

    def step(self) -> None:
        randomize(self.dev, self.gen)  # the device moves on between steps
        randomize(self.kv, self.gen)
        ops = [self.demote, self.load, self.drop, self.kv_round_trip, self.save, self.restore]
        self.rng.choice(ops)()
        self.check()

    def demote(self) -> None:
        slots = self.rng.sample(range(8), self.rng.randint(1, 3))
        got = self.host.demote(self.mover, self.dev, slots)
        if got is None:
            assert self.host.available_size() < len(slots)
            return
        for unit, slot in zip(got[0], slots, strict=True):
            self.held[unit] = {p: bits(t[:, slot]) for p, t in self.dev.items()}
        got[1].wait()

    def load(self) -> None:
        if not self.held:
            return
        units = self.rng.sample(sorted(self.held), self.rng.randint(1, len(self.held)))
        to = self.rng.sample(range(8), len(units))
        self.host.load(self.mover, units, self.dev, to).wait()
        for u, d in zip(units, to, strict=True):
            assert all(torch.equal(bits(self.dev[p][:, d]), self.held[u][p]) for p in self.dev)

    def drop(self) -> None:  # the tree drops host copies
        gone = self.rng.sample(sorted(self.held), self.rng.randint(0, len(self.held)))
        self.host.free(gone)
        for u in gone:
            del self.held[u]

    def kv_round_trip(self) -> None:
        tokens = self.rng.sample(range(48), 4 * self.rng.randint(1, 3))
        got = self.host_kv.demote(self.mover, self.kv, tokens)
        if got is not None:
            self.held_kv.append((list(got[0]), {p: bits(t[:, tokens]) for p, t in self.kv.items()}))
            got[1].wait()
        elif self.held_kv:  # full: bring one back and free it
            units, want = self.held_kv.pop(self.rng.randrange(len(self.held_kv)))
            to = self.rng.sample(range(48), len(units))
            self.host_kv.load(self.mover, units, self.kv, to).wait()
            assert all(torch.equal(bits(self.kv[p][:, to]), want[p]) for p in self.kv)
            self.host_kv.free(units)

    def save(self) -> None:
        page, slot = self.rng.choice(CHAIN[:6]), self.rng.randrange(8)
        assert self.io.save_states([(page, slot)], self.dev).wait() == [True]
        self.stored[page] = {p: bits(t[:, slot]) for p, t in self.dev.items()}

    def restore(self) -> None:  # a miss leaves the slot as it was
        page, slot = self.rng.choice(CHAIN[:6]), self.rng.randrange(8)
        old = {p: bits(t[:, slot]) for p, t in self.dev.items()}
        (hit,) = self.io.load_states([(page, slot)], self.dev).wait()
        assert hit == (page in self.stored)
        want = self.stored[page] if hit else old
        assert all(torch.equal(bits(self.dev[p][:, slot]), want[p]) for p in self.dev)

    def check(self) -> None:
        self.host.check_invariants()
        self.host_kv.check_invariants()
        self.host.check_conservation([[u] for u in self.held])
        self.host_kv.check_conservation([units for units, _ in self.held_kv])
        assert self.host.available_size() == 5 - len(self.held)


def run_random(steps: int, seed: int, tmp_path) -> None:
    run = RandomRun(seed, tmp_path)
    for _ in range(steps):
        run.step()


def test_random_run_against_a_reference_model(tmp_path) -> None:
    run_random(steps=120, seed=1, tmp_path=tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 8))
def test_random_runs_long(tmp_path, seed: int) -> None:
    run_random(steps=600, seed=seed, tmp_path=tmp_path)
