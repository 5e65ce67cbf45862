"""Per-layer geometry: every derived figure against arithmetic written out by hand.

The expected numbers below are computed in the test from the published
config values (not by calling the code under test): vLLM's block as vLLM
0.33.0 ``Platform._align_hybrid_block_size`` computes it, state bytes at
SGLang's and vLLM's dtypes, KV bytes, Marconi's accounting.
"""

from __future__ import annotations

from dataclasses import replace
from math import ceil

import pytest

from mambaradix.geometry import (
    MLP,
    PRESETS,
    Attention,
    EnginePreset,
    GatedDeltaNet,
    Geometry,
    Mamba1,
    Mamba2,
    MoE,
    StateDtypes,
    engine_state_dtypes,
    figures,
    published,
    sglang_state_dtypes,
    vllm_block,
    vllm_state_dtypes,
)
from mambaradix.geometry.configs import (
    JAMBA_15_MINI_CONFIG,
    NEMOTRON_H_8B_CONFIG,
    QWEN3_NEXT_80B_A3B_CONFIG,
    jamba,
    nemotron_h,
    qwen3_next,
)

GEOMS = published()
BF16 = StateDtypes("bfloat16", "bfloat16", "test: all bf16")
DROP = object()


# --------------------------------------------------------------------------- vLLM's block


def test_vllm_block_nemotron_h_8b_fp32_ssm_is_1040() -> None:
    g = GEOMS["nemotron-h-8b"]
    # vLLM 0.33.0 NemotronHForCausalLMConfig: config has no mamba_ssm_cache_dtype -> float32
    assert vllm_state_dtypes(g).ssm == "float32" and vllm_state_dtypes(g).conv == "bfloat16"
    attn_page = 2 * 8 * 128 * 2  # K+V x 8 kv heads x head_dim 128 x bf16 = 4,096 per token
    mamba_page = (8192 + 2 * 8 * 128) * 3 * 2 + 128 * 64 * 128 * 4  # 61,440 + 4,194,304
    assert mamba_page == 4_255_744
    expected = 16 * ceil(mamba_page / (16 * attn_page))  # 16 * ceil(64.94) = 16 * 65
    assert expected == 1040
    b = vllm_block(g)
    assert (b.tokens, b.attention_page_per_token, b.mamba_page) == (1040, attn_page, mamba_page)
    # one state as vLLM holds it: 24 padded pages of 1040 tokens x 4,096 bytes
    assert b.state_bytes == 24 * 1040 * 4096 == 102_236_160
    # the old whole-model division gave 16 * ceil(102,137,856 / 16,384 / 16) = 6,240 tokens
    assert b.tokens != 16 * ceil(102_137_856 / 16_384 / 16) == 6240


def test_vllm_block_nemotron_h_8b_bf16_ssm_is_528() -> None:
    mamba_page = (8192 + 2 * 8 * 128) * 3 * 2 + 128 * 64 * 128 * 2  # 2,158,592
    expected = 16 * ceil(mamba_page / (16 * 4096))  # 16 * ceil(32.94) = 528
    assert expected == 528
    assert vllm_block(GEOMS["nemotron-h-8b"], dtypes=BF16).tokens == 528


def test_vllm_all_mode_block_nemotron_h_8b() -> None:
    # vLLM 0.20.0 "all": c = lcm(chunk_size 128, 16) = 128; ceil(4,255,744 / 4,096) = 1,039
    expected = 128 * ceil(ceil(4_255_744 / 4096) / 128)  # 128 * 9
    b = vllm_block(GEOMS["nemotron-h-8b"])
    assert b.all_mode_supported and b.all_mode_tokens == expected == 1152


def test_vllm_block_qwen3_next_bf16_ssm() -> None:
    g = GEOMS["qwen3-next-80b-a3b"]
    # no vLLM hook for Qwen3NextForCausalLM: mamba_ssm_cache_dtype "auto" = conv dtype = bf16
    assert (vllm_state_dtypes(g).conv, vllm_state_dtypes(g).ssm) == ("bfloat16", "bfloat16")
    attn_page = 2 * 2 * 256 * 2  # 2,048
    mamba_page = (2 * 16 * 128 + 32 * 128) * 3 * 2 + 32 * 128 * 128 * 2  # 49,152 + 1,048,576
    # SM90: FlashInfer GDN prefill checkpoints on a 64-token grid -> align lcm(16, 64) = 64
    assert vllm_block(g).tokens == 64 * ceil(mamba_page / (64 * attn_page)) == 576
    # without FlashInfer GDN prefill (e.g. SM80) only the kernel's 16 applies
    no_grid = vllm_block(g, gdn_checkpoint_alignment=None)
    assert no_grid.tokens == 16 * ceil(mamba_page / (16 * attn_page)) == 544
    assert not vllm_block(g).all_mode_supported  # falls back to align
    assert vllm_block(g).all_mode_tokens == 576


