"""The engine with a host tier (`host_state_slots`, `host_kv_tokens`, `engine.tiers`), on
both tiny models: device pools too small for the prompts, so the tree evicts into host
memory and later prompts load their prefixes back; the host pools are small too, so the
host drops entries as well. Every generation's tokens and fp32 logits equal, bit for bit,
those of an engine that never caches (`deterministic=True`, one prompt per call: the same
cells computed in the same shapes). After every call: the device pools' conservation, the
tree's invariants, the host tier's (every host unit free or held by exactly one visible
key, nothing in flight) and the residency layer's (`Engine.check`)."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from engine_device import ENGINE_DEVICE as DEVICE
from engine_device import engine_net
from mambaradix.engine import Engine
from mambaradix.tiers.cost import HitCost, Link, LoadRule, Prefill

GRID = 16
NEW = 3


@pytest.fixture
def store_dir() -> Any:
    """On /dev/shm where there is one (tmpfs: fsync is free, the tests stay fast); the
    durable path on a disk is the file store's own tests' (test_tiers_file_store.py)."""
    scratch = "/dev/shm" if os.path.isdir("/dev/shm") else None
    root = tempfile.mkdtemp(prefix="mrx-engine-tiers-", dir=scratch)
    yield Path(root)
    shutil.rmtree(root, ignore_errors=True)


# Qwen3-Next's runs (twice Nemotron-H's time) in the slow tier: the default tier keeps
# one family's engine runs (<= 90 s in all on 2 cores), CI runs both.
@pytest.fixture(
    scope="module",
    params=["nemotron-h-tiny", pytest.param("qwen3-next-tiny", marks=pytest.mark.slow)],
)
def net(request: pytest.FixtureRequest) -> Any:
    return engine_net(request.param)


def engine(net: Any, **kw: Any) -> Engine:
    return Engine(
        model=net.config.model_type, net=net, deterministic=True, chunk_size=GRID,
        device=DEVICE, max_running=1, **kw,
    )  # fmt: skip


def prompts(seed: int, n: int, shuffle: bool) -> list[list[int]]:
    """Turns over three 48-token heads, each with its own tail: in turn (the device holds
    about one, so every head comes back from the host), or in random order."""
    rng = random.Random(seed)
    heads = [[rng.randrange(1024) for _ in range(48)] for _ in range(3)]
    out = []
    for i in range(n):
        head = rng.choice(heads) if shuffle else heads[i % 3]
        cut = rng.choice([33, 40, 48]) if shuffle else 48
        out.append(head[:cut] + [rng.randrange(1024) for _ in range(9)])
    return out


def same(a: Any, b: Any) -> bool:
    return a.output_ids == b.output_ids and all(
        torch.equal(x, y) for x, y in zip(a.logits, b.logits, strict=True)
    )


def run(
    net: Any, seed: int, n: int, host_slots: int, host_kv: int, shuffle: bool, **store: Any
) -> Engine:
    tiered = engine(
        net, kv_tokens=64, state_slots=3, host_state_slots=host_slots, host_kv_tokens=host_kv,
        **store,
    )  # fmt: skip
    return check_against_uncached(net, tiered, prompts(seed, n, shuffle))


def check_against_uncached(net: Any, tiered: Engine, todo: list[list[int]]) -> Engine:
    plain = engine(net, prefix_cache=False, kv_tokens=64, state_slots=3)
    for p in todo:
        (got,) = tiered.generate([p], max_new_tokens=NEW)
        (want,) = plain.generate([p], max_new_tokens=NEW)
        assert same(got, want)
        tiered.check()
    return tiered


def test_every_returning_head_comes_back_from_the_host(net: Any) -> None:
    """Heads in turn: the device (64 KV tokens) holds about one prompt, the host (160
    tokens, 6 states) all three heads. Prompts 4..9 each find their head's 48 tokens
    (the grid state at 48 and its KV) in the host only: 6 loads, 6 x 48 cached tokens."""
    eng = run(net, seed=1, n=9, host_slots=6, host_kv=160, shuffle=False)
    s = eng.stats()
    assert s["host_loads"] == 6 and s["host_failed_loads"] == 0
    assert s["host_loaded_kv_tokens"] == s["cached_tokens"] == 6 * 48


def test_host_round_trips_under_pressure(net: Any) -> None:
    """Random heads and cuts, a host too small for them: it drops entries as it goes."""
    eng = run(net, seed=2, n=14, host_slots=4, host_kv=96, shuffle=True)
    s = eng.stats()
    assert s["host_loads"] > 0 and s["host_loaded_kv_tokens"] > 0  # the host tier served
    assert s["host_demoted_states"] > 4  # more than the host holds: it dropped some


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, 4])
def test_host_round_trips_under_more_pressure(net: Any, seed: int) -> None:
    eng = run(net, seed=seed, n=14, host_slots=2, host_kv=48, shuffle=True)
    s = eng.stats()
    assert s["host_demoted_states"] > 2 and s["host_loads"] > 0


def test_every_returning_head_comes_back_from_host_or_store(net: Any, store_dir: Path) -> None:
    """The same turns with a host too small for one head (2 states, 24 tokens) and a file
    store below it: each of prompts 4..9 still loads its 48-token head, now mostly from
    the store (what the host dropped was written there)."""
    eng = run(net, 1, 9, 2, 24, False, store_dir=store_dir, store_gb=1.0)
    s = eng.stats()
    assert s["host_loads"] == 6 and s["host_failed_loads"] == 0
    assert s["host_loaded_kv_tokens"] == s["cached_tokens"] == 6 * 48
    assert s["host_store_loaded_states"] > 0 and s["host_store_loaded_kv_tokens"] > 24
    assert s["host_store_misses"] == 0


def test_a_full_store_deletes_what_its_lru_drops(net: Any, store_dir: Path) -> None:
    """A store of 100 kB (a few states and tokens of these models): it drops entries and
    deletes their objects; `Engine.check` counts the objects against its LRU each call."""
    eng = run(net, 2, 14, 2, 24, True, store_dir=store_dir, store_gb=1e-4)
    s = eng.stats()
    assert s["host_store_deletes"] > 0 and s["host_store_writes"] > s["host_store_deletes"]


def test_a_corrupt_store_is_a_miss_never_a_wrong_state(net: Any, store_dir: Path) -> None:
    """Every object in the store damaged after the first three prompts: the loads that
    need them fail (counted), the prompts are computed, the outputs stay exact."""
    eng = engine(net, kv_tokens=64, state_slots=3, host_state_slots=2, host_kv_tokens=24,
                 store_dir=store_dir, store_gb=1.0)  # fmt: skip
    todo = prompts(1, 9, False)
    check_against_uncached(net, eng, todo[:3])
    damaged = 0
    for path in store_dir.rglob("*.bin"):
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        damaged += 1
    assert damaged > 0
    check_against_uncached(net, eng, todo[3:])
    s = eng.stats()
    assert s["host_store_misses"] > 0 and s["host_failed_loads"] > 0


@pytest.mark.parametrize(
    "kw, named",
    [
        ({"store_gb": 1.0}, "store_dir"),
        ({"store_dir": "x"}, "store_gb"),
        ({"store_dir": "x", "store_gb": -1}, "store_gb"),
        ({"store_dir": 3, "store_gb": 1.0}, "store_dir"),
    ],
)
def test_bad_store_input_names_the_parameter(net: Any, kw: dict[str, Any], named: str) -> None:
    with pytest.raises((TypeError, ValueError), match=named):
        engine(net, kv_tokens=64, state_slots=3, host_state_slots=2, host_kv_tokens=8, **kw)
    with pytest.raises(ValueError, match="host tier"):
        engine(net, kv_tokens=64, state_slots=3, store_dir="x", store_gb=1.0)


def test_without_a_host_tier_nothing_is_loaded(net: Any) -> None:
    eng = engine(net, kv_tokens=64, state_slots=3)
    assert eng.host_tier is None and "host_loads" not in eng.stats()


@pytest.mark.parametrize(
    "kw, named",
    [
        ({"host_state_slots": -1, "host_kv_tokens": 8}, "host_state_slots"),
        ({"host_state_slots": 2, "host_kv_tokens": 0}, "host_kv_tokens"),
        ({"host_state_slots": 0, "host_kv_tokens": 8}, "host_state_slots"),
        ({"host_state_slots": 2, "host_kv_tokens": 8, "prefix_cache": False}, "prefix_cache"),
        ({"host_state_slots": 2.5, "host_kv_tokens": 8}, "host_state_slots"),
    ],
)
def test_bad_host_tier_input_names_the_parameter(net: Any, kw: dict[str, Any], named: str) -> None:
    with pytest.raises((TypeError, ValueError), match=named):
        engine(net, kv_tokens=64, state_slots=3, **kw)


def test_batches_with_a_host_tier_keep_the_prefill_exact(net: Any) -> None:
    """Prompts three at a time (loads while other requests run and hold the device): each
    first token's fp32 logits (the prefill's last cell, on the grid) equal the uncached
    engine's; the decode steps run in batches of other shapes, so only the prefill is
    compared. Conservation and the tiers' invariants after every call."""
    kw = {"kv_tokens": 192, "state_slots": 5, "max_running": 3}
    eng = Engine(
        model=net.config.model_type, net=net, deterministic=True, chunk_size=GRID,
        device=DEVICE, host_state_slots=6, host_kv_tokens=160, **kw,
    )  # fmt: skip
    plain = engine(net, prefix_cache=False, kv_tokens=64, state_slots=3)
    todo = prompts(5, 12, shuffle=True)
    for i in range(0, len(todo), 3):
        got = eng.generate(todo[i : i + 3], max_new_tokens=2)
        eng.check()
        for p, g in zip(todo[i : i + 3], got, strict=True):
            (want,) = plain.generate([p], max_new_tokens=1)
            assert torch.equal(g.logits[0], want.logits[0])
    assert eng.stats()["host_loads"] > 0


