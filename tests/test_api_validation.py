"""The Python API refuses what the CLI refuses: TypeError / ValueError whose
message names the parameter, raised before any work, leaving objects as they were."""

from __future__ import annotations

import json
import math
from array import array
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from mambaradix.demo import run_demo
from mambaradix.geometry.profile import ModelProfile, get_profile
from mambaradix.policies import make_policy
from mambaradix.replay.cluster import ClusterSpec
from mambaradix.replay.run import replay
from mambaradix.replay.serving import ServingConfig, ServingModel
from mambaradix.replay.sweep import sweep
from mambaradix.replay.trace import Trace, TraceRequest

NAN, INF = math.nan, math.inf


def tiny_trace() -> Trace:
    reqs = [
        TraceRequest(0, 0, 0.0, array("q", range(100, 140)), array("q", range(500, 505)), 40, 5),
        TraceRequest(1, 0, 1.0, array("q", range(100, 150)), array("q", range(600, 605)), 50, 5),
    ]
    return Trace("tiny", reqs)


SERVING_BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"memory_gb": 0}, ValueError, "memory_gb must be > 0"),
    ({"memory_gb": -1.0}, ValueError, "memory_gb must be > 0"),
    ({"memory_gb": NAN}, ValueError, "memory_gb must be a finite number"),
    ({"memory_gb": INF}, ValueError, "memory_gb must be a finite number"),
    ({"memory_gb": True}, TypeError, "memory_gb must be a number, got bool"),
    ({"memory_gb": "10"}, TypeError, "memory_gb must be a number, got str"),
    ({"state_fraction": 0.0}, ValueError, "state_fraction must be > 0"),
    ({"state_fraction": 1.0}, ValueError, "state_fraction must be < 1"),
    ({"state_fraction": NAN}, ValueError, "state_fraction must be a finite number"),
    ({"prefill_flops_per_s": 0}, ValueError, "prefill_flops_per_s must be > 0"),
    ({"prefill_flops_per_s": INF}, ValueError, "prefill_flops_per_s must be a finite"),
    ({"tpot_s": -0.1}, ValueError, "tpot_s must be >= 0"),
    ({"chunk_tokens": 0}, ValueError, "chunk_tokens must be >= 1"),
    ({"chunk_tokens": 512.0}, TypeError, "chunk_tokens must be an int, got float"),
    ({"chunk_tokens": True}, TypeError, "chunk_tokens must be an int, got bool"),
    ({"max_running": 0}, ValueError, "max_running must be >= 1"),
    ({"rate": 0.0}, ValueError, "rate must be > 0"),
    ({"rate": NAN}, ValueError, "rate must be a finite number"),
    ({"sequential": 1}, TypeError, "sequential must be a bool, got int"),
    ({"page_size": 0}, ValueError, "page_size must be >= 1"),
    ({"page_size": 16.0}, TypeError, "page_size must be an int, got float"),
    ({"track_interval": -1}, ValueError, "track_interval must be >= 1"),
    (
        {"page_size": 16, "track_interval": 100},
        ValueError,
        r"track_interval \(100\) must be a multiple of page_size \(16\)",
    ),
    ({"kv_units": 100}, ValueError, "kv_units and state_slots: give both"),
    ({"kv_units": 0, "state_slots": 4}, ValueError, "kv_units must be >= 1"),
    ({"kv_units": 64, "state_slots": True}, TypeError, "state_slots must be an int, got bool"),
]


@pytest.mark.parametrize(("kw", "exc", "says"), SERVING_BAD)
def test_serving_config(kw: dict[str, Any], exc: type[Exception], says: str) -> None:
    with pytest.raises(exc, match=f"^{says}"):
        ServingConfig(**{"memory_gb": 1.0, **kw})


