"""Tiny hybrid models from `transformers`, built offline with seeded random weights.

    build_model("nemotron-h-tiny", seed=0)   # NemotronH: Mamba2 + attention + MLP
    build_model("qwen3-next-tiny", seed=0)   # Qwen3Next: gated DeltaNet + attention (MoE)
    build_model("/path/to/checkpoint")       # any local `from_pretrained` directory

Random weights are the right oracle for a prefix cache: what is checked is that
cached and uncached runs give the same logits, not that the text is good.
"""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["PRESETS", "build_model"]

_COMMON: dict[str, Any] = {
    "vocab_size": 1024,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "initializer_range": 0.05,
    "tie_word_embeddings": False,
}

PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "nemotron-h-tiny": (
        "NemotronH",
        {
            **_COMMON,
            "layers_block_type": ["mamba", "attention", "mamba", "mlp"],
            "mamba_num_heads": 8,
            "mamba_head_dim": 16,
            "n_groups": 1,
            "ssm_state_size": 16,
            "conv_kernel": 4,
            "expand": 2,
            "chunk_size": 16,
        },
    ),
    "qwen3-next-tiny": (
        "Qwen3Next",
        {
            **_COMMON,
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
        },
    ),
}
"""Preset name -> (transformers model family, config kwargs)."""


def build_model(
    model: str,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    overrides: dict[str, Any] | None = None,
) -> Any:
    """A `...ForCausalLM` in eval mode: a preset built from its config with
    weights drawn under `torch.manual_seed(seed)` (the global RNG is left as
    it was), or a local checkpoint directory via `from_pretrained`.
    `overrides` updates a preset's config kwargs."""
    import transformers

    if model in PRESETS:
        family, kwargs = PRESETS[model]
        cfg = getattr(transformers, f"{family}Config")(**{**kwargs, **(overrides or {})})
        cls = getattr(transformers, f"{family}ForCausalLM")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = cls(cfg)
        net = net.to(dtype)
    elif os.path.isdir(model):
        net = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
    else:
        raise ValueError(
            f"unknown model {model!r}: use a preset ({', '.join(PRESETS)}) or a local directory"
        )
    net.eval()
    return net
