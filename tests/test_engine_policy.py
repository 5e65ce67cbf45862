"""`Engine(policy=...)`: the engine runs the policy layer's policies (the replay's),
attached to its own model, pools and tree; None keeps the engine's defaults. The
cached-token decisions against the replay are in tests/test_engine_vs_replay.py;
bad `policy` values in tests/test_api_validation.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mambaradix.engine import Engine
from mambaradix.engine.deterministic import GridCheckpoints
from mambaradix.engine.tiers import TierLookup
from mambaradix.geometry.profile import get_profile
from mambaradix.policies import (
    DefaultPolicy,
    MambaRadix,
    Marconi,
    Policy,
    SGLang,
    SGLang0515ExtraBuffer,
    SGLangExtraBuffer,
)

SMALL: dict[str, Any] = {"kv_tokens": 256, "state_slots": 8, "chunk_size": 16}


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, DefaultPolicy),
        ({"compat": "sglang"}, SGLang),
        ({"compat": "sglang", "strategy": "extra_buffer"}, SGLangExtraBuffer),
        ({"compat": "sglang-0.5.15.post1", "strategy": "extra_buffer"}, SGLang0515ExtraBuffer),
        ({"policy": "sglang-extra-buffer"}, SGLangExtraBuffer),
        ({"policy": "mambaradix"}, MambaRadix),
        ({"policy": "marconi"}, Marconi),
    ],
)
def test_the_policy_the_engine_runs(kw: dict[str, Any], expected: type) -> None:
    eng = Engine(**SMALL, **kw)
    assert type(eng.policy) is expected
    assert eng.scheduler.checkpoints is eng.policy  # no wrapper without grid or tier
    assert eng.mgr.evictor == eng.policy.evict  # its eviction is the cache manager's
    assert eng.mgr.strategy == eng.policy.strategy
    assert eng.mgr.tree.compat == eng.policy.compat  # a named policy brings its tree


def test_the_cache_off_keeps_the_rules_of_the_compat() -> None:
    """With the cache off nothing is cached, but the scheduler rules stay the tree
    release's (SGLang's head-room), as with the cache on."""
    on, off = (Engine(**SMALL, compat="sglang", prefix_cache=p) for p in (True, False))
    assert on.mgr.rules == off.mgr.rules == "sglang-0.5.23"
    assert Engine(**SMALL, prefix_cache=False).mgr.rules is None  # ours


def test_the_default_keeps_the_engine_s_strategy() -> None:
    eng = Engine(**SMALL, strategy="extra_buffer")
    assert type(eng.policy) is DefaultPolicy and eng.policy.strategy == "extra_buffer"


def test_the_wrappers_stay() -> None:
    grid = Engine(**SMALL, deterministic=True)
    assert isinstance(grid.scheduler.checkpoints, GridCheckpoints)
    assert grid.scheduler.checkpoints.inner is grid.policy
    tier = Engine(**SMALL, host_state_slots=4, host_kv_tokens=64, policy="mambaradix")
    assert isinstance(tier.scheduler.checkpoints, TierLookup)
    assert isinstance(tier.scheduler.checkpoints, Policy)  # still a whole policy


def test_the_policy_sees_the_engine_s_model_and_pools() -> None:
    """The profile comes from the engine's own model config; for a preset it equals the
    profile the replay derives from the preset's geometry (`get_profile`)."""
    for model in ("nemotron-h-tiny", "qwen3-next-tiny"):
        eng = Engine(model=model, **SMALL, policy="mambaradix")
        ctx, ref = eng.policy.ctx, get_profile(model)
        figures = ("kv_bytes_per_token", "state_bytes", "linear_flops_per_token")
        assert [getattr(ctx.profile, f) for f in figures] == [getattr(ref, f) for f in figures]
        assert ctx.profile.attn_flops_per_pair == ref.attn_flops_per_pair
        assert (ctx.unit_tokens, ctx.chunk_units) == (1, SMALL["chunk_size"])
        assert (ctx.kv_capacity, ctx.state_capacity) == (256, 8)
        assert ctx.tree is eng.mgr.tree and ctx.cache is eng.mgr and ctx.rows is eng.mgr.rows


def test_a_policy_instance_and_a_fresh_copy() -> None:
    given = Marconi(alpha=0.5)
    eng = Engine(**SMALL, policy=given)
    assert eng.policy is given and given.ctx.tree is eng.mgr.tree
    fresh = eng.fresh_policy()
    assert type(fresh) is Marconi and fresh.alpha == 0.5 and not fresh.tune
    assert fresh is not given and not hasattr(fresh, "ctx")  # not attached
