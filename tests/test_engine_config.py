"""`EngineConfig`: the engine's settings, frozen and checked once when made; an engine
built from one decides and answers as one built from the same keyword arguments."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mambaradix.engine import Engine, EngineConfig

SMALL = {"kv_tokens": 512, "state_slots": 6, "chunk_size": 32, "max_running": 2}
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 9, 9]]


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def test_a_config_is_frozen_and_resolves_what_its_checks_find() -> None:
    cfg = EngineConfig(**SMALL, policy="mambaradix")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.kv_tokens = 1024  # type: ignore[misc]
    assert cfg.resolved.policy is not None and cfg.resolved.policy.name == "mambaradix"
    assert cfg.resolved.strategy == "no_buffer" and not cfg.resolved.host_tier
    assert cfg.resolved.dtype is torch.float32  # the default, checked
    assert EngineConfig(**SMALL, dtype=torch.bfloat16).resolved.dtype is torch.bfloat16
    assert EngineConfig(**SMALL) == EngineConfig(**SMALL)  # the settings, not what they built


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"kv_tokens": 0}, "kv_tokens"),
        ({"dtype": torch.int32}, "dtype must be a floating torch.dtype"),
        ({"dtype": "float32"}, "dtype must be a floating torch.dtype"),
        ({"policy": "vllm"}, "policy"),
        ({"host_state_slots": 4}, "host_kv_tokens"),
        ({"store_gb": 1.0}, "store_gb"),
        ({"prefetch_wait_s": -1.0}, "prefetch_wait_s"),
    ],
)
def test_bad_settings_are_refused_when_the_config_is_made(kw: dict[str, object], says: str) -> None:
    with pytest.raises((TypeError, ValueError), match=says):
        EngineConfig(**{**SMALL, **kw})  # type: ignore[arg-type]


def test_an_engine_from_a_config_is_the_engine_of_its_arguments() -> None:
    cfg = EngineConfig(**SMALL, policy="mambaradix", seed=3)
    built = Engine.from_config(cfg)
    direct = Engine(**SMALL, policy="mambaradix", seed=3)
    assert built.config == direct.config == cfg
    a = built.generate(PROMPTS, max_new_tokens=4)
    b = direct.generate(PROMPTS, max_new_tokens=4)
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
    assert [r.cached_tokens for r in a] == [r.cached_tokens for r in b]
    again = Engine.from_config(cfg, net=built.net)  # one config, several engines
    assert [r.output_ids for r in again.generate(PROMPTS, max_new_tokens=4)] == [
        r.output_ids for r in a
    ]
    with pytest.raises(TypeError, match="config must be an EngineConfig"):
        Engine.from_config(SMALL)  # type: ignore[arg-type]
