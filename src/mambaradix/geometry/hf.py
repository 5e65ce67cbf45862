"""Any supported hybrid model from its Hugging Face config.

`from_config` takes a config dict (a ``config.json``, or
``transformers.<Family>Config(...).to_dict()``), picks the family's builder
by ``model_type`` (else by ``architectures[0]``) and checks the result is a
hybrid mambaradix can model: at least one full-attention layer and one
recurrent layer. `load_config` reads a ``config.json`` or a directory holding
one. A multimodal config (Qwen3.5) is read through its ``text_config``.

Anything else is one ValueError / TypeError naming the key: an unknown or
unmodelled ``model_type``, sliding-window attention, a missing or mistyped
field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from mambaradix.geometry.cfgread import DEFAULT_DTYPE, Config, check_cfg
from mambaradix.geometry.configs import jamba, nemotron_h, qwen3_next
from mambaradix.geometry.families import (
    bamba,
    falcon_h1,
    granite_moe_hybrid,
    lfm2,
    lfm2_moe,
    olmo_hybrid,
    qwen3_5,
    zamba2,
)
from mambaradix.geometry.model import Geometry

__all__ = ["FAMILIES", "NOT_MODELLED", "from_config", "load_config", "load_geometry", "text_part"]

Builder = Callable[[str, Config, str], Geometry]

FAMILIES: dict[str, Builder] = {
    "nemotron_h": nemotron_h,
    "qwen3_next": qwen3_next,
    "qwen3_5": qwen3_5,
    "qwen3_5_text": qwen3_5,
    "qwen3_5_moe": qwen3_5,
    "qwen3_5_moe_text": qwen3_5,
    "falcon_h1": falcon_h1,
    "granitemoehybrid": granite_moe_hybrid,
    "bamba": bamba,
    "jamba": jamba,
    "zamba2": zamba2,
    "lfm2": lfm2,
    "lfm2_moe": lfm2_moe,
    "olmo_hybrid": olmo_hybrid,
}
"""``model_type`` -> builder, for every hybrid family modelled."""

NOT_MODELLED: dict[str, str] = {
    "zamba": "Zamba v1's multi-head Mamba1 with shared attention",
    "kimi_linear": "MLA attention (a compressed latent KV) and Kimi Delta Attention",
    "bailing_hybrid": "MLA attention (a compressed latent KV) and KDA linear attention",
    "minimax": "lightning (linear) attention",
    "recurrent_gemma": "local (sliding-window) attention and RG-LRU",
    "mamba": "no attention layer (a pure SSM, not a hybrid)",
    "mamba2": "no attention layer (a pure SSM, not a hybrid)",
    "falcon_mamba": "no attention layer (a pure SSM, not a hybrid)",
}
"""Hybrid or recurrent families transformers ships that no builder models, and why."""

_ARCHITECTURES = {
    "NemotronHForCausalLM": "nemotron_h",
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5ForCausalLM": "qwen3_5_text",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe_text",
    "FalconH1ForCausalLM": "falcon_h1",
    "GraniteMoeHybridForCausalLM": "granitemoehybrid",
    "BambaForCausalLM": "bamba",
    "JambaForCausalLM": "jamba",
    "Zamba2ForCausalLM": "zamba2",
    "Lfm2ForCausalLM": "lfm2",
    "Lfm2MoeForCausalLM": "lfm2_moe",
    "OlmoHybridForCausalLM": "olmo_hybrid",
}

_LAYOUT_KEYS = {
    "nemotron_h": "hybrid_override_pattern' / 'layers_block_type",
    "bamba": "attn_layer_indices",
    "zamba2": "layers_block_type",
    "jamba": "attn_layer_period",
}


def text_part(cfg: Config) -> Config:
    """The language model's config: ``text_config`` (with the outer
    ``architectures`` and dtype where it has none) when `cfg` has one, else `cfg`."""
    text = cfg.get("text_config")
    if text is None:
        return cfg
    if not isinstance(text, Mapping):
        raise TypeError(f"config key 'text_config' must be a mapping, got {type(text).__name__}")
    inherited = ("architectures", "dtype", "torch_dtype", "_name_or_path")
    return {**{k: cfg[k] for k in inherited if cfg.get(k) is not None}, **text}


def _model_type(cfg: Config) -> str:
    kind = cfg.get("model_type")
    if kind is None:
        archs = cfg.get("architectures")
        arch = archs[0] if isinstance(archs, (list, tuple)) and archs else None
        if arch not in _ARCHITECTURES:
            raise ValueError(
                f"config key 'model_type' is missing (and 'architectures' {archs!r} names no "
                f"supported model); supported model types: {', '.join(sorted(FAMILIES))}"
            )
        return _ARCHITECTURES[str(arch)]
    if not isinstance(kind, str):
        raise TypeError(f"config key 'model_type' must be a str, got {kind!r}")
    if kind in NOT_MODELLED:
        raise ValueError(
            f"config key 'model_type' {kind!r} is not modelled: {NOT_MODELLED[kind]}; "
            f"supported: {', '.join(sorted(FAMILIES))}"
        )
    if kind not in FAMILIES:
        raise ValueError(
            f"config key 'model_type' {kind!r} is not a hybrid family mambaradix models; "
            f"supported: {', '.join(sorted(FAMILIES))}"
        )
    return kind


def _check_attention(cfg: Config) -> None:
    window = cfg.get("sliding_window")
    if window is not None and cfg.get("use_sliding_window") is not False:
        raise ValueError(
            f"config key 'sliding_window' ({window!r}): sliding-window attention is not "
            "modelled (its KV is bounded by the window); set it to null for full attention"
        )


def _check_hybrid(geom: Geometry, kind: str) -> None:
    key = _LAYOUT_KEYS.get(kind, "layer_types")
    if not geom.attention:
        raise ValueError(
            f"config key '{key}': no full-attention layer; mambaradix models hybrids of "
            "attention and recurrent layers"
        )
    if not geom.recurrent:
        raise ValueError(
            f"config key '{key}': no recurrent (Mamba / linear-attention / conv) layer; "
            "a pure-attention model needs no state cache"
        )


def from_config(cfg: Config, name: str | None = None, source: str = "") -> Geometry:
    """The geometry of the model `cfg` describes (see the module docstring).
    `name` defaults to the config's ``_name_or_path`` (its last part), else its
    model type."""
    check_cfg(cfg)
    outer = _model_type(cfg)
    cfg = text_part(cfg)
    kind = _model_type(cfg) if cfg.get("model_type") is not None else outer
    _check_attention(cfg)
    given = cfg.get("_name_or_path")
    if name is None:
        name = Path(given).name if isinstance(given, str) and given.strip("/") else kind
    notes = [source or "config dict", f"model_type {kind}"]
    if cfg.get("dtype") is None and cfg.get("torch_dtype") is None:
        notes.append(f"no dtype in the config: {DEFAULT_DTYPE} assumed")
    geom = FAMILIES[kind](name, cfg, "; ".join(notes) + ".")
    _check_hybrid(geom, kind)
    return geom


def load_config(path: str | os.PathLike[str]) -> tuple[dict[str, object], Path]:
    """The JSON object of a ``config.json`` (`path` itself, or the one inside
    directory `path`) and the file's path; ValueError naming the path otherwise."""
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    if not file.is_file():
        where = f"{path}/config.json" if Path(path).is_dir() else str(path)
        raise ValueError(f"model config {where}: no such file")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"model config {file}: unreadable ({e})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"model config {file}, line {e.lineno}: invalid JSON ({e.msg})") from None
    if not isinstance(data, dict):
        raise ValueError(f"model config {file}: expected a JSON object, got {type(data).__name__}")
    return data, file


def load_geometry(path: str | os.PathLike[str], name: str | None = None) -> Geometry:
    """`from_config` of the ``config.json`` at `path` (a file or a directory);
    the model is named after its directory unless the config or `name` says."""
    data, file = load_config(path)
    stem = file.parent.name if file.name == "config.json" else file.stem
    given = data.get("_name_or_path")
    default = Path(given).name if isinstance(given, str) and given.strip("/") else stem
    try:
        return from_config(data, name or default or None, str(file))
    except (ValueError, TypeError) as e:
        raise type(e)(f"model config {file}: {e}") from None