def test_vllm_block_gdn_fp32_ssm_is_1056() -> None:
    # A Qwen3.5-family config with the same GDN geometry and mamba_ssm_dtype float32 (as
    # Qwen3.6-35B-A3B's, vllm #42317): the Qwen3_5 hook takes it; 16-aligned -> 1,056.
    cfg = {
        **QWEN3_NEXT_80B_A3B_CONFIG,
        "architectures": ["Qwen3_5MoeForCausalLM"],
        "mamba_ssm_dtype": "float32",
    }
    g = qwen3_next("qwen3.5-like", cfg)
    assert vllm_state_dtypes(g).ssm == "float32"
    mamba_page = (2 * 16 * 128 + 32 * 128) * 3 * 2 + 32 * 128 * 128 * 4  # 2,146,304
    expected = 16 * ceil(mamba_page / (16 * 2048))  # 16 * ceil(65.5) = 16 * 66
    assert vllm_block(g, gdn_checkpoint_alignment=None).tokens == expected == 1056
    assert vllm_block(g).tokens == 64 * ceil(mamba_page / (64 * 2048)) == 1088
    assert sglang_state_dtypes(g).ssm == "float32"  # SGLang reads the same key


def test_vllm_block_jamba_and_marconi() -> None:
    # Jamba: no hook, bf16 states: conv (8192 x 3) + ssm (8192 x 16), attention page 4,096
    jamba_page = 8192 * 3 * 2 + 8192 * 16 * 2  # 311,296
    b = vllm_block(GEOMS["jamba-1.5-mini"])
    assert b.tokens == 16 * ceil(jamba_page / (16 * 4096)) == 80
    # "all" in vLLM 0.20.0: no chunk_size in the config -> 2048
    assert b.all_mode_tokens == 2048 * ceil(ceil(jamba_page / 4096) / 2048) == 2048
    # Marconi's pages: 2*D*2 = 16,384 per token; D*N*2 + (2D+2N)*4*2 = 1,116,160 per state
    assert vllm_block(GEOMS["marconi-7b"]).tokens == 16 * ceil(1_116_160 / (16 * 16_384)) == 80


# --------------------------------------------------------------------------- bytes


def test_sglang_state_bytes_per_model() -> None:
    def state(name: str) -> int:
        g = GEOMS[name]
        return figures(g, sglang_state_dtypes(g)).state_bytes

    # 24 Mamba2 x (conv (8192 + 2*8*128) x 3 x bf16 + 128*64*128 x fp32)
    assert state("nemotron-h-8b") == 24 * ((8192 + 2 * 8 * 128) * 3 * 2 + 128 * 64 * 128 * 4)
    # 36 GDN x (conv (2*16*128 + 32*128) x 3 x bf16 + 32*128*128 x fp32)
    assert state("qwen3-next-80b-a3b") == 36 * ((2 * 16 * 128 + 32 * 128) * 3 * 2 + 32 * 128**2 * 4)
    # 28 Mamba1 x (conv (2*4096) x 3 x bf16 + 8192*16 x fp32)
    assert state("jamba-1.5-mini") == 28 * (8192 * 3 * 2 + 8192 * 16 * 4)
    # Marconi: 24 x (D*N*2 + (2D + 2N)*4*2)
    assert state("marconi-7b") == 24 * (4096 * 128 * 2 + (2 * 4096 + 2 * 128) * 4 * 2)


def test_kv_bytes_per_token_per_model() -> None:
    kv = {n: figures(g, sglang_state_dtypes(g)).kv_bytes_per_token for n, g in GEOMS.items()}
    assert kv == {
        "nemotron-h-8b": 4 * 2 * 8 * 128 * 2,
        "qwen3-next-80b-a3b": 12 * 2 * 2 * 256 * 2,
        "jamba-1.5-mini": 4 * 2 * 8 * 128 * 2,
        "marconi-7b": 4 * 2 * 4096 * 2,
    }