def test_replay_entry() -> None:
    trace, prof, cfg = tiny_trace(), get_profile("marconi-7b"), ServingConfig(1.0)
    with pytest.raises(TypeError, match="^trace must be a Trace, got list"):
        replay(trace.requests, prof, "sglang", cfg)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^profile must be a ModelProfile, got str"):
        replay(trace, "marconi-7b", "sglang", cfg)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^cfg must be a ServingConfig, got float"):
        replay(trace, prof, "sglang", 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^policy_name: unknown policy lru; choose from sglang"):
        replay(trace, prof, "lru", cfg)
    with pytest.raises(ValueError, match="has no requests"):
        replay(Trace("empty", []), prof, "sglang", cfg)
    with pytest.raises(ValueError, match="^policy_name: unknown policy marconi@-1; choose from"):
        replay(trace, prof, "marconi@-1", cfg)
    with pytest.raises(TypeError, match="^per_request must be a bool, got int"):
        replay(trace, prof, "sglang", cfg, per_request=1)  # type: ignore[arg-type]


def test_replay_memory_that_holds_no_request() -> None:
    # marconi-7b: 65,536 B per KV token, 26.8 MB per state. 0.001 GB holds
    # int(1e6 x 10/19) // 65,536 = 8 KV tokens and no state: nothing can run.
    # Request 1: admitted alone when 50 prompt + 5 new + 1 stays below the
    # pool (57 tokens), with two states (the one it reuses and its copy).
    prof = get_profile("marconi-7b")
    f = 0.9 / 1.9
    need = max(57 * 65536 / (1 - f), 2 * prof.state_bytes / f) / 1e9
    with pytest.raises(ValueError) as e:
        replay(tiny_trace(), prof, "sglang", ServingConfig(0.001))
    msg = str(e.value)
    assert msg.startswith("memory_gb 0.001 GB holds 8 KV tokens and 0 states: no request fits")
    assert "the largest, request 1 (session 1, turn 0: 50 prompt + 5 new) needs a pool of 57" in msg
    gb = float(msg.split("use at least ")[1].split(" GB")[0])
    assert need <= gb < need + 0.02
    # The serving model agrees: that much serves request 1, 0.01 GB less does not.
    assert replay(tiny_trace(), prof, "sglang", ServingConfig(gb))["dropped"] == 0
    try:
        model = ServingModel(tiny_trace(), prof, make_policy("sglang"), ServingConfig(gb - 0.01))
    except ValueError as too_small:
        assert "too small" in str(too_small)
    else:
        model.run()
        assert tiny_trace().requests[1].input_tokens in [r.input_tokens for r in model.dropped]


def test_replay_policy_that_cannot_run_at_the_page() -> None:
    trace, prof = tiny_trace(), get_profile("marconi-7b")
    cfg = ServingConfig(1.0, page_size=16)
    with pytest.raises(ValueError, match=r"^policy_name: sglang \(no_buffer\) needs page_size 1"):
        replay(trace, prof, "sglang", cfg)
    assert replay(trace, prof, "sglang-extra-buffer", cfg)["served"] == 2
    seq = replace(cfg, sequential=True)
    with pytest.raises(ValueError, match="^page_size 16 needs the split pools: sequential"):
        replay(trace, prof, "sglang-extra-buffer", seq)


SWEEP_BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"policies": []}, TypeError, "policies must be a non-empty list of names"),
    ({"policies": "sglang"}, TypeError, "policies must be a non-empty list of names"),
    ({"policies": ["sglang", 3]}, TypeError, r"policies\[1\] must be a str, got int"),
    ({"policies": ["sglang", "sglang"]}, ValueError, "policies: 'sglang' is given twice"),
    ({"policies": ["nope"]}, ValueError, "policies: unknown policy nope"),
    ({"policies": ["sglang-used"]}, ValueError, "policies: policy 'sglang-used' was retired"),
    ({"memories": []}, TypeError, "memories must be a non-empty list of numbers"),
    ({"memories": [1.0, NAN]}, ValueError, r"memories\[1\] must be a finite number"),
    ({"memories": [0.0]}, ValueError, r"memories\[0\] must be > 0"),
    ({"memories": [True]}, TypeError, r"memories\[0\] must be a number, got bool"),
    ({"memories": [0.001]}, ValueError, "memories 0.001 GB holds 8 KV tokens and 0 states"),
    ({"state_fractions": [1.2]}, ValueError, r"state_fractions\[0\] must be < 1"),
    ({"workers": 0}, ValueError, "workers must be >= 1"),
    ({"workers": 1.5}, TypeError, "workers must be an int, got float"),
    (
        {"policies": ["marconi-oracle"], "routers": ["round-robin"], "cluster": ClusterSpec(2)},
        ValueError,
        r"policies: marconi-oracle \(a run per alpha\) is not run over instances",
    ),
    # The cluster's routers and spec, checked before any cell runs (they were found
    # only inside the first cluster cell, or never: [] ran no router, a repeat ran twice).
    (
        {"routers": ["nope"], "cluster": ClusterSpec(2)},
        ValueError,
        "routers: unknown router nope; choose from round-robin",
    ),
    ({"routers": [], "cluster": ClusterSpec(2)}, TypeError, "routers must be a non-empty list"),
    ({"routers": "hybrid", "cluster": ClusterSpec(2)}, TypeError, "routers must be a non-empty"),
    (
        {"routers": ["hybrid", "hybrid"], "cluster": ClusterSpec(2)},
        ValueError,
        "routers: 'hybrid' is given twice",
    ),
    ({"routers": ["hybrid"], "cluster": 2}, TypeError, "cluster must be a ClusterSpec, got int"),
    (
        {
            "policies": ["sglang-extra-buffer"],
            "base": ServingConfig(1.0, page_size=16),
            "routers": ["hybrid"],
            "cluster": ClusterSpec(2, block_tokens=24),
        },
        ValueError,
        "cluster: block_tokens 24 must be a multiple of the tree's 16-token page",
    ),
]


