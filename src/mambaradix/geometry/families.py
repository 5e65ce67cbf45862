"""Geometries of the hybrid families beyond `configs`' three, from their config dicts.

Each builder reads the keys its transformers 5.24.0 model reads
(``transformers/models/<family>/modeling_<family>.py``) and returns the layers
in forward order; the shapes below are the ones those modules allocate:

* `falcon_h1`: every decoder layer runs attention and a Mamba2 mixer in
  parallel, then a SwiGLU MLP. Mamba2 width ``mamba_d_ssm`` (else
  ``mamba_expand * hidden``) in ``mamba_n_heads`` heads of ``mamba_d_head``.
* `granite_moe_hybrid`: ``layer_types`` (or ``layers_block_type``) mamba /
  attention; each layer's FFN is a SwiGLU MoE of ``num_local_experts`` plus
  the shared SwiGLU MLP of ``shared_intermediate_size`` (the MLP alone when
  there are no experts). Mamba2 width ``mamba_expand * hidden``.
* `bamba`: attention at ``attn_layer_indices``, else Mamba2 (as Granite);
  a SwiGLU MLP after each.
* `zamba2`: ``layers_block_type`` mamba / hybrid; a hybrid layer runs the
  shared transformer block (attention over the hidden state concatenated with
  the embeddings, ``2 * hidden`` wide, its own KV per invocation; a SwiGLU
  MLP) before its Mamba2 mixer. The hybrid layer's ``hidden x hidden``
  linear and the optional LoRA adapters are not counted (FLOPs only).
* `lfm2` / `lfm2_moe`: ``layer_types`` conv / full_attention; conv layers
  are `ShortConv` (``conv_L_cache`` taps over ``hidden``). LFM2's SwiGLU MLP
  width is adjusted as ``Lfm2MLP`` does; LFM2-MoE's first
  ``num_dense_layers`` FFNs are dense, the rest MoE.
* `qwen3_5`: Qwen3-Next's mixers (Gated DeltaNet, gated attention) with a
  dense SwiGLU MLP (``qwen3_5``) or Qwen's MoE (``qwen3_5_moe``) after each.
* `olmo_hybrid`: ``layer_types``; Gated DeltaNet and plain attention, a
  SwiGLU MLP after each.

Attention's head size is the config's ``head_dim`` where the model reads one,
else ``hidden_size / num_attention_heads``.
"""

from __future__ import annotations

from mambaradix.geometry.cfgread import Config, cfg_int, cfg_types, check_cfg, geometry, per_head
from mambaradix.geometry.configs import qwen_attention_layers, qwen_moe
from mambaradix.geometry.layers import (
    MLP,
    Attention,
    GatedDeltaNet,
    Layer,
    Mamba2,
    MoE,
    ShortConv,
)
from mambaradix.geometry.model import Geometry

__all__ = [
    "bamba",
    "falcon_h1",
    "granite_moe_hybrid",
    "lfm2",
    "lfm2_moe",
    "olmo_hybrid",
    "qwen3_5",
    "zamba2",
]

_MIXERS = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*"}


def _attention(cfg: Config, gated: bool = False) -> Attention:
    heads = cfg_int(cfg, "num_attention_heads")
    hidden = cfg_int(cfg, "hidden_size")
    if cfg.get("head_dim") is None:
        head_dim = per_head(hidden, heads, "hidden_size")
    else:
        head_dim = cfg_int(cfg, "head_dim")
    return Attention(heads, cfg_int(cfg, "num_key_value_heads", heads), head_dim, gated)


def _mamba2(cfg: Config, width: int, heads_key: str, head_key: str, groups_key: str) -> Mamba2:
    """A Mamba2 mixer of `width` channels; ValueError naming the head size when
    heads * head size is not that width (the model could not be built)."""
    heads = cfg_int(cfg, heads_key)
    head = cfg.get(head_key)
    head_dim = width // heads if head in (None, "auto") else cfg_int(cfg, head_key)
    if heads * head_dim != width:
        raise ValueError(
            f"config key {head_key!r}: {heads_key} * {head_key} ({heads} * {head_dim}) must "
            f"equal the Mamba2 width ({width})"
        )
    return Mamba2(
        heads=heads,
        head_dim=head_dim,
        state_size=cfg_int(cfg, "mamba_d_state"),
        n_groups=cfg_int(cfg, groups_key),
        conv_kernel=cfg_int(cfg, "mamba_d_conv", minimum=2),
    )


