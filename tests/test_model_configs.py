"""Models from their config.json: every hybrid family transformers 5.24.0 ships.

Each expected number is written out below from the layer formulas, not taken
from the code under test:

* KV bytes per token = attention layers x 2 (K, V) x KV heads x head size x 2 (bf16);
* one state checkpoint, as SGLang stores it = per recurrent layer a conv state
  of conv_dim x (kernel - 1) at 2 bytes (bf16) plus the SSM state at 4 bytes
  (fp32): Mamba2 conv_dim = heads*head_dim + 2*groups*state, SSM
  heads*head_dim*state; Mamba1 conv_dim = d_inner, SSM d_inner*state; Gated
  DeltaNet conv_dim = 2*k_heads*k_dim + v_heads*v_dim, SSM v_heads*k_dim*v_dim;
  LFM2's short conv: conv_dim = hidden, no SSM state.

The configs are `save_pretrained` output (tests/hf_configs.py; a slow test
checks the committed files are what transformers writes today).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hf_configs import CONFIGS, DATA, write
from mambaradix.cli import main
from mambaradix.geometry.hf import from_config, load_geometry
from mambaradix.geometry.profile import PROFILES, load_profile, profile_from_config

GDN_QWEN = (2 * 16 * 128 + 32 * 128) * 3 * 2 + 32 * 128 * 128 * 4  # Qwen3-Next / 3.5 layer

EXPECTED: dict[str, tuple[int, int]] = {
    # name: (KV bytes per token, state bytes)
    "Nemotron-Nano-9B-v2": (
        4 * 2 * 8 * 128 * 2,
        27 * ((128 * 80 + 2 * 8 * 128) * 3 * 2 + 128 * 80 * 128 * 4),
    ),
    "Falcon-H1-Tiny-90M": (
        24 * 2 * 2 * 64 * 2,
        24 * ((768 + 2 * 1 * 64) * 3 * 2 + 24 * 32 * 64 * 4),
    ),
    "granite-4.0-h-small": (
        4 * 2 * 8 * 128 * 2,
        36 * ((8192 + 2 * 1 * 128) * 3 * 2 + 8192 * 128 * 4),
    ),
    # transformers' Bamba defaults: hidden 4096, 32 heads (128 each), 8 KV heads,
    # Mamba2 128 heads of 64 (expand 2), state 256, 1 group
    "bamba-9b": (3 * 2 * 8 * 128 * 2, 29 * ((8192 + 2 * 256) * 3 * 2 + 8192 * 256 * 4)),
    "jamba-1.5-mini": (4 * 2 * 8 * 128 * 2, 28 * (8192 * 3 * 2 + 8192 * 16 * 4)),
    # Zamba2-2.7B: hidden 2560; shared attention over 2*2560, 32 heads of 160,
    # 9 hybrid layers each with their own KV; 54 Mamba2 layers of 80 heads x 64
    "zamba2-2.7b": (9 * 2 * 32 * 160 * 2, 54 * ((5120 + 2 * 64) * 3 * 2 + 5120 * 64 * 4)),
    # LFM2-1.2B: hidden 2048, 6 attention layers (32 heads of 64, 8 KV), 10 short convs
    "lfm2-1.2b": (6 * 2 * 8 * 64 * 2, 10 * 2048 * 2 * 2),
    "lfm2-8b-a1b": (10 * 2 * 8 * 64 * 2, 22 * 2048 * 2 * 2),
    "qwen3-next-80b-a3b": (12 * 2 * 2 * 256 * 2, 36 * GDN_QWEN),
    "qwen3.5-9b": (8 * 2 * 4 * 256 * 2, 24 * GDN_QWEN),
    "qwen3.5-35b-a3b": (10 * 2 * 2 * 256 * 2, 30 * GDN_QWEN),
    # Olmo-Hybrid: hidden 3840, 30 heads of 128 (30 KV); GDN 30 heads, k 96, v 192
    "olmo-hybrid-7b": (
        8 * 2 * 30 * 128 * 2,
        24 * ((2 * 30 * 96 + 30 * 192) * 3 * 2 + 30 * 96 * 192 * 4),
    ),
}


def test_every_family_has_a_config_and_an_expectation() -> None:
    assert sorted(EXPECTED) == sorted(CONFIGS)
    kinds = {json.loads((DATA / n / "config.json").read_text())["model_type"] for n in CONFIGS}
    assert kinds == {
        "nemotron_h", "falcon_h1", "granitemoehybrid", "bamba", "jamba", "zamba2", "lfm2",
        "lfm2_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid",
    }  # fmt: skip


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_kv_and_state_bytes_by_hand(name: str) -> None:
    profile = profile_from_config(DATA / name)  # a directory holding config.json
    assert (profile.kv_bytes_per_token, profile.state_bytes) == EXPECTED[name]
    assert profile.name == name
    same = profile_from_config(DATA / name / "config.json")  # the file itself
    assert same.geometry == profile.geometry


def test_vllm_block_of_new_families_by_hand() -> None:
    # vLLM 0.33.0: conv and SSM at the model dtype (bf16) for these families;
    # block = 16 * cdiv(mamba page, 16 * attention page of one token)
    falcon = profile_from_config(DATA / "Falcon-H1-Tiny-90M")
    page = (768 + 2 * 64) * 3 * 2 + 24 * 32 * 64 * 2  # 103,680 bytes
    assert falcon.vllm_block_tokens == 16 * -(-page // (16 * 2 * 2 * 64 * 2)) == 208
    lfm2 = profile_from_config(DATA / "lfm2-1.2b")
    assert lfm2.vllm_block_tokens == 16 * -(-(2048 * 2 * 2) // (16 * 2 * 8 * 64 * 2)) == 16


def test_layer_layouts_follow_the_config_lists() -> None:
    nano = load_geometry(DATA / "Nemotron-Nano-9B-v2")
    kinds = "".join({"mamba2": "M", "attention": "*", "mlp": "-"}[x.kind] for x in nano.layers)
    assert kinds == "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"
    zamba = load_geometry(DATA / "zamba2-2.7b")
    assert zamba.count("attention") == 9 and zamba.count("mamba2") == 54
    assert {x.in_dim for x in zamba.attention} == {2 * 2560}
    falcon = load_geometry(DATA / "Falcon-H1-Tiny-90M")  # parallel attention + SSM per layer
    assert [x.kind for x in falcon.layers[:3]] == ["attention", "mamba2", "mlp"]
    lfm2 = load_geometry(DATA / "lfm2-1.2b")
    mixers = [x.kind for x in lfm2.layers[0::2]]
    assert [i for i, k in enumerate(mixers) if k == "attention"] == [2, 5, 8, 10, 12, 14]
    # Lfm2MLP: int(2 * 12288 / 3) = 8192, times 1.0, rounded up to 256
    assert lfm2.layers[1].intermediate == 8192  # type: ignore[union-attr]


def test_state_dtype_options_by_hand() -> None:
    conv, ssm = 12288 * 3, 128 * 80 * 128  # Nemotron-Nano-9B-v2, elements per layer
    by_dtype = {
        "auto": 27 * (conv * 2 + ssm * 4),  # SGLang: conv bf16, ssm fp32
        "bf16": 27 * (conv * 2 + ssm * 2),
        "float32": 27 * (conv * 4 + ssm * 4),
        "int8": 27 * (conv * 1 + ssm * 1),
    }
    for choice, want in by_dtype.items():
        p = profile_from_config(DATA / "Nemotron-Nano-9B-v2", state_dtype=choice)
        assert p.state_bytes == want, choice
        assert p.state_dtypes is not None
        assert p.state_dtypes.changes_outputs == (choice == "int8")
    int8 = load_profile("nemotron-h-8b", "int8")  # a built-in name takes the option too
    assert int8.state_bytes == 24 * ((8192 + 2 * 8 * 128) * 3 + 128 * 64 * 128)
    # vLLM's page at int8: 16 * cdiv(state of one layer, 16 * 4 layers' KV of a token / 4)
    layer = (8192 + 2 * 8 * 128) * 3 + 128 * 64 * 128
    assert int8.vllm_block_tokens == 16 * -(-layer // (16 * 2 * 8 * 128 * 2))
    assert load_profile("nemotron-h-8b") is PROFILES["nemotron-h-8b"]


def _cfg(name: str) -> dict[str, object]:
    data = json.loads((DATA / name / "config.json").read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize(
    ("change", "error", "words"),
    [
        ({"model_type": "kimi_linear"}, ValueError, "'model_type' 'kimi_linear' is not modelled"),
        ({"model_type": "llama"}, ValueError, "'model_type' 'llama' is not a hybrid family"),
        ({"model_type": None, "architectures": ["X"]}, ValueError, "'model_type' is missing"),
        ({"sliding_window": 4096}, ValueError, "'sliding_window'"),
        ({"mamba_d_head": 33}, ValueError, "'mamba_d_head'"),
        ({"mamba_n_heads": "24"}, TypeError, "'mamba_n_heads'"),
        ({"hidden_size": None}, ValueError, "'hidden_size' is missing"),
        ({"dtype": "float7"}, ValueError, "'dtype'"),
    ],
)
def test_a_config_that_cannot_be_modelled_names_the_key(
    change: dict[str, object], error: type, words: str
) -> None:
    cfg = {**_cfg("Falcon-H1-Tiny-90M"), **change}
    with pytest.raises(error, match=words):
        from_config(cfg)


@pytest.mark.parametrize(
    ("name", "width"),
    [
        ("Falcon-H1-Tiny-90M", "hidden_size"),  # head size from hidden_size / heads
        ("jamba-1.5-mini", "hidden_size"),
        ("zamba2-2.7b", "2*hidden_size"),  # its attention reads [x, embeddings]
    ],
)
def test_heads_that_do_not_split_the_width_name_the_key(name: str, width: str) -> None:
    """By hand: hidden_size 4097 is odd, so no even head count divides it (nor 2 * 4097
    for a head count of 4); the head size must come from the width, not a config key."""
    cfg = {**_cfg(name), "hidden_size": 4097, "num_attention_heads": 4}
    cfg.pop("head_dim", None)
    cfg.pop("attention_head_dim", None)
    says = re.escape(f"'num_attention_heads' (4) must divide {width}")
    with pytest.raises(ValueError, match=says + "$"):
        from_config(cfg)


def test_not_a_hybrid_names_the_layer_list() -> None:
    lfm2 = _cfg("lfm2-1.2b")
    with pytest.raises(ValueError, match="'layer_types': no recurrent"):
        from_config({**lfm2, "layer_types": ["full_attention"] * 16})
    with pytest.raises(ValueError, match="'attn_layer_indices': no full-attention"):
        from_config({**_cfg("bamba-9b"), "attn_layer_indices": []})
    with pytest.raises(ValueError, match="'layer_types' must have one entry per layer"):
        from_config({**lfm2, "layer_types": ["conv", "full_attention"]})


def test_config_files_that_do_not_read(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        load_geometry(tmp_path)  # a directory without config.json
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "bamba",\n  "hidden_size": }')
    with pytest.raises(ValueError, match=r"config.json, line 2: invalid JSON"):
        load_geometry(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        load_geometry(bad)
    bad.write_text(json.dumps({**_cfg("bamba-9b"), "mamba_d_state": 0}))
    with pytest.raises(ValueError, match=r"config.json: config key 'mamba_d_state' must be >= 1"):
        profile_from_config(tmp_path)
    with pytest.raises(KeyError, match="unknown model profile 'gpt-17'.*config.json path"):
        load_profile("gpt-17")


@pytest.mark.slow  # a whole replay with its plot: about 4-10 s
def test_replay_cli_takes_a_config_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, out = tmp_path / "t.jsonl", tmp_path / "r.json"
    rows = [{"session_id": s, "turn_id": 0, "ts": s, "input_tokens": [1, 2, 3, 4 + s],
             "output_tokens": [5, 6]} for s in range(3)]  # fmt: skip
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["replay", "--trace", str(trace), "--model", str(DATA / "lfm2-1.2b")]
    args += ["--memory", "1", "--policy", "mambaradix", "--workers", "1", "--no-progress"]
    assert main([*args, "--json", str(out), "--plot", str(tmp_path / "r.png")]) == 0
    model = json.loads(out.read_text())["model"]
    assert model == {"name": "lfm2-1.2b", "kv_bytes_per_token": 12288, "state_bytes": 81920}


def test_replay_cli_refuses_a_bad_config_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**_cfg("lfm2-1.2b"), "model_type": "x"}))
    assert main(["replay", "--model", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mambaradix replay: error: --model: model config ")
    assert "config key 'model_type' 'x' is not a hybrid family" in err and "\n" not in err
    assert main(["replay", "--model", "marconi-7b", "--state-dtype", "int8"]) == 2
    assert "--state-dtype: state_dtype: marconi-7b has a fixed accounting" in (
        capsys.readouterr().err
    )


@pytest.mark.slow
def test_committed_configs_are_what_transformers_writes(tmp_path: Path) -> None:
    for path in write(tmp_path):
        name = path.parent.name
        assert json.loads(path.read_text()) == _cfg(name), name


@pytest.mark.slow
def test_the_issues_nemotron_nano_to_dict_is_modelled() -> None:
    import transformers

    cls, kwargs = CONFIGS["Nemotron-Nano-9B-v2"]
    cfg = getattr(transformers, cls)(**kwargs).to_dict()
    geom = from_config(cfg, "nano")
    assert geom.layers == load_geometry(DATA / "Nemotron-Nano-9B-v2", "nano").layers
    for name, (cls, kwargs) in CONFIGS.items():  # to_dict() reads as save_pretrained output
        got = profile_from_config(getattr(transformers, cls)(**kwargs).to_dict(), name=name)
        assert (got.kv_bytes_per_token, got.state_bytes) == EXPECTED[name], name