@pytest.mark.parametrize(("kw", "exc", "says"), SWEEP_BAD)
def test_sweep_entry(kw: dict[str, Any], exc: type[Exception], says: str) -> None:
    args: dict[str, Any] = {
        "trace": tiny_trace(),
        "profile": get_profile("marconi-7b"),
        "policies": ["sglang"],
        "memories": [1.0],
        "base": ServingConfig(1.0),
        "workers": 1,
        "progress": False,
    }
    with pytest.raises(exc, match=f"^{says}"):
        sweep(**{**args, **kw})


def test_sweep_checks_the_cluster_before_any_cell_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import mambaradix.replay.sweep as sweep_module

    def no_run(*args: object) -> None:
        raise AssertionError("a cell ran")

    monkeypatch.setattr(sweep_module, "_run", no_run)
    with pytest.raises(ValueError, match="^routers: unknown router nope"):
        sweep(
            tiny_trace(),
            get_profile("marconi-7b"),
            ["sglang"],
            [1.0],
            ServingConfig(1.0),
            progress=False,
            routers=["round-robin", "nope"],
            cluster=ClusterSpec(2),
        )


def test_a_sweep_checks_each_memory_point_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20: the memory fit ran once per point in the sweep, then again in every cell;
    now the sweep's check is the only one (2 points x 3 policies: 2 checks, not 8)."""
    import mambaradix.replay.cluster as cluster_module
    import mambaradix.replay.fit as fit_module
    import mambaradix.replay.run as run_module
    import mambaradix.replay.sweep as sweep_module

    calls: list[tuple[float, tuple[str, ...]]] = []

    def counted(trace: Any, profile: Any, cfg: ServingConfig, strategies: Any, *a: Any) -> Any:
        calls.append((cfg.memory_gb, tuple(strategies)))
        return fit_module.check_memory(trace, profile, cfg, strategies, *a)

    for module in (sweep_module, run_module, cluster_module):
        monkeypatch.setattr(module, "check_memory", counted)
    policies = ["sglang", "mambaradix", "marconi"]
    data = sweep(tiny_trace(), get_profile("marconi-7b"), policies, [1.0, 2.0],
                 ServingConfig(1.0), workers=1, progress=False)  # fmt: skip
    assert len(data["results"]) == 6
    assert calls == [(1.0, tuple(policies)), (2.0, tuple(policies))]
    replay(tiny_trace(), get_profile("marconi-7b"), "sglang", ServingConfig(1.0))
    assert calls[2:] == [(1.0, ("sglang",))]  # the public replay() still checks its point