@pytest.mark.parametrize(
    "write", ["through", pytest.param("through-selective", marks=pytest.mark.slow)]
)
def test_round_trips_under_pressure_in_every_write_mode(net: Any, write: str) -> None:
    """Write-through and write-through-selective (write-back is the tests above): random
    heads and cuts with a host too small for them; outputs exact, invariants each call."""
    eng = run(net, seed=2, n=14, host_slots=4, host_kv=96, shuffle=True, tier_write=write)
    s = eng.stats()
    assert s["host_loads"] > 0 and s["host_demoted_states"] > 0


def test_write_through_copies_heads_while_on_the_device(net: Any) -> None:
    """Heads in turn, write-through: each prompt's units go to the host when cached, so
    a head is below before the device ever evicts it; the host holds copies of what the
    device holds too, so it is given room for the three last prompts (240 tokens, 12
    states); every returning head loads its 48 tokens, outputs exact."""
    eng = engine(
        net, kv_tokens=64, state_slots=3, host_state_slots=12, host_kv_tokens=240,
        tier_write="through",
    )  # fmt: skip
    todo = prompts(1, 9, False)
    check_against_uncached(net, eng, todo[:1])
    s = eng.stats()
    assert s["evicted_kv_tokens"] == 0 and s["host_demoted_kv_tokens"] > 0  # below already
    check_against_uncached(net, eng, todo[1:])
    s = eng.stats()
    assert s["host_loads"] == 6 and s["host_loaded_kv_tokens"] == s["cached_tokens"] == 6 * 48


