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
from mambaradix.geometry.presets import PRESETS as GEOMETRY_PRESETS
from mambaradix.pools.geometry import StateGeometry

__all__ = ["PRESETS", "build_model", "state_geometry", "vocab_size"]

PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    name: (preset.family, preset.config_kwargs()) for name, preset in GEOMETRY_PRESETS.items()
}
"""Preset name -> (transformers model family, config kwargs), each written from
the preset's per-layer geometry (`mambaradix.geometry.presets`), the same
geometry `replay.models.get_profile(name)` derives its profile from."""


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