def test_the_replay_cli_checks_each_memory_point_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 20: `mambaradix replay` checked every point before the sweep (with its option
    names), then the sweep checked it again; now the CLI hands the sweep its checks."""
    import mambaradix.replay.fit as fit_module
    import mambaradix.replay.sweep as sweep_module
    from mambaradix.cli import main

    calls: list[float] = []
    check_memory = fit_module.check_memory

    def counted(trace: Any, profile: Any, cfg: ServingConfig, strategies: Any, *a: Any) -> Any:
        calls.append(cfg.memory_gb)
        return check_memory(trace, profile, cfg, strategies, *a)

    for module in (fit_module, sweep_module):  # wherever a check is looked up
        monkeypatch.setattr(module, "check_memory", counted)
    argv = ["replay", "--trace", "synthetic-multi-turn", "--limit", "12", "--memory", "1,2",
            "--policy", "sglang,mambaradix", "--workers", "1", "--no-plot",
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    assert calls == [1.0, 2.0]
    capsys.readouterr()
    assert main([*argv[:-2], "--memory", "1e-6", "--no-progress"]) == 2  # still refused, named
    assert "--memory 1e-06 GB holds" in capsys.readouterr().err


def test_model_profile_still_checks_its_fields() -> None:
    prof = get_profile("marconi-7b")
    with pytest.raises(TypeError, match="state_bytes must be an int"):
        replace(prof, state_bytes=1.5)
    assert isinstance(prof, ModelProfile)


@pytest.mark.parametrize(
    ("args", "exc", "says"),
    [
        ((0, 2, 1000, 4, 64, 0), ValueError, "sessions must be >= 1"),
        ((2, 2.0, 1000, 4, 64, 0), TypeError, "turns must be an int, got float"),
        ((2, 2, True, 4, 64, 0), TypeError, "kv_tokens must be an int, got bool"),
        ((2, 2, 1000, 1, 64, 0), ValueError, "slots must be >= 2"),
        ((2, 2, 1000, 4, 0, 0), ValueError, "chunk must be >= 1"),
        ((2, 2, 1000, 4, 64, -1), ValueError, "seed must be >= 0"),
        ((2, 2, 100, 4, 64, 0), ValueError, "kv_tokens 100 is too small: request"),
        ((2, 2, 1000, 4, 64.0, 0), TypeError, "chunk must be an int, got float"),
        # each request's prompt holds at least a 500-token system prompt and 20 user tokens
        # (8 B a token as a list, and again as the scheduler's array): 10**12 x 520 x 16 B
        ((10**6, 10**6, 10**6, 4, 64, 0), ValueError, "sessions=1,000,000, turns=1,000,000, k"),
        # 17 B of free list per KV token: 1.7 PB
        (
            (2, 2, 10**14, 4, 64, 0),
            ValueError,
            "sessions=2, turns=2, kv_tokens=100,000,000,000,000",
        ),
    ],
)
def test_demo_entry(args: tuple[Any, ...], exc: type[Exception], says: str) -> None:
    with pytest.raises(exc, match=f"^{says}"):
        run_demo(*args)


# ------------------------------------------------------------------ engine


@pytest.fixture(scope="module")
def engine() -> Any:
    from mambaradix.engine import Engine

    torch.set_num_threads(1)
    return Engine(model="nemotron-h-tiny", kv_tokens=64, state_slots=4, chunk_size=16)


ENGINE_BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"model": 3}, TypeError, "model must be a preset name or a path, got int"),
    ({"seed": -1}, ValueError, "seed must be >= 0"),
    ({"seed": 1.0}, TypeError, "seed must be an int, got float"),
    ({"seed": 2**64}, ValueError, "seed must be < 2\\*\\*64"),  # torch.manual_seed's range
    ({"dtype": torch.float8_e4m3fn}, TypeError, "dtype must be torch.float32, torch.bfloat"),
    ({"policy": 1}, TypeError, "policy must be None, a policy name or a mambaradix.policies"),
    ({"policy": "vllm"}, ValueError, "policy 'vllm' lays out its own memory"),
    ({"policy": "vllm@dense"}, ValueError, "policy 'vllm@dense' lays out its own memory"),
    (
        {"policy": "mambardix"},
        ValueError,
        "policy 'mambardix' is not a policy the engine runs; choose from sglang, .*, marconi, "
        "mambaradix, .*default; did you mean 'mambaradix'\\?$",
    ),
    ({"policy": "marconi-oracle"}, ValueError, "policy 'marconi-oracle' is not a policy the"),
    ({"policy": "sglang-used"}, ValueError, "policy 'sglang-used' was retired"),
    (
        {"policy": "mambaradix", "strategy": "extra_buffer"},
        ValueError,
        "strategy 'extra_buffer' differs from policy 'mambaradix''s 'no_buffer'",
    ),
    (
        {"policy": "sglang", "compat": "sglang-0.5.15.post1"},
        ValueError,
        "compat 'sglang-0.5.15.post1' differs from policy 'sglang''s tree",
    ),
    ({"sglang_rules": "yes"}, ValueError, "sglang_rules must be an SGLang release name, got 'yes'"),
    (
        {"sglang_rules": 1},
        TypeError,
        "sglang_rules must be None, a bool or a release name, got int",
    ),
    ({"net": "a model"}, TypeError, "net must be None or a torch.nn.Module, got str"),
    ({"prefix_cache": 1}, TypeError, "prefix_cache must be a bool, got int"),
    ({"kv_tokens": 0}, ValueError, "kv_tokens must be >= 1"),
    ({"kv_tokens": 64.0}, TypeError, "kv_tokens must be an int, got float"),
    ({"kv_tokens": True}, TypeError, "kv_tokens must be an int, got bool"),
    ({"state_slots": 1}, ValueError, "state_slots must be >= 2 with prefix_cache=True and no_b"),
    ({"chunk_size": 0}, ValueError, "chunk_size must be >= 1"),
    ({"max_running": False}, TypeError, "max_running must be an int, got bool"),
    ({"max_context": 0}, ValueError, "max_context must be >= 1"),
    ({"dtype": "float32"}, TypeError, "dtype must be a floating torch.dtype, got 'float32'"),
    ({"dtype": torch.int64}, TypeError, "dtype must be a floating torch.dtype, got torch.int64"),
    ({"batch_decode": 1}, TypeError, "batch_decode must be a bool, got int"),
    ({"deterministic": "yes"}, TypeError, "deterministic must be a bool, got str"),
    (
        {"deterministic": True, "strategy": "extra_buffer", "state_slots": 4},
        ValueError,
        "deterministic=True needs strategy='no_buffer'",
    ),
    ({"device": "tpu"}, ValueError, "device: 'tpu' is not a torch device"),
    ({"device": "meta"}, ValueError, r"device must be 'cpu' or 'cuda\[:N\]', got 'meta'"),
    ({"model_overrides": [1]}, TypeError, "model_overrides must be a dict, got list"),
    ({"page_size": 0}, ValueError, "page_size must be >= 1"),
    ({"page_size": 16}, ValueError, "page_size 16 needs strategy='extra_buffer'"),
    ({"strategy": "paged"}, ValueError, "strategy must be one of no_buffer, extra_buffer"),
    ({"compat": "vllm"}, ValueError, "compat must be one of"),
    ({"track_interval": 0}, ValueError, "track_interval must be >= 1"),
    (
        {"strategy": "extra_buffer", "state_slots": 3},
        ValueError,
        "state_slots must be >= 4 with prefix_cache=True and extra_buffer",
    ),
    (
        {"strategy": "extra_buffer", "page_size": 16, "kv_tokens": 1000},
        ValueError,
        r"kv_tokens \(1000\) must be a multiple of page_size \(16\)",
    ),
    (
        {"strategy": "extra_buffer", "page_size": 16, "chunk_size": 100},
        ValueError,
        r"chunk_size \(100\) must be a multiple of page_size \(16\)",
    ),
]


@pytest.mark.parametrize(("kw", "exc", "says"), ENGINE_BAD)
def test_engine_constructor(kw: dict[str, Any], exc: type[Exception], says: str) -> None:
    from mambaradix.engine import Engine

    with pytest.raises(exc, match=f"^{says}"):
        Engine(**kw)


@pytest.mark.slow  # builds a model
@pytest.mark.parametrize(
    ("kw", "names"),
    [
        ({"kv_tokens": 2**50}, "kv_tokens=1,125,899,906,842,624, state_slots=64 and max_running=8"),
        (
            {"state_slots": 2**40},
            "kv_tokens=65,536, state_slots=1,099,511,627,776 and max_running=8",
        ),
        # 10**6 request-table rows of 65,537 positions x 8 B: 524 GB
        ({"max_running": 10**6}, "kv_tokens=65,536, state_slots=64 and max_running=1,000,000"),
    ],
)
def test_engine_pools_beyond_this_machine(kw: dict[str, Any], names: str) -> None:
    from mambaradix.engine import Engine

    with pytest.raises(ValueError, match=f"^{names} need about .* GB of this machine's memory"):
        Engine(**kw)


@pytest.mark.parametrize(("new", "exc"), [(0, ValueError), (-1, ValueError), (1.0, TypeError)])
def test_compare_cache_needs_a_new_token(new: Any, exc: type[Exception]) -> None:
    # generate(..., 0) runs nothing and counts nothing, so a comparison of no
    # new tokens would report 0 prompt tokens for requests it says it served.
    from mambaradix.compare import compare_cache

    with pytest.raises(exc, match="^max_new_tokens must be"):
        compare_cache([[[1, 2, 3]]], new, kv_tokens=64, state_slots=4)


def save_llama(path: Any) -> None:
    """A tiny attention-only checkpoint: not a hybrid model."""
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)


@pytest.mark.slow  # builds a model
def test_engine_local_checkpoints_that_cannot_serve(tmp_path: Any) -> None:
    from mambaradix.engine import Engine

    with pytest.raises(ValueError, match=f"^model '{tmp_path}' cannot be loaded: "):
        Engine(model=str(tmp_path))  # a directory, but no checkpoint in it
    save_llama(tmp_path / "llama")
    with pytest.raises(
        ValueError, match="^model must be a hybrid model.* 1 attention and 0 recurrent"
    ):
        Engine(model=str(tmp_path / "llama"))


@pytest.mark.slow  # builds a model
@pytest.mark.parametrize(
    ("kw", "says"),
    [
        # transformers' configs keep unknown keywords as attributes: a typo changed nothing
        ({"model_overrides": {"hiden_size": 64}}, "model_overrides: 'hiden_size' is not a field"),
        ({"model_overrides": {"hidden_size": -1}}, "model_overrides {'hidden_size': -1}: "),
    ],
)
def test_engine_overrides_that_cannot_apply(kw: dict[str, Any], says: str) -> None:
    from mambaradix.engine import Engine

    with pytest.raises(ValueError, match=f"^{says}"):
        Engine(**kw)


@pytest.mark.slow  # builds a model
def test_engine_overrides_do_not_apply_to_a_checkpoint(tmp_path: Any) -> None:
    from mambaradix.engine import Engine

    save_llama(tmp_path)
    with pytest.raises(ValueError, match="^model_overrides apply to presets only"):
        Engine(model=str(tmp_path), model_overrides={"hidden_size": 64})


@pytest.mark.slow  # builds a model
def test_engine_max_context_is_the_longest_sequence() -> None:
    # max_context=40: a 40-token prompt and 1 new token use 40 positions (the last
    # token is never stored); a 41-token one uses 41, one more than asked for
    from mambaradix.engine import Engine

    eng = Engine(kv_tokens=64, state_slots=4, max_context=40)
    assert len(eng.generate([[1] * 40], max_new_tokens=1)[0].output_ids) == 1
    with pytest.raises(ValueError, match=r"^prompts\[0\] needs 41 positions .* max_context is 40"):
        eng.generate([[1] * 41], max_new_tokens=1)


@pytest.mark.slow  # builds a model
def test_engine_without_cache_needs_one_slot() -> None:
    from mambaradix.engine import Engine

    eng = Engine(prefix_cache=False, kv_tokens=32, state_slots=1)
    assert len(eng.generate([[1, 2, 3]], max_new_tokens=2)[0].output_ids) == 2


GENERATE_BAD: list[tuple[Any, Any, type[Exception], str]] = [
    ([[1, 2.0]], 2, TypeError, r"prompts\[0\]\[1\] must be an int token id, got float"),
    ([[1], [True]], 2, TypeError, r"prompts\[1\]\[0\] must be an int token id, got bool"),
    ([[1, 1024]], 2, ValueError, r"prompts\[0\]\[1\] = 1024 is outside the vocabulary \[0, 1024\)"),
    ([[-1]], 2, ValueError, r"prompts\[0\]\[0\] = -1 is outside the vocabulary"),
    ([[]], 2, ValueError, r"prompts\[0\] is empty"),
    (["abc"], 2, TypeError, r"prompts\[0\] must be a list of token ids, got str"),
    ([1, 2], 2, TypeError, r"prompts\[0\] must be a list of token ids, got int"),
    ("abc", 2, TypeError, "prompts must be a list of token-id lists, got str"),
    ([[1]], 1.5, TypeError, "max_new_tokens must be an int, got float"),
    ([[1]], True, TypeError, "max_new_tokens must be an int, got bool"),
    ([[1]], -1, ValueError, "max_new_tokens must be >= 0"),
    # 57 + 6 + 1 = 64 is not strictly below the 64-token pool
    ([[1] * 57], 6, ValueError, r"prompts\[0\] needs a KV pool of 65 tokens \(57 prompt \+ 6"),
]


@pytest.mark.slow  # builds a model
@pytest.mark.parametrize(("prompts", "new", "exc", "says"), GENERATE_BAD)
def test_engine_generate(
    engine: Any, prompts: Any, new: Any, exc: type[Exception], says: str
) -> None:
    before = engine.stats()
    with pytest.raises(exc, match=f"^{says}"):
        engine.generate(prompts, max_new_tokens=new)
    assert engine.stats() == before  # nothing ran, nothing counted
    engine.check()


@pytest.mark.slow  # builds a model
def test_engine_generate_names_the_pool_a_long_answer_needs() -> None:
    # Admission clips the new tokens at 4096 (3 + 4096 + 1 < 4200), but after
    # 5000 greedy tokens the sequence holds 3 + 5000 - 1 = 5002 KV positions:
    # the pool it needs is 5002, not the 4101 admission alone asks for.
    from mambaradix.engine import Engine

    eng = Engine(kv_tokens=4200, state_slots=4)
    with pytest.raises(ValueError, match=r"^prompts\[0\] needs a KV pool of 5,002 tokens"):
        eng.generate([[1, 2, 3]], max_new_tokens=5000)


@pytest.mark.slow  # builds a model
def test_engine_generate_accepts_what_fits_exactly(engine: Any) -> None:
    # 56 prompt + 6 new + 1 = 63 < 64: the largest prompt admitted alone.
    assert len(engine.generate([list(range(56))], max_new_tokens=6)[0].output_ids) == 6
    engine.check()


# --------------------------------------------------------- scheduler, sequences


def small_scheduler(max_context: int = 64) -> tuple[Any, Any]:
    from driving import make_manager, make_scheduler

    mgr, pool = make_manager(kv_tokens=200, state_slots=8, max_context=max_context)
    return mgr, make_scheduler(mgr, pool)


SEQUENCE_BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"prompt": [1.5, 2]}, TypeError, "prompt must be a sequence of"),
    ({"prompt": np.array([1.0, 2.0])}, TypeError, "prompt must be a sequence of"),
    ({"prompt": "abc"}, TypeError, "prompt must be a sequence of ints, got str"),
    ({"prompt": None}, TypeError, "prompt must be a sequence of ints, got NoneType"),
    ({"extra_key": [1]}, TypeError, "extra_key must be hashable, got list"),
    ({"extra_key": (1, [2])}, TypeError, "extra_key must be hashable, got tuple"),
    ({"decode_steps": 2.5}, TypeError, "decode_steps must be an int, got float"),
    ({"decode_steps": True}, TypeError, "decode_steps must be an int, got bool"),
    ({"script": [1.5, 2.0]}, TypeError, "script must be a sequence of"),
]


@pytest.mark.parametrize(("kw", "exc", "says"), SEQUENCE_BAD)
def test_sequence(kw: dict[str, Any], exc: type[Exception], says: str) -> None:
    """Refused when built: an unhashable extra_key used to pass, then raise inside
    `Scheduler.step()` after the requests before it were matched, so that every
    later step raised too ("already matched")."""
    from mambaradix.scheduler import Sequence

    args: dict[str, Any] = {"prompt": [1, 2, 3], "max_new_tokens": 2, **kw}
    with pytest.raises(exc, match=f"^{says}"):
        Sequence(**args)


def test_sequence_accepts_numpy_and_copies_its_input() -> None:
    from mambaradix.scheduler import Sequence

    prompt = [1, 2, 3]
    seq = Sequence(np.array(prompt), np.int64(2), decode_steps=np.int64(3))  # type: ignore[arg-type]
    prompt.append(4)
    assert list(seq.req.input_ids) == [1, 2, 3] and seq.total_steps == 3


def test_submit_twice_is_refused() -> None:
    """A sequence submitted twice used to sit twice in the waiting queue: the
    second copy's match raised in every later step (the scheduler was stuck)."""
    from mambaradix.scheduler import Sequence

    mgr, sched = small_scheduler()
    seq = Sequence(array("q", [1, 2, 3, 4]), 3, script=array("q", [5, 6, 7]))
    sched.submit(seq)
    with pytest.raises(ValueError, match="already submitted"):
        sched.submit(seq)
    assert sched.waiting == [seq]
    sched.run()
    assert list(seq.outputs) == [5, 6, 7]
    with pytest.raises(ValueError, match="already submitted"):
        sched.submit(seq)  # finished: not again either
    mgr.tree.check_invariants()
    mgr.check_conservation()