@pytest.mark.slow
@pytest.mark.parametrize("write", ["through", "through-selective"])
def test_write_modes_with_a_store(net: Any, store_dir: Path, write: str) -> None:
    """Heads in turn over a small host and a store. Write-through: the heads come back
    from below. Selective: the device (64 tokens) evicts each prompt before its head is
    hit a second time, so no head is ever copied down and nothing loads."""
    eng = run(net, 1, 9, 2, 24, False, store_dir=store_dir, store_gb=1.0, tier_write=write)
    s = eng.stats()
    if write == "through":
        assert s["host_loads"] == 6 and s["host_store_loaded_states"] > 0
    else:
        assert s["host_loads"] == 0 and s["host_demoted_kv_tokens"] == 0


# a rule whose break-even is 32 tokens, by hand: recomputing n tokens takes n / 32 s (1
# FLOP per token at 32 FLOP/s, no attention term), a load 1 s (the link's latency; its
# bandwidth is so high that the bytes add ~1e-25 s)
HAND_RULE = LoadRule(
    HitCost("hand", 0, 0, linear_flops_per_token=1, attn_flops_per_pair=0),
    Prefill("hand", 32.0, 1.0, "by hand"),
    host=Link("hand", 1e30, 1.0, "by hand"),
    store=Link("hand", 1e30, 1.0, "by hand"),
)


