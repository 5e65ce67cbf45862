"""Geometries built from the models' published ``config.json`` files.

Builders read Hugging Face config dicts (the keys the model's transformers /
vLLM / SGLang code reads) and return a `Geometry`: `nemotron_h`,
`qwen3_next`, `jamba`. The published values are copied into the ``*_CONFIG``
dicts below, each with where it was read; `marconi_7b` is Marconi's 7B
layout as its released simulator accounts for it.

Config dicts as transformers 5 writes them (``config.to_dict()``: ``dtype``
for ``torch_dtype``, ``linear_attention`` / ``full_attention`` layer names)
read the same as the published files.

A bad config raises ValueError (missing key, value out of range) or
TypeError (wrong type), naming the key.
"""

from __future__ import annotations

from mambaradix.geometry.cfgread import (
    Config,
    cfg_int,
    cfg_str,
    cfg_types,
    check_cfg,
    geometry,
    per_head,
)
from mambaradix.geometry.layers import (
    MLP,
    Attention,
    GatedDeltaNet,
    Layer,
    Mamba1,
    Mamba2,
    MoE,
)
from mambaradix.geometry.model import Geometry

__all__ = [
    "JAMBA_15_MINI_CONFIG",
    "MARCONI_7B_CONFIG",
    "NEMOTRON_H_8B_CONFIG",
    "QWEN3_NEXT_80B_A3B_CONFIG",
    "SOURCES",
    "jamba",
    "marconi_7b",
    "nemotron_h",
    "published",
    "qwen3_next",
]

_int, _str, _geometry, _check_cfg = cfg_int, cfg_str, geometry, check_cfg


def nemotron_h(name: str, cfg: Config, source: str = "") -> Geometry:
    """NemotronH: one block per layer, ``M`` Mamba2, ``*`` attention, ``-`` MLP
    (relu2, not gated), ``E`` MoE (relu2 experts, a shared expert, an optional
    latent width); from ``hybrid_override_pattern`` or the transformers
    ``layers_block_type`` list. The Mamba2 width is ``mamba_num_heads *
    mamba_head_dim``, as transformers and vLLM build it (``expand`` is not read:
    Nemotron-Nano-9B-v2's 2 * 4480 is not its 128 * 80)."""
    _check_cfg(cfg)
    kinds = _nemotron_pattern(cfg)
    head_dim = _int(cfg, "attention_head_dim" if "attention_head_dim" in cfg else "head_dim")
    attn = Attention(_int(cfg, "num_attention_heads"), _int(cfg, "num_key_value_heads"), head_dim)
    mamba = Mamba2(
        heads=_int(cfg, "mamba_num_heads"),
        head_dim=_int(cfg, "mamba_head_dim"),
        state_size=_int(cfg, "ssm_state_size"),
        n_groups=_int(cfg, "n_groups"),
        conv_kernel=_int(cfg, "conv_kernel", minimum=2),
    )
    blocks: dict[str, Layer] = {"M": mamba, "*": attn}
    if "-" in kinds:
        blocks["-"] = MLP(_int(cfg, "intermediate_size"), gated=False)
    if "E" in kinds:
        blocks["E"] = MoE(
            experts=_int(cfg, "n_routed_experts"),
            top_k=_int(cfg, "num_experts_per_tok"),
            intermediate=_int(cfg, "moe_intermediate_size"),
            shared_intermediate=_int(cfg, "moe_shared_expert_intermediate_size", 0, minimum=0),
            gated=False,
            latent=_int(cfg, "moe_latent_size", 0, minimum=0),
        )
    layers = tuple(blocks[k] for k in kinds)
    return _geometry(name, cfg, "NemotronHForCausalLM", layers, source)


def _nemotron_pattern(cfg: Config) -> str:
    # transformers 5 names the mixers linear_attention / full_attention
    names = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
    names |= {"linear_attention": "M", "full_attention": "*"}
    if cfg.get("layers_block_type") is not None:
        pattern = cfg_types(cfg, ["layers_block_type"], names, None)
    else:
        pattern = _str(cfg, "hybrid_override_pattern")
        if set(pattern) - set(names.values()):
            raise ValueError(f"config key 'hybrid_override_pattern' has unknown kinds: {pattern!r}")
    if not pattern:
        raise ValueError("config key 'hybrid_override_pattern' / 'layers_block_type' is empty")
    layers = _int(cfg, "num_hidden_layers", len(pattern))
    if layers != len(pattern):
        raise ValueError(
            f"config key 'num_hidden_layers' ({layers}) must equal the pattern length "
            f"({len(pattern)})"
        )
    return pattern


