"""The engine's tiny presets as geometries, and the transformers config
kwargs each geometry stands for.

A preset is a `Geometry` (its layers) plus the few config values that are
not geometry (vocabulary, init scale). `EnginePreset.config_kwargs` writes
the kwargs a transformers ``<family>Config`` takes; the engine builds its
models from them, so a replay profile of a preset (`geometry.profile`) and the
model the engine runs are one geometry.
"""

from __future__ import annotations

from dataclasses import dataclass

from mambaradix.geometry.layers import MLP, Attention, GatedDeltaNet, Layer, Mamba2, MoE
from mambaradix.geometry.model import Geometry

__all__ = ["PRESETS", "EnginePreset"]

_NEMOTRON_BLOCKS = {Mamba2: "mamba", Attention: "attention", MLP: "mlp", MoE: "moe"}


def _one(geom: Geometry, kind: type) -> Layer:
    """The single configuration all `kind` layers share (transformers configs
    hold one per kind); ValueError otherwise."""
    found = {x for x in geom.layers if isinstance(x, kind)}
    if len(found) != 1:
        raise ValueError(f"{geom.name}: needs exactly one {kind.__name__} configuration")
    return found.pop()


def _nemotron_h_kwargs(geom: Geometry) -> dict[str, object]:
    attn, mamba = _one(geom, Attention), _one(geom, Mamba2)
    assert isinstance(attn, Attention) and isinstance(mamba, Mamba2)
    if mamba.d_inner % geom.hidden:
        raise ValueError(f"{geom.name}: Mamba2 d_inner must be a multiple of hidden")
    out: dict[str, object] = {
        "hidden_size": geom.hidden,
        "num_attention_heads": attn.heads,
        "num_key_value_heads": attn.kv_heads,
        "head_dim": attn.head_dim,
        "layers_block_type": [_NEMOTRON_BLOCKS[type(x)] for x in geom.layers],
        "mamba_num_heads": mamba.heads,
        "mamba_head_dim": mamba.head_dim,
        "n_groups": mamba.n_groups,
        "ssm_state_size": mamba.state_size,
        "conv_kernel": mamba.conv_kernel,
        "expand": mamba.d_inner // geom.hidden,
        "chunk_size": geom.mamba_chunk_size,
    }
    if any(isinstance(x, MLP) for x in geom.layers):
        out["intermediate_size"] = _one(geom, MLP).intermediate  # type: ignore[union-attr]
    return out


def _qwen3_next_kwargs(geom: Geometry) -> dict[str, object]:
    attn, gdn, moe = _one(geom, Attention), _one(geom, GatedDeltaNet), _one(geom, MoE)
    assert isinstance(attn, Attention) and isinstance(gdn, GatedDeltaNet)
    assert isinstance(moe, MoE)
    mixers = geom.layers[0::2]
    if geom.layers[1::2] != (moe,) * len(mixers):
        raise ValueError(f"{geom.name}: Qwen3Next alternates a mixer and an MoE block")
    interval = next(i + 1 for i, x in enumerate(mixers) if x == attn)
    if any((x == attn) != ((i + 1) % interval == 0) for i, x in enumerate(mixers)):
        raise ValueError(f"{geom.name}: attention must sit at every full_attention_interval")
    return {
        "hidden_size": geom.hidden,
        "num_attention_heads": attn.heads,
        "num_key_value_heads": attn.kv_heads,
        "head_dim": attn.head_dim,
        "num_hidden_layers": len(mixers),
        "full_attention_interval": interval,
        "linear_num_value_heads": gdn.v_heads,
        "linear_num_key_heads": gdn.k_heads,
        "linear_key_head_dim": gdn.head_k_dim,
        "linear_value_head_dim": gdn.head_v_dim,
        "linear_conv_kernel_dim": gdn.conv_kernel,
        "num_experts": moe.experts,
        "num_experts_per_tok": moe.top_k,
        "moe_intermediate_size": moe.intermediate,
        "shared_expert_intermediate_size": moe.shared_intermediate,
    }


_WRITERS = {"NemotronH": _nemotron_h_kwargs, "Qwen3Next": _qwen3_next_kwargs}


@dataclass(frozen=True)
class EnginePreset:
    """A transformers family, a geometry, and the config values beyond it."""

    family: str
    geometry: Geometry
    extra: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.family, str) or self.family not in _WRITERS:
            raise ValueError(f"EnginePreset.family must be one of {sorted(_WRITERS)}")
        if not isinstance(self.geometry, Geometry):
            raise TypeError(f"EnginePreset.geometry must be a Geometry, got {self.geometry!r}")

    def config_kwargs(self) -> dict[str, object]:
        """Kwargs for ``transformers.<family>Config``."""
        return {**dict(self.extra), **_WRITERS[self.family](self.geometry)}


_EXTRA = (("vocab_size", 1024), ("initializer_range", 0.05), ("tie_word_embeddings", False))
_ENGINE = "mambaradix engine preset, built offline with seeded random weights; float32 states"
_TINY_ATTENTION = Attention(heads=4, kv_heads=2, head_dim=16)
_TINY_MAMBA = Mamba2(heads=8, head_dim=16, state_size=16, n_groups=1, conv_kernel=4)
_TINY_GDN = GatedDeltaNet(k_heads=2, v_heads=4, head_k_dim=16, head_v_dim=16, conv_kernel=4)
_TINY_MOE = MoE(experts=2, top_k=1, intermediate=64, shared_intermediate=64, shared_gate=True)
_TINY_GATED = Attention(heads=4, kv_heads=2, head_dim=16, gated_query=True)

PRESETS: dict[str, EnginePreset] = {
    "nemotron-h-tiny": EnginePreset(
        "NemotronH",
        Geometry(
            name="nemotron-h-tiny",
            architecture="NemotronHForCausalLM",
            hidden=64,
            layers=(_TINY_MAMBA, _TINY_ATTENTION, _TINY_MAMBA, MLP(128, gated=False)),
            dtype="float32",
            mamba_chunk_size=16,
            source=f"{_ENGINE}: NemotronH, Mamba2 + attention + relu2 MLP",
        ),
        _EXTRA,
    ),
    "qwen3-next-tiny": EnginePreset(
        "Qwen3Next",
        Geometry(
            name="qwen3-next-tiny",
            architecture="Qwen3NextForCausalLM",
            hidden=64,
            layers=(_TINY_GDN, _TINY_MOE, _TINY_GATED, _TINY_MOE) * 2,
            dtype="float32",
            source=f"{_ENGINE}: Qwen3Next, Gated DeltaNet + gated attention, MoE",
        ),
        # intermediate_size is the dense-MLP width; every tiny layer is MoE, so unused.
        (*_EXTRA, ("intermediate_size", 128)),
    ),
}
"""Engine preset name -> preset."""