@pytest.mark.slow
def test_the_engine_loads_or_recomputes_each_hit_by_cost(net: Any) -> None:
    """Under `HAND_RULE`, with everything evicted to the host between: a prompt sharing a
    16-token head with the host (its state at 16) recomputes it (16 / 32 = 0.5 s < 1 s);
    one sharing a 48-token head loads all 48 (1.5 s > 1 s; depth 32 would save nothing,
    1.0 s against 1 s plus the bytes). Without the rule both load. Outputs exact."""
    rng = random.Random(11)
    head_s, head_l = (
        [rng.randrange(1024) for _ in range(16)],
        [rng.randrange(1024) for _ in range(48)],
    )

    def tail(n: int) -> list[int]:
        return [rng.randrange(1024) for _ in range(n)]

    short1, long1, fill1 = head_s + tail(24), head_l + tail(9), tail(57)
    short2, fill2, long2 = head_s + tail(24), tail(57), head_l + tail(9)
    got = {}
    for rule in (None, HAND_RULE):
        eng = engine(
            net, kv_tokens=64, state_slots=3, host_state_slots=16, host_kv_tokens=512,
            tier_cost=rule,
        )  # fmt: skip
        check_against_uncached(net, eng, [short1, long1, fill1])
        s0 = eng.stats()
        check_against_uncached(net, eng, [short2, fill2])
        s1 = eng.stats()
        check_against_uncached(net, eng, [long2])
        s2 = eng.stats()
        short_cached = s1["cached_tokens"] - s0["cached_tokens"]
        got[rule is None] = short_cached, s2["cached_tokens"] - s1["cached_tokens"]
        got[rule is None] += (s2["host_recomputed"], s2["host_loads"] - s0["host_loads"])
    assert got[True] == (16, 48, 0, 2)  # always the deepest: both heads loaded
    assert got[False] == (0, 48, 1, 1)  # by cost: the short one recomputed


def fill_a_store(net: Any, store_dir: Path) -> tuple[Engine, list[list[int]]]:
    """Heads in turn over a small host (2 states, 24 tokens) and a store: the heads pass
    through the host into the store."""
    eng = engine(net, kv_tokens=64, state_slots=3, host_state_slots=2, host_kv_tokens=24,
                 store_dir=store_dir, store_gb=1.0)  # fmt: skip
    todo = prompts(1, 9, False)
    check_against_uncached(net, eng, todo)
    return eng, todo