def test_marconi_flops_are_its_simulator_formulas() -> None:
    g = GEOMS["marconi-7b"]
    f = figures(g, BF16)  # Marconi's accounting ignores the engine's dtypes
    d, n = 4096, 128
    assert f.linear_flops_per_token == 4 * 8 * d**2 + 28 * 16 * d**2 + 24 * (
        12 * d**2 + 16 * d * n + 10 * d
    )
    assert f.attn_flops_per_pair == 4 * 4 * d and not f.causal
    assert (g.count("attention"), g.count("mamba2"), g.count("mlp")) == (4, 24, 28)


def test_layer_counts_from_configs() -> None:
    counts = {
        n: {
            k: g.count(k) for k in ("attention", "mamba2", "mamba1", "gated_deltanet", "mlp", "moe")
        }
        for n, g in GEOMS.items()
        if n != "marconi-7b"
    }
    assert counts["nemotron-h-8b"] == {
        **dict.fromkeys(counts["nemotron-h-8b"], 0),
        "attention": 4,
        "mamba2": 24,
        "mlp": 24,
    }
    assert counts["qwen3-next-80b-a3b"]["attention"] == 12
    assert counts["qwen3-next-80b-a3b"]["gated_deltanet"] == 36
    assert counts["qwen3-next-80b-a3b"]["moe"] == 48
    j = counts["jamba-1.5-mini"]
    assert (j["attention"], j["mamba1"], j["mlp"], j["moe"]) == (4, 28, 16, 16)
    # attention sits at decoder layers 4, 12, 20, 28 (blocks 2*i)
    blocks = GEOMS["jamba-1.5-mini"].layers
    assert [i // 2 for i, x in enumerate(blocks) if isinstance(x, Attention)] == [4, 12, 20, 28]


# --------------------------------------------------------------------------- engine presets


TODAY_COMMON = {
    "vocab_size": 1024,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "initializer_range": 0.05,
    "tie_word_embeddings": False,
}


def test_presets_write_todays_transformers_kwargs() -> None:
    assert PRESETS["nemotron-h-tiny"].family == "NemotronH"
    assert PRESETS["nemotron-h-tiny"].config_kwargs() == {
        **TODAY_COMMON,
        "layers_block_type": ["mamba", "attention", "mamba", "mlp"],
        "mamba_num_heads": 8,
        "mamba_head_dim": 16,
        "n_groups": 1,
        "ssm_state_size": 16,
        "conv_kernel": 4,
        "expand": 2,
        "chunk_size": 16,
    }
    assert PRESETS["qwen3-next-tiny"].family == "Qwen3Next"
    assert PRESETS["qwen3-next-tiny"].config_kwargs() == {
        **TODAY_COMMON,
        "num_hidden_layers": 4,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "num_experts": 2,
        "num_experts_per_tok": 1,
        "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64,
        "full_attention_interval": 2,
    }


def test_preset_kwargs_read_back_to_the_same_layers() -> None:
    for name, build in (("nemotron-h-tiny", nemotron_h), ("qwen3-next-tiny", qwen3_next)):
        preset = PRESETS[name]
        back = build(name, preset.config_kwargs())
        assert back.layers == preset.geometry.layers and back.hidden == 64


def test_engine_state_bytes_of_presets() -> None:
    # the engine keeps transformers' conv layout: all conv_kernel (4) inputs, float32
    g = PRESETS["nemotron-h-tiny"].geometry
    f = figures(g, engine_state_dtypes(g))
    assert f.state_bytes == 2 * ((8 * 16 + 2 * 16) * 4 * 4 + 8 * 16 * 16 * 4) == 21_504
    assert f.kv_bytes_per_token == 1 * 2 * 2 * 16 * 4
    g = PRESETS["qwen3-next-tiny"].geometry
    f = figures(g, engine_state_dtypes(g))
    assert f.state_bytes == 2 * ((2 * 2 * 16 + 4 * 16) * 4 * 4 + 4 * 16 * 16 * 4) == 12_288


def test_engine_pools_match_the_preset_geometry() -> None:
    # transformers' own cache, probed on one token, against the geometry-derived slot
    from mambaradix.engine.adapter import PoolAdapter
    from mambaradix.engine.models import build_model, state_geometry
    from mambaradix.geometry.profile import get_profile

    for name in PRESETS:
        probe = PoolAdapter(build_model(name), kv_tokens=8, state_slots=2)
        assert probe.geometry == state_geometry(name)
        profile = get_profile(name)
        assert probe.geometry.bytes_per_slot == profile.state_bytes
        kv = len(probe.attn_layers) * 2 * probe.kv_heads * probe.head_dim * 4  # float32
        assert kv == profile.kv_bytes_per_token


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("change", "error", "field"),
    [
        ({"ssm_state_size": DROP}, ValueError, "ssm_state_size"),
        ({"n_groups": "8"}, TypeError, "n_groups"),
        ({"conv_kernel": 1}, ValueError, "conv_kernel"),
        ({"hidden_size": True}, TypeError, "hidden_size"),
        ({"mamba_head_dim": 0}, ValueError, "mamba_head_dim"),
        ({"hybrid_override_pattern": "M?"}, ValueError, "hybrid_override_pattern"),
        ({"num_hidden_layers": 51}, ValueError, "num_hidden_layers"),
        ({"torch_dtype": "float7"}, ValueError, "torch_dtype"),
        ({"architectures": []}, ValueError, "architectures"),
    ],
)
def test_bad_nemotron_config_names_the_key(
    change: dict[str, object], error: type, field: str
) -> None:
    cfg = {k: v for k, v in {**NEMOTRON_H_8B_CONFIG, **change}.items() if v is not DROP}
    with pytest.raises(error, match=field):
        nemotron_h("x", cfg)


