"""Model profiles: bytes and FLOPs recomputed by hand from the config numbers."""

from __future__ import annotations

from math import ceil
from pathlib import Path

import pytest

from mambaradix.geometry.profile import PROFILES, ModelProfile, get_profile, profile_from_geometry
from mambaradix.policies import VLLM

REAL = ("nemotron-h-8b", "qwen3-next-80b-a3b", "jamba-1.5-mini")


# --------------------------------------------------------------------------- marconi-7b

D, N = 4096, 128


def marconi_forward(seq: int) -> int:
    """Marconi utils.py per-layer formulas summed over 4 attn / 28 MLP / 24 Mamba layers."""
    attn = 8 * seq * D**2 + 4 * seq**2 * D
    mlp = 16 * seq * D**2
    mamba = 12 * seq * D**2 + 16 * seq * D * N + 10 * seq * D
    return 4 * attn + 28 * mlp + 24 * mamba


def test_marconi_kv_bytes_per_token() -> None:
    # get_kvs_size(1, D) = 2 * 1 * 4096 * 2 = 16,384 per attention layer; 4 layers
    assert get_profile("marconi-7b").kv_bytes_per_token == 4 * 16_384 == 65_536


def test_marconi_state_bytes() -> None:
    # D*N*2 = 1,048,576; (2D + 2N)*4*2 = 8,448*8 = 67,584; per layer 1,116,160; 24 layers
    state = get_profile("marconi-7b").state_bytes
    assert state == 24 * (1_048_576 + 67_584) == 26_787_840
    assert state == pytest.approx(26.8e6, rel=0.01)


@pytest.mark.parametrize("seq", [1, 2, 3, 10, 1000])
def test_marconi_prefill_from_scratch_matches_formulas(seq: int) -> None:
    assert get_profile("marconi-7b").prefill_flops(0, seq) == float(marconi_forward(seq))


def test_marconi_hand_computed_one_token() -> None:
    # 4*(8D^2 + 4D) + 28*16D^2 + 24*(12D^2 + 16DN + 10D) at D=4096, N=128, L=1
    d2 = 4096 * 4096  # 16,777,216
    expected = 4 * (8 * d2 + 4 * 4096) + 28 * 16 * d2 + 24 * (12 * d2 + 16 * 4096 * 128 + 40_960)
    assert expected == 13_087_277_056
    assert get_profile("marconi-7b").prefill_flops(0, 1) == 13_087_277_056.0


def test_marconi_prefill_after_context_and_saved() -> None:
    p = get_profile("marconi-7b")
    assert p.prefill_flops(3, 2) == float(marconi_forward(5) - marconi_forward(3))
    # A hit of h tokens saves exactly the formulas evaluated at L = h, as Marconi credits it.
    for hit, total in [(1, 1), (3, 5), (100, 250)]:
        assert p.flops_saved(hit, total) == float(marconi_forward(hit))


# --------------------------------------------------------------------------- real models


def test_nemotron_h_8b_bytes() -> None:
    p = get_profile("nemotron-h-8b")
    # 4 '*' layers x (K+V) x 8 kv heads x 128 head_dim x 2 bytes (bf16)
    assert p.kv_bytes_per_token == 4 * 2 * 8 * 128 * 2 == 16_384
    # 24 'M' layers; conv_dim = 128*64 + 2*8*128 = 10,240, conv (10,240 x 3) bf16 = 61,440;
    # ssm (128 heads x 64 x 128) fp32 = 1,048,576 x 4 = 4,194,304
    assert p.state_bytes == 24 * (10_240 * 3 * 2 + 128 * 64 * 128 * 4) == 102_137_856


def test_nemotron_h_8b_linear_flops() -> None:
    # Mamba2: in_proj 4096 x (2*8192 + 2*8*128 + 128) = 4096 x 18,560, out_proj 8192 x 4096,
    #         conv 2*4*10,240, scan 6*128*64*128
    mamba = 2 * (4096 * 18_560 + 8192 * 4096) + 2 * 4 * 10_240 + 6 * 128 * 64 * 128
    # attention: q 4096x4096, k/v 4096x1024 each, o 4096x4096
    attn = 2 * (4096 * (4096 + 1024 + 1024) + 4096 * 4096)
    mlp = 2 * (2 * 4096 * 21_504)  # relu2: up + down
    p = get_profile("nemotron-h-8b")
    assert p.linear_flops_per_token == 24 * mamba + 4 * attn + 24 * mlp == 14_203_879_424
    assert p.attn_flops_per_pair == 4 * (4 * 32 * 128)