def test_submit_of_a_sequence_the_request_table_cannot_hold() -> None:
    """7 prompt + 4 new - 1 = 10 positions > max_context 9: used to fail half-way
    through a step, holding the KV it had taken."""
    from mambaradix.scheduler import Sequence

    mgr, sched = small_scheduler(max_context=9)
    long = Sequence(array("q", range(1, 8)), 4, script=array("q", [5, 6, 7, 8]))
    with pytest.raises(ValueError, match=r"needs 10 positions .* holds 9 \(max_context\)"):
        sched.submit(long)
    assert not sched.waiting
    fits = Sequence(array("q", range(1, 7)), 4, script=array("q", [5, 6, 7, 8]))  # 9 positions
    sched.submit(fits)
    sched.run()
    assert list(fits.outputs) == [5, 6, 7, 8]
    mgr.tree.check_invariants()
    mgr.check_conservation()
    assert mgr.kv.available_size() + mgr.tree.total_size()[0] == 200


@pytest.mark.parametrize("compat", [None, "sglang-0.5.15.post1", "sglang-0.5.23"])
def test_abort_after_finish_keeps_the_sequence_finished(compat: str | None) -> None:
    """Aborting a sequence that already finished (a client gone after its answer)
    used to relabel it ABORTED; it holds nothing, so nothing happens."""
    from driving import make_manager, make_scheduler
    from mambaradix.scheduler import Sequence

    mgr, pool = make_manager(kv_tokens=200, state_slots=8, compat=compat)
    sched = make_scheduler(mgr, pool)
    seq = Sequence(array("q", [1, 2, 3, 4]), 3, script=array("q", [5, 6, 7]))
    sched.submit(seq)
    sched.run()
    cached = mgr.tree.total_size()
    sched.abort(seq)
    assert seq.status == "finished" and list(seq.outputs) == [5, 6, 7]
    assert mgr.tree.total_size() == cached
    mgr.check_conservation()