def test_a_new_engine_finds_the_store_of_an_earlier_one(net: Any, store_dir: Path) -> None:
    """Engine A runs heads in turn over a small host and a store; engine B, new, on the
    same directory (same net, model and layout), lists A's objects (and passes over an
    object of another model), and a prompt on A's first head loads its 48 tokens from
    the store into B: output exact, `check` (the store's objects == its LRU) holds."""
    first, todo = fill_a_store(net, store_dir)
    ours = sorted(store_dir.glob("*.bin"))
    assert ours and first.stats()["host_store_found"] == 0
    other = ours[0].name.replace(f"_{net.config.model_type}_", "_another-model_")
    assert other != ours[0].name
    shutil.copy(ours[0], store_dir / other)
    second = engine(net, kv_tokens=64, state_slots=3, host_state_slots=2, host_kv_tokens=24,
                    store_dir=store_dir, store_gb=1.0)  # fmt: skip
    assert second.stats()["host_store_found"] == len(ours)
    second.check()
    check_against_uncached(net, second, [todo[0][:48] + [5, 6, 7, 8]])
    s = second.stats()
    assert s["host_loads"] == 1 and s["cached_tokens"] == 48
    assert s["host_store_loaded_kv_tokens"] == 48 and s["host_store_loaded_states"] == 1


def test_bad_tier_rules_name_the_parameter(net: Any) -> None:
    host = {"host_state_slots": 2, "host_kv_tokens": 8}
    with pytest.raises(ValueError, match="tier_write"):
        engine(net, kv_tokens=64, state_slots=3, tier_write="write-through", **host)
    with pytest.raises(TypeError, match="tier_cost"):
        engine(net, kv_tokens=64, state_slots=3, tier_cost=1.0, **host)
    for kw in ({"tier_write": "through"}, {"tier_cost": HAND_RULE}):
        with pytest.raises(ValueError, match=f"{next(iter(kw))} needs a host tier"):
            engine(net, kv_tokens=64, state_slots=3, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("wait_s", [5.0, 0.0])
def test_prefetch_reads_the_store_into_the_host_ahead(
    net: Any, store_dir: Path, wait_s: float
) -> None:
    """A new engine with prefetch over a filled store, given a prompt on its first head:
    at submission the 48 KV tokens and the state at 48 the load would take from the store
    (49 objects) are read into the host on the store's worker thread. Waiting up to 5 s at
    the match, the load finds them all in the host and reads nothing from the store; with
    no wait it takes from the store what is not read yet. Either way every read is done
    when `generate` returns, the output is exact, and `close` joins the worker."""
    fill_a_store(net, store_dir)
    eng = engine(net, kv_tokens=64, state_slots=3, host_state_slots=2, host_kv_tokens=64,
                 store_dir=store_dir, store_gb=1.0, prefetch_wait_s=wait_s)  # fmt: skip
    head = prompts(1, 1, False)[0][:48]
    check_against_uncached(net, eng, [head + [5, 6, 7, 8]])
    s = eng.stats()
    assert s["host_prefetched"] == 49 and s["host_prefetch_misses"] == 0
    assert s["host_loads"] == 1 and s["cached_tokens"] == 48
    from_store = s["host_store_loaded_kv_tokens"] + s["host_store_loaded_states"]
    if wait_s:
        assert from_store == 0 and s["host_prefetch_late"] == 0
    else:
        assert from_store <= 49
    assert eng.host_tier is not None and eng.host_tier.store is not None
    eng.close()
    assert eng.host_tier.store.ahead._worker is None


def test_bad_prefetch_input_names_the_parameter(net: Any) -> None:
    host = {"host_state_slots": 2, "host_kv_tokens": 8}
    with pytest.raises(ValueError, match="prefetch_wait_s needs a store"):
        engine(net, kv_tokens=64, state_slots=3, prefetch_wait_s=1.0, **host)
    with pytest.raises(ValueError, match="prefetch_wait_s"):
        engine(net, kv_tokens=64, state_slots=3, prefetch_wait_s=-1, store_dir="x",
               store_gb=1.0, **host)  # fmt: skip