def _expand_width(cfg: Config) -> int:
    return cfg_int(cfg, "mamba_expand") * cfg_int(cfg, "hidden_size")


def _gdn(cfg: Config) -> GatedDeltaNet:
    return GatedDeltaNet(
        k_heads=cfg_int(cfg, "linear_num_key_heads"),
        v_heads=cfg_int(cfg, "linear_num_value_heads"),
        head_k_dim=cfg_int(cfg, "linear_key_head_dim"),
        head_v_dim=cfg_int(cfg, "linear_value_head_dim"),
        conv_kernel=cfg_int(cfg, "linear_conv_kernel_dim", minimum=2),
    )


def _swiglu(cfg: Config, key: str = "intermediate_size") -> MLP:
    return MLP(cfg_int(cfg, key), gated=True)


def falcon_h1(name: str, cfg: Config, source: str = "") -> Geometry:
    check_cfg(cfg)
    n = cfg_int(cfg, "num_hidden_layers")
    width = cfg_int(cfg, "mamba_d_ssm", _expand_width(cfg))
    mamba = _mamba2(cfg, width, "mamba_n_heads", "mamba_d_head", "mamba_n_groups")
    layers: list[Layer] = [_attention(cfg), mamba, _swiglu(cfg)] * n
    return geometry(name, cfg, "FalconH1ForCausalLM", layers, source)


def granite_moe_hybrid(name: str, cfg: Config, source: str = "") -> Geometry:
    check_cfg(cfg)
    n = cfg_int(cfg, "num_hidden_layers")
    kinds = cfg_types(cfg, ["layer_types", "layers_block_type"], _MIXERS, n)
    mamba = _mamba2(cfg, _expand_width(cfg), "mamba_n_heads", "mamba_d_head", "mamba_n_groups")
    experts = cfg_int(cfg, "num_local_experts", 0, minimum=0)
    shared = cfg_int(cfg, "shared_intermediate_size")
    ffn: Layer = MLP(shared, gated=True)
    if experts:
        top_k = cfg_int(cfg, "num_experts_per_tok")
        ffn = MoE(experts, top_k, cfg_int(cfg, "intermediate_size"), shared_intermediate=shared)
    attn = _attention(cfg)
    layers = [x for k in kinds for x in ((mamba if k == "M" else attn), ffn)]
    return geometry(name, cfg, "GraniteMoeHybridForCausalLM", layers, source)


def bamba(name: str, cfg: Config, source: str = "") -> Geometry:
    check_cfg(cfg)
    n = cfg_int(cfg, "num_hidden_layers")
    at = cfg.get("attn_layer_indices") or []
    if not isinstance(at, (list, tuple)) or any(
        isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n for i in at
    ):
        raise ValueError(f"config key 'attn_layer_indices' must list layers 0..{n - 1}, got {at!r}")
    mamba = _mamba2(cfg, _expand_width(cfg), "mamba_n_heads", "mamba_d_head", "mamba_n_groups")
    attn, mlp = _attention(cfg), _swiglu(cfg)
    layers = [x for i in range(n) for x in ((attn if i in at else mamba), mlp)]
    return geometry(name, cfg, "BambaForCausalLM", layers, source)


def zamba2(name: str, cfg: Config, source: str = "") -> Geometry:
    check_cfg(cfg)
    hidden = cfg_int(cfg, "hidden_size")
    names = {"mamba": "M", "linear_attention": "M", "hybrid": "H"}
    n = cfg_int(cfg, "num_hidden_layers", 0, minimum=0) or None
    kinds = cfg_types(cfg, ["layers_block_type"], names, n)
    heads = cfg_int(cfg, "num_attention_heads")
    attn = Attention(
        heads,
        cfg_int(cfg, "num_key_value_heads", heads),
        cfg_int(cfg, "attention_head_dim", per_head(2 * hidden, heads, "2*hidden_size")),
        in_dim=2 * hidden,
    )
    mamba = _mamba2(cfg, _expand_width(cfg), "n_mamba_heads", "mamba_headdim", "mamba_ngroups")
    mlp = _swiglu(cfg)
    layers = [x for k in kinds for x in ((attn, mlp, mamba) if k == "H" else (mamba,))]
    return geometry(name, cfg, "Zamba2ForCausalLM", layers, source)


