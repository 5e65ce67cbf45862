"""One config per hybrid family, as transformers 5.24.0 writes it.

`CONFIGS` holds each family's config class and keyword arguments; `write`
saves them with ``save_pretrained`` (the exact ``config.json`` layout a user
has). The files under ``tests/data/hf_configs/`` are that output, committed so
that the default test tier needs no transformers import; a slow test
(`test_model_configs.py`) writes them again and checks they are identical.

Regenerate: ``PYTHONPATH=src python tests/hf_configs.py``.

Where a config is a published checkpoint, ``SOURCES`` says where its values
were read; the others are illustrative layouts of the family (transformers'
defaults with a hybrid layer list), which is all the arithmetic needs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data" / "hf_configs"

NANO_9B_V2_PATTERN = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"

CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "Nemotron-Nano-9B-v2": (
        "NemotronHConfig",
        {
            "architectures": ["NemotronHForCausalLM"],
            "dtype": "bfloat16",
            "hybrid_override_pattern": NANO_9B_V2_PATTERN,
            "num_hidden_layers": 56,
            "hidden_size": 4480,
            "intermediate_size": 15680,
            "num_attention_heads": 40,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "mamba_num_heads": 128,
            "mamba_head_dim": 80,
            "ssm_state_size": 128,
            "n_groups": 8,
            "conv_kernel": 4,
            "expand": 2,
            "chunk_size": 128,
            "vocab_size": 131072,
        },
    ),
    "Falcon-H1-Tiny-90M": (
        "FalconH1Config",
        {
            "architectures": ["FalconH1ForCausalLM"],
            "dtype": "bfloat16",
            "hidden_size": 512,
            "intermediate_size": 768,
            "num_hidden_layers": 24,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "mamba_d_ssm": 768,
            "mamba_n_heads": 24,
            "mamba_d_head": 32,
            "mamba_n_groups": 1,
            "mamba_d_state": 64,
            "mamba_d_conv": 4,
            "vocab_size": 32768,
        },
    ),
    "granite-4.0-h-small": (
        "GraniteMoeHybridConfig",
        {
            "architectures": ["GraniteMoeHybridForCausalLM"],
            "dtype": "bfloat16",
            "hidden_size": 4096,
            "num_hidden_layers": 40,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "num_local_experts": 72,
            "num_experts_per_tok": 10,
            "shared_intermediate_size": 1536,
            "intermediate_size": 768,
            "mamba_d_state": 128,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "mamba_n_heads": 128,
            "mamba_d_head": 64,
            "mamba_n_groups": 1,
            "layer_types": ["attention" if i % 10 == 5 else "mamba" for i in range(40)],
            "vocab_size": 100352,
        },
    ),
    "bamba-9b": ("BambaConfig", {"dtype": "bfloat16", "attn_layer_indices": [9, 18, 27]}),
    "jamba-1.5-mini": (
        "JambaConfig",
        {
            "architectures": ["JambaForCausalLM"],
            "dtype": "bfloat16",
            "num_hidden_layers": 32,
            "attn_layer_period": 8,
            "attn_layer_offset": 4,
            "expert_layer_period": 2,
            "expert_layer_offset": 1,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 14336,
            "num_experts": 16,
            "num_experts_per_tok": 2,
            "mamba_d_state": 16,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "mamba_dt_rank": 256,
        },
    ),
    "zamba2-2.7b": ("Zamba2Config", {"dtype": "bfloat16", "n_mamba_heads": 80}),
    "lfm2-1.2b": (
        "Lfm2Config",
        {
            "dtype": "bfloat16",
            "hidden_size": 2048,
            "num_hidden_layers": 16,
            "full_attn_idxs": [2, 5, 8, 10, 12, 14],
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 12288,
            "block_ffn_dim_multiplier": 1.0,
            "block_multiple_of": 256,
        },
    ),
    "lfm2-8b-a1b": (
        "Lfm2MoeConfig",
        {"dtype": "bfloat16", "layer_types": (["conv", "conv", "full_attention"] * 11)[:32]},
    ),
    "qwen3-next-80b-a3b": (
        "Qwen3NextConfig",
        {"architectures": ["Qwen3NextForCausalLM"], "dtype": "bfloat16"},
    ),
    "qwen3.5-9b": ("Qwen3_5Config", {"dtype": "bfloat16"}),
    "qwen3.5-35b-a3b": ("Qwen3_5MoeConfig", {"dtype": "bfloat16"}),
    "olmo-hybrid-7b": ("OlmoHybridConfig", {"dtype": "bfloat16"}),
}
"""Directory name -> (transformers config class, its keyword arguments)."""

SOURCES = {
    "Nemotron-Nano-9B-v2": "nvidia/NVIDIA-Nemotron-Nano-9B-v2 config.json, as transcribed in "
    "NVIDIA-NeMo/Megatron-Bridge tests (NemotronNano9Bv2Provider: 56 layers, hidden 4480, "
    "ffn 15680, 40 heads, 8 query groups, kv_channels 128, 128 Mamba heads of 80, state 128, "
    "8 groups, the pattern above)",
    "Falcon-H1-Tiny-90M": "tiiuae/Falcon-H1-Tiny-90M-Instruct config.json, as transcribed in "
    "two public converters that agree (hidden 512, 24 layers, 8 heads, 2 KV heads of 64, "
    "d_ssm 768 in 24 heads of 32, state 64, 1 group, conv 4, intermediate 768)",
    "granite-4.0-h-small": "ibm-granite/granite-4.0-h-small config.json fields as transcribed "
    "in a public sizing guide (hidden 4096, 40 layers of which 4 attention, 32 heads, 8 KV "
    "heads, 72 experts top 10 of 768, shared 1536, state 128, conv 4, expand 2); the "
    "attention positions, 128 Mamba heads and 1 group are illustrative",
    "jamba-1.5-mini": "mambaradix.geometry.configs.JAMBA_15_MINI_CONFIG",
    "qwen3-next-80b-a3b": "transformers' Qwen3NextConfig defaults = "
    "mambaradix.geometry.configs.QWEN3_NEXT_80B_A3B_CONFIG (Qwen3-Next-80B-A3B)",
}


def write(root: Path = DATA) -> list[Path]:
    """``save_pretrained`` of every config into `root`/<name>/config.json."""
    import transformers

    out = []
    for name, (cls, kwargs) in CONFIGS.items():
        config = getattr(transformers, cls)(**kwargs)
        config.save_pretrained(root / name)
        out.append(root / name / "config.json")
    return out


if __name__ == "__main__":
    for path in write(Path(sys.argv[1]) if len(sys.argv) > 1 else DATA):
        print(path)
