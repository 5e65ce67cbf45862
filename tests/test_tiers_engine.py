"""Tier round trips on the engine's tiny models, end to end: a request's cached state and KV
pages go to host memory and to a file store, every device copy is wiped, they come back into
other slots and other KV indices, and decoding goes on from there. The logits must equal,
bit for bit (fp32), those of an engine that never cached anything and ran the same chunks
(`deterministic=True`: every prefill cut on one grid, so both runs compute the same cells)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch

from engine_device import ENGINE_DEVICE as DEVICE
from engine_device import engine_net
from mambaradix.engine import Engine
from mambaradix.engine.adapter import PoolAdapter
from mambaradix.pools.host import HostKVPool, HostStatePool, kv_group, state_group
from mambaradix.pools.store_io import StoreIO, cache_namespace
from mambaradix.pools.transfer import Mover
from mambaradix.tiers import FileStore, page_hashes

GRID = 16  # chunk size = the deterministic grid = the store's KV page
NEW = 4  # tokens decoded after the restored prefix's prompt


@pytest.fixture(scope="module", params=["nemotron-h-tiny", "qwen3-next-tiny"])
def net(request: pytest.FixtureRequest) -> Any:
    return engine_net(request.param)


def engine(net: Any, prefix_cache: bool) -> Engine:
    return Engine(
        model=net.config.model_type, net=net, prefix_cache=prefix_cache, deterministic=True,
        chunk_size=GRID, kv_tokens=256, state_slots=8, device=DEVICE,
    )  # fmt: skip


def continue_from(ad: PoolAdapter, prompt: list[int], start: int, slot: int,
                  kv: list[int]) -> list[torch.Tensor]:  # fmt: skip
    """Prefill prompt[start:] on the grid from the state in `slot`, then decode NEW - 1
    tokens greedily; the fp32 logits that chose each of the NEW tokens."""
    index = np.asarray(kv, dtype=np.int64)[None]
    pos, n = start, len(prompt)
    while pos < n:
        end = min((pos // GRID + 1) * GRID, n)
        logits = ad.forward([prompt[pos:end]], [pos], index[:, :end], [slot])
        pos = end
    out = [logits[0].cpu()]
    for step in range(NEW - 1):
        token = int(out[-1].argmax())
        out.append(ad.forward([[token]], [n + step], index[:, : n + step + 1], [slot])[0].cpu())
    return out


def wipe(ad: PoolAdapter) -> None:
    ad.states.clear(range(ad.states.capacity))
    ad.k.zero_()
    ad.v.zero_()


def test_state_and_kv_round_trip_through_host_and_store_then_decode(net: Any, tmp_path) -> None:
    rng = random.Random(7)
    first = [rng.randrange(1024) for _ in range(40)]
    prompt = first[:37] + [rng.randrange(1024) for _ in range(9)]
    eng = engine(net, prefix_cache=True)
    eng.generate([first], max_new_tokens=2)
    hit = eng.mgr.tree.match_prefix(prompt, read_only=True)
    assert hit.prefix_len == 32 and hit.node.state is not None  # the state at grid point 32
    slot, kv = hit.node.state, list(hit.kv_indices)
    ad, mover = eng.adapter, Mover(DEVICE)
    states, kvs = state_group(ad.states), kv_group(ad.k, ad.v)

    # down: to host memory and to a file store
    host, host_kv = HostStatePool(states, 2), HostKVPool(kvs, 64, page_size=GRID)
    got, got_kv = host.demote(mover, states, [slot]), host_kv.demote(mover, kvs, kv)
    assert got is not None and got_kv is not None
    got[1].wait()
    got_kv[1].wait()
    io = StoreIO(FileStore(tmp_path, cache_namespace("tiny", states, kvs, GRID)), states, kvs, GRID)
    chain = page_hashes(prompt[:32], GRID)
    assert io.save_states([(chain[-1], slot)], states).wait() == [True]
    pages = [(h, kv[GRID * i : GRID * (i + 1)]) for i, h in enumerate(chain)]
    assert io.save_kv(pages, kvs).wait() == [True, True]

    want = engine(net, prefix_cache=False).generate([prompt], max_new_tokens=NEW)[0]
    (new_slot,) = eng.mgr.slots.alloc(1) or []
    new_kv = list(eng.mgr.kv.alloc(len(prompt) + NEW) or [])
    assert new_slot != slot and not set(new_kv) & set(kv)

    # up from host memory, into other slots and KV indices
    wipe(ad)
    host.load(mover, got[0], states, [new_slot]).wait()
    host_kv.load(mover, got_kv[0], kvs, new_kv[:32]).wait()
    from_host = continue_from(ad, prompt, 32, new_slot, new_kv)

    # up from the file store
    wipe(ad)
    assert io.load_states([(chain[-1], new_slot)], states).wait() == [True]
    pages = [(h, new_kv[GRID * i : GRID * (i + 1)]) for i, h in enumerate(chain)]
    assert io.load_kv(pages, kvs).wait() == [True, True]
    from_store = continue_from(ad, prompt, 32, new_slot, new_kv)

    for run in (from_host, from_store):
        assert [int(x.argmax()) for x in run] == want.output_ids
        assert all(torch.equal(a, b) for a, b in zip(run, want.logits, strict=True))
    eng.mgr.slots.free([new_slot])
    eng.mgr.kv.free(new_kv)
    host.free(got[0])
    host_kv.free(got_kv[0])
    host.check_conservation([])
    host_kv.check_conservation([])
    eng.check()