def test_bad_qwen_and_jamba_configs_name_the_key() -> None:
    with pytest.raises(TypeError, match="mlp_only_layers"):
        qwen3_next("x", {**QWEN3_NEXT_80B_A3B_CONFIG, "mlp_only_layers": "none"})
    with pytest.raises(ValueError, match="linear_num_value_heads"):
        qwen3_next("x", {**QWEN3_NEXT_80B_A3B_CONFIG, "linear_num_value_heads": 0})
    with pytest.raises(ValueError, match="mamba_d_state"):
        jamba(
            "x",
            {
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "mamba_expand": 2,
                "mamba_d_conv": 4,
            },
        )


def test_bad_layers_and_geometry_name_the_field() -> None:
    with pytest.raises(ValueError, match="Mamba2.state_size"):
        Mamba2(heads=8, head_dim=16, state_size=0, n_groups=1, conv_kernel=4)
    with pytest.raises(TypeError, match="Attention.kv_heads"):
        Attention(heads=4, kv_heads=2.0, head_dim=16)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kv_heads"):
        Attention(heads=6, kv_heads=4, head_dim=16)
    with pytest.raises(TypeError, match="MLP.gated"):
        MLP(128, gated=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="MoE.top_k"):
        MoE(experts=2, top_k=3, intermediate=64)
    with pytest.raises(ValueError, match="GatedDeltaNet.v_heads"):
        GatedDeltaNet(k_heads=3, v_heads=4, head_k_dim=16, head_v_dim=16, conv_kernel=4)
    with pytest.raises(ValueError, match="Mamba1.dt_rank"):
        Mamba1(d_inner=64, state_size=16, conv_kernel=4, dt_rank=-1)
    with pytest.raises(TypeError, match=r"layers\[1\]"):
        Geometry("x", "A", 64, (MLP(128, False), "attention"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Geometry.dtype"):
        Geometry("x", "A", 64, (MLP(128, False),), dtype="fp32")
    with pytest.raises(ValueError, match="accounting"):
        Geometry("x", "A", 64, (MLP(128, False),), accounting="guess")


def test_vllm_block_refuses_what_vllm_cannot_unify() -> None:
    a, m = Attention(4, 2, 16), Mamba2(8, 16, 16, 1, 4)
    mixed = Geometry("mixed", "NemotronHForCausalLM", 64, (a, m, Attention(4, 4, 16), m))
    with pytest.raises(ValueError, match="different sizes"):
        vllm_block(mixed)
    with pytest.raises(ValueError, match="no such layers"):
        vllm_block(Geometry("no-attn", "X", 64, (m, MLP(128, False))))
    with pytest.raises(ValueError, match="kernel_alignment"):
        vllm_block(GEOMS["nemotron-h-8b"], kernel_alignment=0)
    gdn = Geometry("g", "X", 64, (a, GatedDeltaNet(2, 4, 16, 16, 4)), accounting="marconi")
    with pytest.raises(ValueError, match="marconi accounting has no formula"):
        figures(gdn, BF16)


@pytest.mark.parametrize("build", [nemotron_h, qwen3_next, jamba])
@pytest.mark.parametrize("cfg", [None, [], "config.json"])
def test_builder_refuses_a_config_that_is_not_a_mapping(build: object, cfg: object) -> None:
    with pytest.raises(TypeError, match="cfg"):
        build("x", cfg)  # type: ignore[operator]


def test_bad_nemotron_layer_list_and_layer_count_name_the_key() -> None:
    cfg = {k: v for k, v in NEMOTRON_H_8B_CONFIG.items() if k != "hybrid_override_pattern"}
    with pytest.raises(ValueError, match="layers_block_type"):
        nemotron_h("x", {**cfg, "layers_block_type": [["mamba"], "attention"]})
    with pytest.raises(TypeError, match="num_hidden_layers"):
        nemotron_h("x", {**NEMOTRON_H_8B_CONFIG, "num_hidden_layers": "52"})


def test_figure_functions_refuse_what_is_not_a_geometry_or_dtypes() -> None:
    geom = GEOMS["nemotron-h-8b"]
    for call in (
        lambda: vllm_block(None),  # type: ignore[arg-type]
        lambda: figures("nemotron-h-8b", BF16),  # type: ignore[arg-type]
        lambda: sglang_state_dtypes(None),  # type: ignore[arg-type]
        lambda: vllm_state_dtypes(None),  # type: ignore[arg-type]
        lambda: engine_state_dtypes(None),  # type: ignore[arg-type]
    ):
        with pytest.raises(TypeError, match="geom"):
            call()
    with pytest.raises(TypeError, match="dtypes"):
        vllm_block(geom, dtypes="float32")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dtypes"):
        figures(geom, None)  # type: ignore[arg-type]


def _same_model(back: Geometry, want: Geometry) -> None:
    """Same layers and every model-wide fact the figures read, hence the same figures."""
    assert back.layers == want.layers
    assert (back.architecture, back.hidden, back.dtype) == (
        want.architecture,
        want.hidden,
        want.dtype,
    )
    assert back.mamba_chunk_size == want.mamba_chunk_size
    got, expect = vllm_block(back), vllm_block(want)
    # the dtype rule's wording may differ (transformers writes the default
    # mamba_ssm_cache_dtype float32 out), the dtypes and every size may not
    assert (got.dtypes.conv, got.dtypes.ssm) == (expect.dtypes.conv, expect.dtypes.ssm)
    assert replace(got, dtypes=expect.dtypes) == expect
    assert figures(back, sglang_state_dtypes(back)) == figures(want, sglang_state_dtypes(want))


def test_transformers_config_dicts_read_back_to_the_presets() -> None:
    # transformers 5 writes ``dtype`` (not ``torch_dtype``), NemotronH's
    # layers_block_type as linear_attention / full_attention / mlp, and
    # Qwen3Next's layout as ``layer_types`` (no full_attention_interval)
    import transformers

    for name, build in (("nemotron-h-tiny", nemotron_h), ("qwen3-next-tiny", qwen3_next)):
        preset = PRESETS[name]
        family = getattr(transformers, f"{preset.family}Config")
        arch = preset.geometry.architecture
        config = family(**preset.config_kwargs(), dtype="float32", architectures=[arch])
        _same_model(build(name, config.to_dict()), preset.geometry)


def test_transformers_config_dicts_read_back_to_the_published_models() -> None:
    import transformers

    for name, build, family, cfg in (
        ("nemotron-h-8b", nemotron_h, "NemotronHConfig", NEMOTRON_H_8B_CONFIG),
        ("qwen3-next-80b-a3b", qwen3_next, "Qwen3NextConfig", QWEN3_NEXT_80B_A3B_CONFIG),
        ("jamba-1.5-mini", jamba, "JambaConfig", JAMBA_15_MINI_CONFIG),
    ):
        config = getattr(transformers, family)(**cfg)
        _same_model(build(name, config.to_dict()), GEOMS[name])


def test_a_dtype_key_is_read_as_the_model_dtype() -> None:
    cfg = {k: v for k, v in NEMOTRON_H_8B_CONFIG.items() if k != "torch_dtype"}
    geom = nemotron_h("x", {**cfg, "dtype": "float32"})
    assert geom.dtype == "float32"
    assert figures(geom, BF16).kv_bytes_per_token == 4 * 2 * 8 * 128 * 4


def test_bad_dtype_settings_and_preset_fields_name_the_field() -> None:
    attn = (Attention(4, 2, 16),)
    with pytest.raises(TypeError, match="dtype_settings"):
        Geometry("x", "A", 64, attn, dtype_settings={"mamba_ssm_dtype": "float32"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="EnginePreset.family"):
        EnginePreset(["NemotronH"], PRESETS["nemotron-h-tiny"].geometry)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="EnginePreset.geometry"):
        EnginePreset("NemotronH", None)  # type: ignore[arg-type]