def test_serving_config_takes_numpy_ints_as_ints() -> None:
    """numpy ints pass the checks (operator.index); they used to stay numpy and
    make the replay fail half-way (the tree takes a plain int page_size)."""
    trace, prof = tiny_trace(), get_profile("marconi-7b")
    fields = {"chunk_tokens": 512, "page_size": 1, "track_interval": 256, "max_running": 8}
    cfg = ServingConfig(1.0, **{k: np.int64(v) for k, v in fields.items()})
    assert all(type(getattr(cfg, k)) is int for k in fields)
    got = replay(trace, prof, "sglang", cfg)
    want = replay(trace, prof, "sglang", ServingConfig(1.0, **fields))
    wall = ("replay_s", "requests_per_s")  # timings of this run
    assert {k: v for k, v in got.items() if k not in wall} == {
        k: v for k, v in want.items() if k not in wall
    }
    json.dumps(got.to_json())


POLICY_BAD: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("marconi", {"alpha": -1.0}, ValueError, "alpha must be a finite number >= 0 or None"),
    ("marconi", {"alpha": NAN}, ValueError, "alpha must be a finite number >= 0 or None"),
    ("marconi", {"alpha": INF}, ValueError, "alpha must be a finite number >= 0 or None"),
    ("marconi", {"alpha": True}, TypeError, "alpha must be a finite number >= 0 or None"),
    ("marconi", {"alpha": "0.5"}, TypeError, "alpha must be a finite number >= 0 or None"),
    ("marconi", {"bootstrap_multiplier": -1}, ValueError, "bootstrap_multiplier must be an int"),
    ("marconi", {"bootstrap_multiplier": 2.5}, TypeError, "bootstrap_multiplier must be an int"),
    ("mambaradix", {"prior": -1.0}, ValueError, "prior must be a finite number >= 0"),
    ("mambaradix", {"prior": NAN}, ValueError, "prior must be a finite number >= 0"),
    ("mambaradix", {"prior": "1"}, TypeError, "prior must be a finite number >= 0"),
    ("mambaradix", {"sample": -3}, ValueError, "sample must be an int >= 0"),
    ("mambaradix", {"sample": 1.5}, TypeError, "sample must be an int >= 0"),
    ("mambaradix", {"classes": "no"}, TypeError, "classes must be a bool, got str"),
    ("mambaradix", {"admission": 0}, TypeError, "admission must be a bool, got int"),
    ("mambaradix", {"bogus": 1}, TypeError, "unknown setting bogus; choose from prior"),
]