def qwen3_next(name: str, cfg: Config, source: str = "") -> Geometry:
    """Qwen3-Next: each decoder layer is a mixer (gated attention iff
    ``(i + 1) % full_attention_interval == 0``, or transformers 5's
    ``layer_types[i] == "full_attention"``; else Gated DeltaNet) and an
    FFN (MoE iff ``num_experts > 0``, ``(i + 1) % decoder_sparse_step == 0``
    and i not in ``mlp_only_layers``; else a SwiGLU MLP)."""
    _check_cfg(cfg)
    n = _int(cfg, "num_hidden_layers")
    attn_at = qwen_attention_layers(cfg, n)
    attn = Attention(
        _int(cfg, "num_attention_heads"),
        _int(cfg, "num_key_value_heads"),
        _int(cfg, "head_dim"),
        gated_query=True,
    )
    gdn = GatedDeltaNet(
        k_heads=_int(cfg, "linear_num_key_heads"),
        v_heads=_int(cfg, "linear_num_value_heads"),
        head_k_dim=_int(cfg, "linear_key_head_dim"),
        head_v_dim=_int(cfg, "linear_value_head_dim"),
        conv_kernel=_int(cfg, "linear_conv_kernel_dim", minimum=2),
    )
    moe_at = _qwen_moe_layers(cfg, n)
    layers: list[Layer] = []
    for i in range(n):
        layers.append(attn if i in attn_at else gdn)
        layers.append(qwen_moe(cfg) if i in moe_at else MLP(_int(cfg, "intermediate_size"), True))
    return _geometry(name, cfg, "Qwen3NextForCausalLM", layers, source)


def qwen_attention_layers(cfg: Config, n: int) -> set[int]:
    """Layers (of `n`) with full attention: transformers 5's ``layer_types``
    list when the config has one, else every ``full_attention_interval``-th."""
    if cfg.get("layer_types") is None:
        interval = _int(cfg, "full_attention_interval")
        return {i for i in range(n) if (i + 1) % interval == 0}
    names = {"full_attention": "*", "linear_attention": "L"}
    kinds = cfg_types(cfg, ["layer_types"], names, n)
    return {i for i, k in enumerate(kinds) if k == "*"}


def _qwen_moe_layers(cfg: Config, n: int) -> set[int]:
    step = _int(cfg, "decoder_sparse_step", 1)
    dense = cfg.get("mlp_only_layers") or []
    if not isinstance(dense, (list, tuple)) or not all(isinstance(i, int) for i in dense):
        raise TypeError(f"config key 'mlp_only_layers' must be a list of ints, got {dense!r}")
    if _int(cfg, "num_experts", 0, minimum=0) == 0:
        return set()
    return {i for i in range(n) if (i + 1) % step == 0 and i not in dense}


def qwen_moe(cfg: Config) -> MoE:
    """Qwen's MoE block: routed SwiGLU experts and a sigmoid-gated shared expert."""
    shared = _int(cfg, "shared_expert_intermediate_size", 0, minimum=0)
    return MoE(
        experts=_int(cfg, "num_experts"),
        top_k=_int(cfg, "num_experts_per_tok"),
        intermediate=_int(cfg, "moe_intermediate_size"),
        shared_intermediate=shared,
        shared_gate=shared > 0,
    )


def jamba(name: str, cfg: Config, source: str = "") -> Geometry:
    """Jamba: decoder layer i mixes with attention iff ``i % attn_layer_period ==
    attn_layer_offset`` (else Mamba1) and its FFN is MoE iff ``i %
    expert_layer_period == expert_layer_offset`` (else a SwiGLU MLP)."""
    _check_cfg(cfg)
    hidden, n = _int(cfg, "hidden_size"), _int(cfg, "num_hidden_layers")
    heads = _int(cfg, "num_attention_heads")
    attn = Attention(
        heads, _int(cfg, "num_key_value_heads"), per_head(hidden, heads, "hidden_size")
    )
    mamba = Mamba1(
        d_inner=_int(cfg, "mamba_expand") * hidden,
        state_size=_int(cfg, "mamba_d_state"),
        conv_kernel=_int(cfg, "mamba_d_conv", minimum=2),
        dt_rank=_int(cfg, "mamba_dt_rank"),
    )
    mlp = MLP(_int(cfg, "intermediate_size"), gated=True)
    moe = MoE(_int(cfg, "num_experts"), _int(cfg, "num_experts_per_tok"), mlp.intermediate)
    a_per, a_off = _int(cfg, "attn_layer_period"), _int(cfg, "attn_layer_offset", minimum=0)
    e_per, e_off = _int(cfg, "expert_layer_period"), _int(cfg, "expert_layer_offset", minimum=0)
    layers: list[Layer] = []
    for i in range(n):
        layers.append(attn if i % a_per == a_off else mamba)
        layers.append(moe if i % e_per == e_off else mlp)
    return _geometry(name, cfg, "JambaForCausalLM", layers, source)


