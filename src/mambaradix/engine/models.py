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

from mambaradix.geometry.derive import engine_state_dtypes, state_shapes
from mambaradix.geometry.hf import from_config
from mambaradix.geometry.presets import PRESETS as GEOMETRY_PRESETS
from mambaradix.geometry.profile import ModelProfile, profile_from_geometry, unit_profile
from mambaradix.pools.geometry import StateGeometry

__all__ = ["PRESETS", "build_model", "engine_profile", "state_geometry", "vocab_size"]

PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    name: (preset.family, preset.config_kwargs()) for name, preset in GEOMETRY_PRESETS.items()
}
"""Preset name -> (transformers model family, config kwargs), each written from
the preset's per-layer geometry (`mambaradix.geometry.presets`), the same
geometry `geometry.profile.get_profile(name)` derives its profile from."""


def state_geometry(model: str, dtype: torch.dtype = torch.float32) -> StateGeometry:
    """The state-pool slot shape of preset `model`, from its recurrent layers
    as the engine keeps them (`geometry.derive.engine_state_dtypes`: the conv
    state holds all ``conv_kernel`` inputs, as transformers' cache does), at
    `dtype`."""
    geom = GEOMETRY_PRESETS[model].geometry
    rec = geom.recurrent
    if not rec or len(set(rec)) != 1:
        raise ValueError(f"{model}: needs recurrent layers of one shape")
    conv, ssm = state_shapes(rec[0], engine_state_dtypes(geom))
    name = str(dtype).removeprefix("torch.")
    return StateGeometry(
        num_layers=len(rec),
        conv_shapes=(conv,),
        ssm_shape=ssm,
        conv_dtype=name,
        ssm_dtype=name,
    )


def engine_profile(net: Any, name: str) -> ModelProfile:
    """The profile of the model the engine runs, for its policy (`PolicyContext`):
    derived from `net`'s own config at its weights' dtype, states as the engine keeps
    them (`engine_state_dtypes`), so a preset's equals `get_profile(preset)`. A model
    whose family the geometry does not know gets `unit_profile()` (1 byte and 1 FLOP
    per token): cost-aware policies then weigh tokens, not bytes and FLOPs."""
    cfg = dict(net.config.to_dict())
    cfg.pop("torch_dtype", None)
    cfg["dtype"] = str(next(net.parameters()).dtype).removeprefix("torch.")
    try:
        geom = from_config(cfg, os.path.basename(str(name).rstrip("/")) or str(name))
    except (KeyError, ValueError, TypeError):
        return unit_profile()
    return profile_from_geometry(geom, engine_state_dtypes(geom), "engine model")


def _build_preset(
    transformers: Any, model: str, seed: int, overrides: dict[str, Any] | None
) -> Any:
    """Preset `model` with `overrides` (ValueError for a key its config lacks,
    which the config would keep without effect, or values it cannot be built with)."""
    family, kwargs = PRESETS[model]
    config_cls = getattr(transformers, f"{family}Config")
    unknown = [k for k in overrides or {} if not hasattr(config_cls(), k)]
    if unknown:
        raise ValueError(f"model_overrides: {unknown[0]!r} is not a field of {config_cls.__name__}")
    try:
        cfg = config_cls(**{**kwargs, **(overrides or {})})
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return getattr(transformers, f"{family}ForCausalLM")(cfg)
    except (ValueError, TypeError, RuntimeError) as e:
        if not overrides:
            raise
        raise ValueError(f"model_overrides {overrides}: {e}") from None


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
        net = _build_preset(transformers, model, seed, overrides).to(dtype)
    elif overrides:
        raise ValueError(f"model_overrides apply to presets only, not to {model!r}")
    elif os.path.isdir(model):
        try:
            net = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
        except (ValueError, OSError) as e:  # no config, an unknown model type, no weights
            raise ValueError(f"model {model!r} cannot be loaded: {e}") from None
    else:
        raise ValueError(
            f"unknown model {model!r}: use a preset ({', '.join(PRESETS)}) or a local directory"
        )
    net.eval()
    return net


def vocab_size(model: str) -> int:
    """The vocabulary of preset or checkpoint `model`, read from its config
    alone (nothing is built); ValueError if the config cannot be read."""
    import transformers

    if model in PRESETS:
        family, kwargs = PRESETS[model]
        return int(getattr(transformers, f"{family}Config")(**kwargs).vocab_size)
    try:
        return int(transformers.AutoConfig.from_pretrained(model).vocab_size)
    except (ValueError, OSError) as e:
        raise ValueError(f"model {model!r} cannot be loaded: {e}") from None