def test_qwen3_next_bytes() -> None:
    p = get_profile("qwen3-next-80b-a3b")
    # 48 layers / interval 4 = 12 full-attention layers x (K+V) x 2 kv heads x 256 x 2 bytes
    assert p.kv_bytes_per_token == 12 * 2 * 2 * 256 * 2 == 24_576
    # 36 GDN layers; conv_dim = 2*16*128 + 32*128 = 8,192, conv (8,192 x 3) bf16 = 49,152;
    # ssm (32 v-heads x 128 x 128) fp32 = 2,097,152
    assert p.state_bytes == 36 * (8_192 * 3 * 2 + 32 * 128 * 128 * 4) == 77_266_944


def test_qwen3_next_linear_flops() -> None:
    # GDN: in_proj_qkvz 2048 x 12,288, in_proj_ba 2048 x 64, out_proj 4096 x 2048,
    #      conv 2*4*8,192, scan 7*32*128*128
    gdn = 2 * (2048 * 12_288 + 2048 * 64 + 4096 * 2048) + 2 * 4 * 8_192 + 7 * 32 * 128 * 128
    # gated attention: q(+gate) 2048 x 8192, k/v 2048 x 512 each, o 4096 x 2048
    attn = 2 * (2048 * (8192 + 512 + 512) + 4096 * 2048)
    # MoE: router 2048 x 512, 10 experts + 1 shared SwiGLU of 3 x 2048 x 512, shared gate 2048
    moe = 2 * (2048 * 512 + 10 * 3 * 2048 * 512 + 3 * 2048 * 512 + 2048)
    p = get_profile("qwen3-next-80b-a3b")
    assert p.linear_flops_per_token == 36 * gdn + 12 * attn + 48 * moe == 6_636_896_256
    assert p.attn_flops_per_pair == 12 * (4 * 16 * 256)


def test_jamba_bytes() -> None:
    p = get_profile("jamba-1.5-mini")
    # attention at layers 4, 12, 20, 28: 4 x (K+V) x 8 kv heads x (4096/32 = 128) x 2 bytes
    assert p.kv_bytes_per_token == 4 * 2 * 8 * 128 * 2 == 16_384
    # 28 Mamba1 layers, d_inner = 8192: conv (8192 x 3) bf16 + ssm (8192 x 16) fp32
    assert p.state_bytes == 28 * (8192 * 3 * 2 + 8192 * 16 * 4) == 16_056_320


def test_jamba_linear_flops() -> None:
    # Mamba1: in_proj 4096 x 16,384, x_proj 8192 x (256 + 32), dt_proj 256 x 8192,
    #         out_proj 8192 x 4096, conv 2*4*8192, scan 6*8192*16
    mamba = (
        2 * (4096 * 16_384 + 8192 * 288 + 256 * 8192 + 8192 * 4096) + 2 * 4 * 8192 + 6 * 8192 * 16
    )
    attn = 2 * (4096 * (4096 + 1024 + 1024) + 4096 * 4096)
    mlp = 2 * 3 * 4096 * 14_336
    moe = 2 * (4096 * 16 + 2 * 3 * 4096 * 14_336)
    p = get_profile("jamba-1.5-mini")
    assert p.linear_flops_per_token == 28 * mamba + 4 * attn + 16 * mlp + 16 * moe
    assert p.attn_flops_per_pair == 4 * (4 * 32 * 128)


def test_real_causal_attention_term() -> None:
    # new tokens at positions c..c+n-1 see c+1..c+n keys: n*c + n(n+1)/2 pairs
    p = get_profile("nemotron-h-8b")
    c, n = 100, 7
    pairs = n * c + n * (n + 1) // 2
    expected = p.linear_flops_per_token * n + p.attn_flops_per_pair * pairs
    assert p.prefill_flops(c, n) == float(expected)


# --------------------------------------------------------------------------- vLLM


def test_vllm_blocks_of_the_profiles() -> None:
    # 16 * ceil(mamba page / (16 * attention page per token)), pages per layer (see
    # test_geometry for each written out): Nemotron-H fp32 SSM (vLLM's NemotronH hook),
    # Qwen3-Next bf16 SSM on a 64-token GDN grid, Jamba bf16, Marconi's own accounting.
    blocks = {n: get_profile(n).vllm_block_tokens for n in (*REAL, "marconi-7b")}
    assert blocks == {
        "nemotron-h-8b": 16 * ceil(4_255_744 / (16 * 4096)),
        "qwen3-next-80b-a3b": 64 * ceil(1_097_728 / (64 * 2048)),
        "jamba-1.5-mini": 16 * ceil(311_296 / (16 * 4096)),
        "marconi-7b": 16 * ceil(1_116_160 / (16 * 16_384)),
    }
    assert blocks == {
        "nemotron-h-8b": 1040,
        "qwen3-next-80b-a3b": 576,
        "jamba-1.5-mini": 80,
        "marconi-7b": 80,
    }
    p = get_profile("nemotron-h-8b")
    assert p.vllm_state_bytes == 24 * 1040 * 4096
    assert p.vllm_all_block_tokens == 1152
    assert p.vllm_state_dtypes is not None and p.vllm_state_dtypes.ssm == "float32"
    q = get_profile("qwen3-next-80b-a3b")
    assert q.vllm_state_bytes == 36 * 576 * 2048
    assert q.state_dtypes is not None and q.state_dtypes.ssm == "float32"  # SGLang's default
    assert q.vllm_state_dtypes is not None and q.vllm_state_dtypes.ssm == "bfloat16"