def marconi_7b() -> Geometry:
    """Marconi's 7B Attention-Mamba2 hybrid, to be costed by Marconi's formulas.

    4 full multi-head attention layers (K and V of width D), 24 Mamba2 layers
    (expand 2 and one B/C group, as Marconi's conv-state term ``2D + 2N``
    implies) and 28 non-gated 4D MLPs, in fp16. Marconi's accounting does not
    depend on the order of the layers; the attention layers are spread evenly.
    """
    c = MARCONI_7B_CONFIG
    d, n, expand = _int(c, "d_model"), _int(c, "d_state"), _int(c, "expand")
    attn = Attention(heads=d // 128, kv_heads=d // 128, head_dim=128)
    mamba = Mamba2(expand * d // 64, 64, n, 1, _int(c, "conv_kernel", minimum=2))
    mlp = MLP(4 * d, gated=False)
    counts = {k: _int(c, k) for k in ("attention_layers", "ssm_layers", "mlp_layers")}
    layers: list[Layer] = [mamba] * counts["ssm_layers"]
    layers += [mlp] * counts["mlp_layers"]
    for k in range(counts["attention_layers"]):
        layers.insert((k + 1) * len(layers) // counts["attention_layers"], attn)
    return Geometry(
        name="marconi-7b",
        architecture="marconi-simulator",
        hidden=d,
        layers=tuple(layers),
        dtype="float16",
        accounting="marconi",
        source=SOURCES["marconi-7b"],
    )


# ---------------------------------------------------------------------------
# Published config values (copied; the keys the models' code reads)
# ---------------------------------------------------------------------------

NEMOTRON_H_8B_CONFIG: dict[str, object] = {
    "architectures": ["NemotronHForCausalLM"],
    "torch_dtype": "bfloat16",
    "num_hidden_layers": 52,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "attention_head_dim": 128,
    "mamba_num_heads": 128,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
    "expand": 2,
    "chunk_size": 128,
    "intermediate_size": 21504,  # relu2 MLP, not gated (mlp_hidden_act "relu2")
}

QWEN3_NEXT_80B_A3B_CONFIG: dict[str, object] = {
    "architectures": ["Qwen3NextForCausalLM"],
    "torch_dtype": "bfloat16",
    "num_hidden_layers": 48,
    "full_attention_interval": 4,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}

JAMBA_15_MINI_CONFIG: dict[str, object] = {
    "architectures": ["JambaForCausalLM"],
    "torch_dtype": "bfloat16",
    "num_hidden_layers": 32,
    "attn_layer_period": 8,
    "attn_layer_offset": 4,
    "expert_layer_period": 2,
    "expert_layer_offset": 1,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,  # SwiGLU (gate, up, down) for the dense MLP and each expert
    "num_experts": 16,
    "num_experts_per_tok": 2,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_dt_rank": 256,
}

MARCONI_7B_CONFIG: dict[str, object] = {
    "d_model": 4096,
    "d_state": 128,
    "attention_layers": 4,
    "ssm_layers": 24,
    "mlp_layers": 28,
    "conv_kernel": 4,
    "expand": 2,
}

SOURCES: dict[str, str] = {
    "nemotron-h-8b": (
        "nvidia/Nemotron-H-8B-Base-8K config.json "
        "(https://huggingface.co/nvidia/Nemotron-H-8B-Base-8K/blob/main/config.json), values as "
        "transcribed in NVIDIA-NeMo/Megatron-Bridge @ 03c781b8662d87b0522d402f2bcbb30bc928f9c9 "
        "tests/unit_tests/models/nemotronh/test_nemotron_h_bridge.py (fixture "
        "nemotronh_8b_config_dict): num_hidden_layers 52, hybrid_override_pattern "
        "(24 M, 4 *, 24 -), hidden_size 4096, num_attention_heads 32, num_key_value_heads 8, "
        "attention_head_dim 128, mamba_num_heads 128, mamba_head_dim 64, ssm_state_size 128, "
        "n_groups 8, conv_kernel 4, expand 2, chunk_size 128, intermediate_size 21504 "
        "(relu2, no gate), torch_dtype bfloat16, no mamba_ssm_dtype / mamba_ssm_cache_dtype."
    ),
    "qwen3-next-80b-a3b": (
        "Qwen/Qwen3-Next-80B-A3B-Instruct config.json "
        "(https://huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct/blob/main/config.json), "
        "values as transcribed in NVIDIA-NeMo/Megatron-Bridge @ "
        "00d5e5f66f99fb4ae1749c437667b868b31b68bf "
        "tests/unit_tests/models/qwen/test_qwen3_next_bridge.py (fixture "
        "qwen3_next_80b_a3b_config_dict): num_hidden_layers 48, full_attention_interval 4 "
        "(layer i is full attention iff (i+1) % 4 == 0: 12 attention, 36 Gated DeltaNet), "
        "hidden_size 2048, num_attention_heads 16, num_key_value_heads 2, head_dim 256, "
        "linear_num_key_heads 16, linear_num_value_heads 32, linear_key_head_dim 128, "
        "linear_value_head_dim 128, linear_conv_kernel_dim 4, num_experts 512, "
        "num_experts_per_tok 10, moe_intermediate_size 512, shared_expert_intermediate_size 512, "
        "decoder_sparse_step 1, mlp_only_layers [], torch_dtype bfloat16, no mamba_ssm_dtype. "
        "Gated attention (q_proj emits query and output gate, 2*heads*head_dim) per the "
        "transformers Qwen3NextAttention / Megatron-Bridge attention_output_gate=True. "
        "The MTP head (speculative decoding only) is not counted."
    ),
    "jamba-1.5-mini": (
        "ai21labs/AI21-Jamba-1.5-Mini config.json "
        "(https://huggingface.co/ai21labs/AI21-Jamba-1.5-Mini/blob/main/config.json), values as "
        "transcribed in sdpython/experimental-experiment @ "
        "04097e3040047505e7cac0c2c9040ff294fdd980 "
        "experimental_experiment/torch_models/llm_model_helper.py (get_ai21_jamba_15_mini): "
        "num_hidden_layers 32, attn_layer_period 8 / offset 4 (attention at layers 4, 12, 20, "
        "28), expert_layer_period 2 / offset 1 (16 MoE layers, 16 dense), hidden_size 4096, "
        "num_attention_heads 32, num_key_value_heads 8 (head_dim 4096/32 = 128), "
        "intermediate_size 14336 (SwiGLU), num_experts 16, num_experts_per_tok 2, "
        "mamba_d_state 16, mamba_d_conv 4, mamba_expand 2, mamba_dt_rank 256 (Mamba1), "
        "torch_dtype bfloat16. Same layout in ai21labs/Jamba-v0.1 config.json. Also the model "
        "whose profiled TTFT Marconi's simulator uses (github.com/ruipeterpan/marconi "
        "data/ttft_AI21-Jamba-1.5-Mini.pickle)."
    ),
    "marconi-7b": (
        "Marconi (Pan et al., MLSys'25, arXiv 2411.19379) released simulator, "
        "github.com/ruipeterpan/marconi utils.py: get_attn_flops 8*L*D^2 + 4*L^2*D, "
        "get_mlp_flops 16*L*D^2, get_mamba1_flops 12*L*D^2 + 16*L*D*N + 10*L*D (camera-ready "
        "version; the submission used 10*L), get_kvs_size 2*L*D*2, get_mamba_state_size "
        "D*N*2 + (expand*D + 2*N)*conv_kernel*2; model layout 4 attention / 24 SSM / 28 MLP, "
        "D = 4096, N = 128, fp16 (paper section 5, NVIDIA's Attention-Mamba2 hybrid, "
        "arXiv 2406.07887); eviction scoring in radix_cache_hybrid.py."
    ),
}
"""Where each published geometry's numbers were read."""

_BUILDERS = {
    "nemotron-h-8b": (nemotron_h, NEMOTRON_H_8B_CONFIG),
    "qwen3-next-80b-a3b": (qwen3_next, QWEN3_NEXT_80B_A3B_CONFIG),
    "jamba-1.5-mini": (jamba, JAMBA_15_MINI_CONFIG),
}


def published() -> dict[str, Geometry]:
    """The published models' geometries by profile name (Marconi's included)."""
    out = {name: build(name, cfg, SOURCES[name]) for name, (build, cfg) in _BUILDERS.items()}
    out["marconi-7b"] = marconi_7b()
    return out
