"""The reference engine on real hybrid models (NemotronH, Qwen3Next from
`transformers`, tiny seeded random weights): the prefix cache must not change
a single greedy token, and logits agree within 1e-4 (fp32) at every decoded
position, with and without memory pressure; no KV index or state slot leaks.
"""

from __future__ import annotations

import random
from array import array
from typing import Any

import pytest
import torch
import transformers  # noqa: F401  (the `engine` extra; setup installs it)

from engine_device import ENGINE_DEVICE as DEVICE
from engine_device import engine_net
from mambaradix.core.tree import MambaRadixCache  # noqa: E402
from mambaradix.engine import Engine, Result, build_model  # noqa: E402
from mambaradix.engine.workload import run_conversations  # noqa: E402
from mambaradix.lifecycle import lru_evictor  # noqa: E402
from mambaradix.scheduler import Sequence  # noqa: E402

pytestmark = pytest.mark.slow  # engine runs: a real model, seconds each

MODELS = ["nemotron-h-tiny", "qwen3-next-tiny"]
TOL = 1e-4
VOCAB = 1024


@pytest.fixture(scope="module", params=MODELS)
def net(request: pytest.FixtureRequest) -> Any:
    return engine_net(request.param)


def _engine(net: Any, prefix_cache: bool, **kw: Any) -> Engine:
    return Engine(
        model=net.config.model_type, net=net, prefix_cache=prefix_cache, device=DEVICE, **kw
    )


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def _sessions(seed: int, n: int, turns: int, first: int, later: int) -> list[list[list[int]]]:
    rng = random.Random(seed)
    return [
        [
            _tokens(rng, rng.randrange(first // 2, first) if t == 0 else rng.randrange(1, later))
            for t in range(turns)
        ]
        for _ in range(n)
    ]


def _assert_same(on: list[Result], off: list[Result]) -> None:
    assert len(on) == len(off)
    for a, b in zip(on, off, strict=True):
        assert a.output_ids == b.output_ids
        assert len(a.logits) == len(a.output_ids) == len(b.logits)
        for x, y in zip(a.logits, b.logits, strict=True):
            assert x.dtype == torch.float32 and x.dim() == 1
            assert float((x - y).abs().max()) <= TOL


def _assert_accounting(eng: Engine, results: list[Result]) -> None:
    s = eng.stats()
    assert s["computed_prefill_tokens"] == s["prompt_tokens"] - s["cached_tokens"]
    assert s["prompt_tokens"] == sum(r.prompt_tokens for r in results)
    assert s["cached_tokens"] == sum(r.cached_tokens for r in results)


def _flat(run_results: list[list[Result]]) -> list[Result]:
    return [r for turns in run_results for r in turns]


def _run_multi_turn(
    net: Any, evictor: Any = None, max_new: int = 6, **kw: Any
) -> tuple[Engine, Engine, list[Result], list[Result]]:
    sessions = _sessions(seed=1, n=4, turns=3, first=70, later=20)
    on, off = _engine(net, True, **kw), _engine(net, False, **kw)
    if evictor is not None:
        on.mgr.evictor = evictor
    r_on = _flat(run_conversations(on, sessions, max_new_tokens=max_new).results)
    r_off = _flat(run_conversations(off, sessions, max_new_tokens=max_new).results)
    return on, off, r_on, r_off


def test_multi_turn_exact_with_and_without_cache(net: Any) -> None:
    on, off, r_on, r_off = _run_multi_turn(net, chunk_size=7)  # 7 divides no prompt length here
    _assert_same(r_on, r_off)
    for eng, res in ((on, r_on), (off, r_off)):
        _assert_accounting(eng, res)
        eng.check()
    s_on, s_off = on.stats(), off.stats()
    assert s_on["prompt_tokens"] == s_off["prompt_tokens"]
    # every later turn reuses its whole previous turn (prompt + answer but the last token)
    assert all(r.cached_tokens > 0 for r in r_on[1::3] + r_on[2::3])
    assert s_on["hit_rate"] > 0.5 and s_off["hit_rate"] == 0.0
    assert s_off["cached_tokens"] == 0 and len(off.mgr.tree.all_kv_indices()) == 0
    assert s_on["retractions"] == s_off["retractions"] == 0


@pytest.mark.parametrize("chunk_size", [13, 256])
def test_shared_system_prompt_exact_and_branch_checkpoint(net: Any, chunk_size: int) -> None:
    rng = random.Random(2)
    system = _tokens(rng, 45)
    first = [system + _tokens(rng, 9)]
    batch = [system + _tokens(rng, rng.randrange(3, 20)) for _ in range(4)]
    again = [batch[1] + _tokens(rng, 5), system + _tokens(rng, 4)]
    out: dict[bool, list[Result]] = {}
    engines = {}
    for pc in (True, False):
        eng = engines[pc] = _engine(net, pc, chunk_size=chunk_size)
        out[pc] = (
            eng.generate(first, max_new_tokens=5)
            + eng.generate(batch, max_new_tokens=5)
            + eng.generate(again, max_new_tokens=5)
        )
        _assert_accounting(eng, out[pc])
        eng.check()
    _assert_same(out[True], out[False])
    on = out[True]
    # The four prompts of `batch` arrive together. With 256-token chunks they
    # join one prefill batch: each matches `first`'s states, none of which ends
    # inside the system prompt (they are at input - 1 = 53 and at its finished
    # sequence): 0. With 13-token chunks they are admitted over several
    # batches: the early ones reuse `first`'s chunk-end state at 39; each stops
    # at its branch point, the end of the system prompt, to checkpoint there,
    # so a prompt admitted after that reuses 45 ...
    hit = len(system) // chunk_size * chunk_size
    assert on[1].cached_tokens == hit
    assert all(r.cached_tokens in (hit, len(system)) for r in on[1:5])
    # ... which a later prompt with the same system prompt reuses whole ...
    assert on[6].cached_tokens == len(system)
    assert on[5].cached_tokens == len(batch[1]) - 1  # ... and its previous prompt (input - 1)


def test_memory_pressure_evicts_tombstones_retracts_and_stays_exact(net: Any) -> None:
    tombstoned = []

    def evictor(tree: MambaRadixCache, kv_tokens: int, states: int) -> Any:
        internal = [n for n in tree._nodes() if n.children and n.state is not None]
        result = lru_evictor(tree, kv_tokens, states)
        live = set(map(id, tree._nodes()))
        tombstoned.extend(n for n in internal if n.state is None and id(n) in live)
        return result

    # Admission reserves only 70% of the running requests' remaining outputs
    # (SGLang's new-token ratio): with 30-token outputs and 200 KV tokens the
    # requests admitted together outgrow the pool while decoding: retraction.
    kw = {"chunk_size": 11, "kv_tokens": 200, "state_slots": 8, "max_running": 4}
    on, off, r_on, r_off = _run_multi_turn(net, evictor, max_new=30, **kw)
    _assert_same(r_on, r_off)
    s = on.stats()
    assert s["evicted_states"] > 0
    assert tombstoned  # internal nodes lost their state but kept their KV
    assert s["evicted_kv_tokens"] > 0  # leaf eviction
    assert s["retractions"] > 0  # (the run without cache has other memory: may not retract)
    assert any(r.retractions for r in r_on)
    for eng, res in ((on, r_on), (off, r_off)):
        _assert_accounting(eng, res)
        eng.check()


def test_cache_persists_across_calls_and_identical_prompt_hits(net: Any) -> None:
    eng = _engine(net, True, chunk_size=16)
    prompt = _tokens(random.Random(3), 40)
    a = eng.generate([prompt], max_new_tokens=4)[0]
    b = eng.generate([prompt], max_new_tokens=4)[0]
    assert a.cached_tokens == 0 and b.cached_tokens == len(prompt) - 1
    assert a.output_ids == b.output_ids
    assert all(float((x - y).abs().max()) <= TOL for x, y in zip(a.logits, b.logits, strict=True))
    assert eng.stats()["computed_prefill_tokens"] == len(prompt) + 1
    eng.check()


def test_no_leak_after_abort_mid_prefill(net: Any) -> None:
    eng = _engine(net, True, chunk_size=8)
    prompt = _tokens(random.Random(4), 30)
    eng.generate([prompt], max_new_tokens=3)
    sched = eng.scheduler
    seq = Sequence(array("q", prompt[:20] + _tokens(random.Random(6), 19)), 3)
    sched.submit(seq)
    while not (seq.status == "prefilling" and seq.req.computed > seq.req.prefix_len):
        sched.step()  # part-way: a chunk past the last checkpoint, its KV private
    assert seq.req.cached_len > 0
    eng.mgr.check_conservation()
    sched.abort(seq)
    eng.check()
    assert not eng.mgr.active and not sched.busy
    # the engine still serves (and reuses) after the abort
    r = eng.generate([prompt], max_new_tokens=3)[0]
    assert r.cached_tokens == len(prompt) - 1
    eng.check()


def test_single_token_prompt_and_zero_new_tokens(net: Any) -> None:
    eng = _engine(net, True, chunk_size=4)
    r = eng.generate([[5], [5, 6]], max_new_tokens=3)
    assert [len(x.output_ids) for x in r] == [3, 3]
    assert eng.generate([[1, 2, 3]], max_new_tokens=0)[0].output_ids == []
    eng.check()


def test_rejects_bad_prompts_and_oversized_requests(net: Any) -> None:
    eng = _engine(net, True, kv_tokens=32, state_slots=4)
    with pytest.raises(ValueError):
        eng.generate([[]])
    with pytest.raises(ValueError):
        eng.generate([[VOCAB + 5]])
    # 40 prompt + 2 new + a page: admission wants 43 strictly below the pool.
    with pytest.raises(ValueError, match=r"prompts\[0\] needs a KV pool of 44 tokens"):
        eng.generate([_tokens(random.Random(5), 40)], max_new_tokens=2)
    eng.check()  # the failed call gave everything back
    assert not eng.mgr.active
    assert len(eng.generate([[1, 2, 3]], max_new_tokens=2)[0].output_ids) == 2


def test_local_checkpoint_directory_loads_with_from_pretrained(tmp_path: Any) -> None:
    """A user's weights on disk: `model=` a local directory goes through
    `from_pretrained` and serves exactly like the model it was saved from."""
    from mambaradix.engine import Engine

    build_model("nemotron-h-tiny", seed=3).save_pretrained(tmp_path)
    prompt = [[5, 6, 7, 8, 9, 10, 11, 12]]
    from_disk = Engine(model=str(tmp_path), kv_tokens=512, state_slots=8).generate(prompt, 4)
    preset = Engine(model="nemotron-h-tiny", seed=3, kv_tokens=512, state_slots=8).generate(
        prompt, 4
    )
    assert from_disk[0].output_ids == preset[0].output_ids
    assert all(
        torch.allclose(a, b, atol=1e-6)
        for a, b in zip(from_disk[0].logits, preset[0].logits, strict=True)
    )