@pytest.mark.parametrize("name, kwargs, exc, message", POLICY_BAD)
def test_policy_parameters(
    name: str, kwargs: dict[str, Any], exc: type[Exception], message: str
) -> None:
    # Refused when the policy is built, before it runs anything, naming the parameter.
    with pytest.raises(exc, match="^" + message):
        make_policy(name, **kwargs)


def test_policy_parameters_at_their_edges_are_taken() -> None:
    assert make_policy("marconi", alpha=0).alpha == 0.0  # type: ignore[attr-defined]
    assert make_policy("marconi", bootstrap_multiplier=0).bootstrap == 0  # type: ignore[attr-defined]
    assert make_policy("mambaradix", prior=0.0, sample=0).settings.sample == 0  # type: ignore[attr-defined]


CLUSTER_REPLAY_BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"trace": []}, TypeError, "trace must be a Trace, got list"),
    ({"cfg": 1.0}, TypeError, "cfg must be a ServingConfig, got float"),
    ({"policy": "nope"}, ValueError, "policy: unknown policy nope; choose from sglang"),
    ({"policy": "marconi-oracle"}, ValueError, r"policy: marconi-oracle \(a run per alpha\)"),
    ({"router": "nope"}, ValueError, "router: unknown router nope"),
    ({"spec": 2}, TypeError, "spec must be a ClusterSpec, got int"),
    ({"cfg": ServingConfig(0.001)}, ValueError, "memory_gb 0.001 GB holds"),
]


@pytest.mark.parametrize(("kw", "exc", "says"), CLUSTER_REPLAY_BAD)
def test_cluster_replay_entry(kw: dict[str, Any], exc: type[Exception], says: str) -> None:
    # cluster_replay is public (its __all__): it checks what replay() checks, before any
    # instance is built (it crashed with AttributeError / KeyError deep inside).
    from mambaradix.replay.cluster import cluster_replay

    args: dict[str, Any] = {
        "trace": tiny_trace(),
        "profile": get_profile("marconi-7b"),
        "policy": "sglang",
        "cfg": ServingConfig(1.0),
        "router": "hybrid",
        "spec": ClusterSpec(2),
    }
    with pytest.raises(exc, match=f"^{says}"):
        cluster_replay(**{**args, **kw})