def test_vllm_policy_uses_the_profile_block() -> None:
    p = get_profile("nemotron-h-8b")
    for unit, units in ((1, 1040), (16, 65), (512, 3)):  # ceil(1040 / unit)
        assert VLLM.block_of(p, unit) == units


def test_hand_built_profile_gets_the_one_layer_pair_block() -> None:
    p = ModelProfile("x", "s", 1000, 20_000, 1, 1)
    # one attention layer of 1,000 bytes/token and one recurrent layer of 20,000 bytes
    assert p.vllm_block_tokens == 16 * ceil(20_000 / (16 * 1000)) == 32
    assert p.vllm_all_block_tokens == 32
    assert p.vllm_state_bytes == 32 * 1000
    given = ModelProfile("y", "s", 1000, 20_000, 1, 1, vllm_block_tokens=48)
    assert given.vllm_block_tokens == 48 and given.vllm_state_bytes == 48_000


def test_engine_preset_profiles() -> None:
    # float32 states and KV (the engine's model dtype); conv keeps all 4 kernel inputs
    n = get_profile("nemotron-h-tiny")
    assert n.kv_bytes_per_token == 1 * 2 * 2 * 16 * 4
    assert n.state_bytes == 2 * ((8 * 16 + 2 * 16) * 4 * 4 + 8 * 16 * 16 * 4)
    # vLLM on the same geometry: float32 everywhere, conv_kernel - 1 = 3 columns
    assert n.vllm_block_tokens == 16 * ceil((160 * 3 * 4 + 8 * 16 * 16 * 4) / (16 * 256))
    q = get_profile("qwen3-next-tiny")
    assert q.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4
    assert q.state_bytes == 2 * ((2 * 2 * 16 + 4 * 16) * 4 * 4 + 4 * 16 * 16 * 4)
    assert q.geometry is not None and q.geometry.count("gated_deltanet") == 2


def test_no_path_outside_the_repository() -> None:
    root = Path(__file__).resolve().parents[1]
    docs = [root / "README.md", root / "mkdocs.yml", *sorted((root / "docs").rglob("*.md"))]
    files = [*sorted((root / "src").rglob("*.py")), *docs]
    for path in files:
        text = path.read_text()
        assert "/work/" not in text, path
    for p in PROFILES.values():
        assert "/work/" not in p.source and "peers.md" not in p.source


# --------------------------------------------------------------------------- properties


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_monotone_and_superlinear(name: str) -> None:
    p = get_profile(name)
    assert p.prefill_flops(0, 0) == 0.0
    assert p.prefill_flops(5_000, 0) == 0.0
    lengths = [1, 2, 10, 100, 1_000, 10_000]
    costs = [p.prefill_flops(0, n) for n in lengths]
    assert costs == sorted(costs) and len(set(costs)) == len(costs)
    contexts = [0, 1, 100, 8_192, 100_000]
    per_token = [p.prefill_flops(c, 1) for c in contexts]
    assert per_token == sorted(per_token) and len(set(per_token)) == len(per_token)
    for n in (10, 1_000, 10_000):  # every profile has attention layers: superlinear
        assert p.prefill_flops(0, 2 * n) > 2 * p.prefill_flops(0, n)
    assert p.prefill_flops(8_192, 1) > p.prefill_flops(0, 1)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_flops_saved_identities(name: str) -> None:
    p = get_profile(name)
    for n in (0, 1, 17, 4_096, 65_536):
        assert p.flops_saved(0, n) == 0.0
        assert p.flops_saved(n, n) == p.prefill_flops(0, n)
    for hit, total in [(1, 10), (100, 1_000), (4_000, 8_192)]:
        assert p.flops_saved(hit, total) == p.prefill_flops(0, total) - p.prefill_flops(
            hit, total - hit
        )
        assert 0.0 < p.flops_saved(hit, total) < p.flops_saved(hit + 1, total)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_describe_and_source(name: str) -> None:
    p = get_profile(name)
    d = p.describe()
    assert d["kv_bytes_per_token"][0] == p.kv_bytes_per_token
    assert d["state_bytes"][0] == p.state_bytes
    assert d["flops_per_token_at_context_0"][0] == p.prefill_flops(0, 1)
    assert d["flops_per_token_at_context_8192"][0] == p.prefill_flops(8_192, 1)
    assert all(isinstance(f, str) and f for _, f in d.values())
    assert p.source and p.name == name