def _lfm2_mixers(cfg: Config) -> tuple[int, str]:
    n = cfg_int(cfg, "num_hidden_layers")
    names = {"conv": "C", "full_attention": "*"}
    if cfg.get("layer_types") is None and cfg.get("full_attn_idxs") is not None:
        at = cfg["full_attn_idxs"]
        if not isinstance(at, (list, tuple)) or not all(isinstance(i, int) for i in at):
            raise ValueError(f"config key 'full_attn_idxs' must list layer indices, got {at!r}")
        return n, "".join("*" if i in at else "C" for i in range(n))
    return n, cfg_types(cfg, ["layer_types"], names, n)


def _lfm2_mlp(cfg: Config) -> MLP:
    """``Lfm2MLP``'s width: 2/3 of intermediate_size, times the multiplier,
    rounded up to ``block_multiple_of``, when ``block_auto_adjust_ff_dim``."""
    width = cfg_int(cfg, "intermediate_size")
    if cfg.get("block_auto_adjust_ff_dim", True):
        width = int(2 * width / 3)
        multiplier = cfg.get("block_ffn_dim_multiplier")
        if multiplier is not None:
            if not isinstance(multiplier, (int, float)) or isinstance(multiplier, bool):
                raise TypeError(
                    f"config key 'block_ffn_dim_multiplier' must be a number, got {multiplier!r}"
                )
            step = cfg_int(cfg, "block_multiple_of")
            width = step * -(-int(multiplier * width) // step)
    return MLP(width, gated=True)


def lfm2(name: str, cfg: Config, source: str = "") -> Geometry:
    check_cfg(cfg)
    _, kinds = _lfm2_mixers(cfg)
    conv = ShortConv(cfg_int(cfg, "hidden_size"), cfg_int(cfg, "conv_L_cache", minimum=2))
    attn, mlp = _attention(cfg), _lfm2_mlp(cfg)
    layers = [x for k in kinds for x in ((conv if k == "C" else attn), mlp)]
    return geometry(name, cfg, "Lfm2ForCausalLM", layers, source)


def lfm2_moe(name: str, cfg: Config, source: str = "") -> Geometry:
    check_cfg(cfg)
    n, kinds = _lfm2_mixers(cfg)
    conv = ShortConv(cfg_int(cfg, "hidden_size"), cfg_int(cfg, "conv_L_cache", minimum=2))
    attn, dense = _attention(cfg), _swiglu(cfg)
    moe = MoE(
        cfg_int(cfg, "num_experts"),
        cfg_int(cfg, "num_experts_per_tok"),
        cfg_int(cfg, "moe_intermediate_size"),
    )
    first_moe = cfg_int(cfg, "num_dense_layers", 0, minimum=0)
    layers: list[Layer] = []
    for i, k in enumerate(kinds):
        layers += [conv if k == "C" else attn, dense if i < first_moe else moe]
    return geometry(name, cfg, "Lfm2MoeForCausalLM", layers, source)


def qwen3_5(name: str, cfg: Config, source: str = "") -> Geometry:
    """Qwen3.5 (``qwen3_5_text``) and Qwen3.5-MoE (``num_experts`` > 0); the
    text part of the multimodal config (`hf.text_part` unwraps it)."""
    check_cfg(cfg)
    n = cfg_int(cfg, "num_hidden_layers")
    attn_at = qwen_attention_layers(cfg, n)
    attn, gdn = _attention(cfg, gated=True), _gdn(cfg)
    moe = cfg_int(cfg, "num_experts", 0, minimum=0) > 0
    ffn: Layer = qwen_moe(cfg) if moe else _swiglu(cfg)
    layers = [x for i in range(n) for x in ((attn if i in attn_at else gdn), ffn)]
    arch = "Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"
    return geometry(name, cfg, arch, layers, source)


def olmo_hybrid(name: str, cfg: Config, source: str = "") -> Geometry:
    check_cfg(cfg)
    n = cfg_int(cfg, "num_hidden_layers")
    attn_at = qwen_attention_layers(cfg, n)
    attn, gdn, mlp = _attention(cfg), _gdn(cfg), _swiglu(cfg)
    layers = [x for i in range(n) for x in ((attn if i in attn_at else gdn), mlp)]
    return geometry(name, cfg, "OlmoHybridForCausalLM", layers, source)
