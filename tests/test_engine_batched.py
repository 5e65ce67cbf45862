"""Batched decode and the device options of the reference engine.

The oracle is `transformers` itself: the model run with no cache at all over
each whole sequence (prompt + generated tokens) must give, at every position
the engine sampled from, the logits the engine used (fp32, within 1e-4),
while the engine decodes sequences of different lengths in one forward.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from engine_device import ENGINE_DEVICE as DEVICE
from engine_device import engine_net
from mambaradix.engine import Engine, build_model
from mambaradix.engine.workload import run_conversations

pytestmark = pytest.mark.slow  # engine runs: a real model, seconds each

MODELS = ["nemotron-h-tiny", "qwen3-next-tiny"]
TOL = 1e-4


@pytest.fixture(scope="module", params=MODELS)
def net(request: pytest.FixtureRequest) -> Any:
    return engine_net(request.param)


def _sessions(seed: int) -> list[list[list[int]]]:
    rng = random.Random(seed)
    system = [rng.randrange(1024) for _ in range(30)]
    return [
        [
            (system if t == 0 and s % 2 else [])
            + [rng.randrange(1024) for _ in range(rng.randrange(3, 40) if t == 0 else 9)]
            for t in range(2)
        ]
        for s in range(5)
    ]


class _Recorder:
    """Wraps `PoolAdapter.forward` to record the starts of every call."""

    def __init__(self, eng: Engine) -> None:
        self.calls: list[list[int]] = []
        self.inner = eng.adapter.forward
        eng.adapter.forward = self  # type: ignore[method-assign]

    def __call__(self, tokens: Any, starts: Any, kv_index: Any, slots: Any) -> torch.Tensor:
        self.calls.append(list(starts))
        return self.inner(tokens, starts, kv_index, slots)


@torch.no_grad()
def _plain_logits(net: Any, prompt: list[int], outputs: list[int]) -> torch.Tensor:
    """Logits (fp32) at the positions that chose each output, from one
    uncached forward of the whole sequence."""
    seq = torch.tensor([prompt + outputs[:-1]], device=DEVICE)
    logits = net(input_ids=seq, use_cache=False).logits[0].float().cpu()
    return logits[len(prompt) - 1 :]


def test_batched_decode_equals_a_plain_forward_over_the_whole_sequence(net: Any) -> None:
    eng = Engine(model="x", net=net, chunk_size=16, kv_tokens=2048, state_slots=16, device=DEVICE)
    rec = _Recorder(eng)
    run = run_conversations(eng, _sessions(0), max_new_tokens=7)
    eng.check()
    decode_calls = [c for c in rec.calls if len(c) > 1]
    assert any(len(set(c)) > 1 for c in decode_calls)  # one forward, different lengths
    for prompts, results in zip(run.prompts, run.results, strict=True):
        for prompt, r in zip(prompts, results, strict=True):
            want = _plain_logits(net, prompt, r.output_ids)
            got = torch.stack(r.logits)
            assert got.shape == want.shape
            assert float((got - want).abs().max()) <= TOL
            assert r.output_ids == want.argmax(-1).tolist()


def test_one_forward_per_decode_step_and_same_output_as_one_sequence_decode(net: Any) -> None:
    prompts = [[1 + i] * (5 + 3 * i) for i in range(4)]
    out = {}
    for batch in (True, False):
        eng = Engine(
            model="x", net=net, batch_decode=batch, kv_tokens=512, state_slots=16, device=DEVICE
        )
        out[batch] = (eng.generate(prompts, max_new_tokens=6), eng.stats())
        eng.check()
    (batched, s_b), (single, s_s) = out[True], out[False]
    for a, b in zip(batched, single, strict=True):
        assert a.output_ids == b.output_ids
        assert (
            max(float((x - y).abs().max()) for x, y in zip(a.logits, b.logits, strict=True)) <= TOL
        )
    # 4 prompts admitted in one prefill batch, then 5 decode steps of all 4
    assert s_b["decode_tokens"] == s_s["decode_tokens"] == 4 * 5
    assert s_b["decode_forwards"] == 5 and s_s["decode_forwards"] == 20


def test_bfloat16_engine_keeps_float32_recurrent_states_as_the_model_does() -> None:
    net = build_model("nemotron-h-tiny", seed=0, dtype=torch.bfloat16)
    eng = Engine(model="x", net=net, dtype=torch.bfloat16, kv_tokens=256, state_slots=4)
    assert eng.adapter.k.dtype == torch.bfloat16
    assert eng.adapter.states.conv[0].dtype == torch.bfloat16
    assert eng.adapter.states.ssm.dtype == torch.float32  # mamba_ssm_cache_dtype
    assert len(eng.generate([[3, 4, 5, 6]], max_new_tokens=3)[0].output_ids) == 3
    eng.check()


def test_device_and_dtype_are_checked_before_any_work(monkeypatch: pytest.MonkeyPatch) -> None:
    import mambaradix.engine.engine as engine_module

    def no_build(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the model was built before the arguments were checked")

    monkeypatch.setattr(engine_module, "build_model", no_build)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device='cuda'.*is_available"):
        Engine(device="cuda")
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda"):
        Engine(device="meta")
    with pytest.raises(ValueError, match="device: 'gpu0' is not a torch device"):
        Engine(device="gpu0")
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype"):
        Engine(dtype=torch.int32)
    with pytest.raises(TypeError, match="batch_decode must be a bool"):
        Engine(batch_decode="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="deterministic=True needs strategy='no_buffer'"):
        Engine(deterministic=True, strategy="extra_buffer")


def test_a_model_handed_in_must_be_on_the_asked_device_and_dtype(net: Any) -> None:
    with pytest.raises(ValueError, match="net is torch.float32, but dtype is torch.bfloat16"):
        Engine(model="x", net=net, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="net is on (cpu|cuda:0), but device is meta"):
        from mambaradix.engine.device import check_net

        check_net(net, torch.device("meta"), torch.float32)


def test_pools_live_on_the_engine_device() -> None:
    eng = Engine(model="qwen3-next-tiny", device="cpu", kv_tokens=64, state_slots=4)
    tensors = [eng.adapter.k, eng.adapter.v, *eng.adapter.states.tensors()]
    assert {t.device for t in tensors} == {torch.device("cpu")} == {eng.device}
    assert next(eng.net.parameters()).device == eng.device
