"""Per-layer model geometry: the single source of every model figure.

Standard library only. A model is a `Geometry`, a list of layers (`layers`:
attention, Mamba2, Mamba1, Gated DeltaNet, dense MLP, MoE) built from its
published config (`configs`) or an engine preset (`presets`). From it come
KV bytes per token, bytes per state checkpoint under an engine's dtype
convention, prefill FLOPs and Marconi's accounting (`derive`), and vLLM's
unified block (`vllm`). `profile` reduces a model to what the policies and the
replay need (`ModelProfile`, `get_profile`).
"""

from __future__ import annotations

from mambaradix.geometry.configs import published
from mambaradix.geometry.derive import (
    Figures,
    LayerCost,
    StateDtypes,
    engine_state_dtypes,
    figures,
    layer_cost,
    sglang_state_dtypes,
)
from mambaradix.geometry.layers import (
    DTYPE_BYTES,
    MLP,
    Attention,
    GatedDeltaNet,
    Layer,
    Mamba1,
    Mamba2,
    MoE,
)
from mambaradix.geometry.model import Geometry
from mambaradix.geometry.presets import PRESETS, EnginePreset
from mambaradix.geometry.vllm import VllmBlock, vllm_block, vllm_state_dtypes

__all__ = [
    "DTYPE_BYTES",
    "MLP",
    "PRESETS",
    "Attention",
    "EnginePreset",
    "Figures",
    "GatedDeltaNet",
    "Geometry",
    "Layer",
    "LayerCost",
    "Mamba1",
    "Mamba2",
    "MoE",
    "StateDtypes",
    "VllmBlock",
    "figures",
    "layer_cost",
    "engine_state_dtypes",
    "published",
    "sglang_state_dtypes",
    "vllm_block",
    "vllm_state_dtypes",
]