def test_real_profiles_cite_config_and_sglang() -> None:
    for name in REAL:
        src = get_profile(name).source
        assert "config.json" in src and "@" in src and "sglang" in src.lower()
    assert not get_profile("marconi-7b").causal
    assert all(get_profile(n).causal for n in REAL)


def test_marconi_state_versus_real_model_is_documented() -> None:
    doc = ModelProfile.__doc__ or ""
    assert "F(context + new) - F(context)" in doc
    from mambaradix.geometry import profile as models

    marconi_doc = models._marconi_7b.__doc__ or ""
    assert "expand" in marconi_doc and "get_mlp_flops" in marconi_doc
    assert "peers.md" not in marconi_doc


# --------------------------------------------------------------------------- errors


def test_get_profile_unknown_lists_names() -> None:
    with pytest.raises(KeyError) as info:
        get_profile("llama-3-8b")
    msg = str(info.value)
    assert "llama-3-8b" in msg
    for name in PROFILES:
        assert name in msg


def test_bad_arguments() -> None:
    p = get_profile("nemotron-h-8b")
    with pytest.raises(ValueError):
        p.prefill_flops(-1, 3)
    with pytest.raises(ValueError):
        p.prefill_flops(0, -3)
    with pytest.raises(ValueError):
        p.flops_saved(5, 4)
    with pytest.raises(TypeError):
        p.prefill_flops(1.5, 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        p.flops_saved(True, 3)
    with pytest.raises(ValueError):
        ModelProfile(
            name="x",
            source="s",
            kv_bytes_per_token=-1,
            state_bytes=0,
            linear_flops_per_token=0,
            attn_flops_per_pair=0,
        )


def test_profiles_are_frozen() -> None:
    p = get_profile("marconi-7b")
    with pytest.raises(AttributeError):
        p.state_bytes = 0  # type: ignore[misc]


def test_readme_model_table_is_what_bench_prints(capsys: pytest.CaptureFixture[str]) -> None:
    from bench_scripts import load_bench

    root = Path(__file__).resolve().parents[1]
    load_bench("model_profiles").main()
    rows = capsys.readouterr().out.strip().splitlines()
    assert len(rows) == 6
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    docs = "\n".join(p.read_text() for p in pages)
    for row in rows:
        assert row in docs


def test_profile_from_geometry_refuses_bad_arguments() -> None:
    geom = get_profile("jamba-1.5-mini").geometry
    with pytest.raises(TypeError, match="geom"):
        profile_from_geometry(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="state_dtypes"):
        profile_from_geometry(geom, "bfloat16")  # type: ignore[arg-type]


def test_hand_built_profile_refuses_a_causal_that_is_not_a_bool() -> None:
    with pytest.raises(TypeError, match="causal"):
        ModelProfile("x", "s", 1, 1, 1, 1, causal="no")  # type: ignore[arg-type]


def test_engine_preset_vllm_blocks_by_hand() -> None:
    # vLLM on the presets' float32 geometry: conv keeps conv_kernel - 1 = 3 columns.
    # nemotron-h-tiny: Mamba2 conv_dim 8*16 + 2*1*16 = 160, ssm 8x16x16; one attention
    # layer of 2 kv heads x 16 -> 2*2*16*4 = 256 bytes per token; 2 Mamba layers.
    n = get_profile("nemotron-h-tiny")
    n_page = 160 * 3 * 4 + 8 * 16 * 16 * 4  # 10,112
    assert n.vllm_block_tokens == 16 * ceil(n_page / (16 * 256)) == 48
    assert n.vllm_state_bytes == 2 * 48 * 256
    # vLLM 0.20.0 "all": c = lcm(chunk 16, 16) = 16, ceil(10,112 / 256) = 40 -> 48
    assert n.vllm_all_block_tokens == 16 * ceil(ceil(n_page / 256) / 16) == 48
    # qwen3-next-tiny: GDN conv_dim 2*2*16 + 4*16 = 128, ssm 4x16x16; attention page 256;
    # all-GDN recurrent layers -> the 64-token FlashInfer grid, lcm(16, 64) = 64
    q = get_profile("qwen3-next-tiny")
    q_page = 128 * 3 * 4 + 4 * 16 * 16 * 4  # 5,632
    assert q.vllm_block_tokens == 64 * ceil(q_page / (64 * 256)) == 64
    assert q.vllm_all_block_tokens == 64  # Qwen3-Next has no "all" mode: align
    assert q.vllm_state_bytes == 2 * 64 * 256
