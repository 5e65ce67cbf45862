"""Typed reads of a Hugging Face config dict, each error naming the key.

Shared by the family builders (`configs`, `families`). A config is the dict
of a ``config.json`` or of ``transformers.<Family>Config(...).to_dict()``;
``None`` stands for a key transformers writes but leaves unset, and reads as
absent wherever a default exists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mambaradix.geometry.layers import Layer, dtype_bytes
from mambaradix.geometry.model import Geometry

__all__ = [
    "DEFAULT_DTYPE",
    "MISSING",
    "Config",
    "check_cfg",
    "cfg_dtype",
    "cfg_int",
    "cfg_str",
    "cfg_types",
    "geometry",
]

Config = Mapping[str, object]
MISSING = object()
DEFAULT_DTYPE = "bfloat16"
"""The model dtype when a config names none (``dtype: null``, as transformers writes a
config built without one); every published hybrid checkpoint is bf16."""
_DTYPE_KEYS = ("mamba_ssm_dtype", "mamba_ssm_cache_dtype")


def check_cfg(cfg: object) -> None:
    """TypeError unless `cfg` is a config dict (a transformers config: ``to_dict()``)."""
    if not isinstance(cfg, Mapping):
        raise TypeError(f"cfg must be a config mapping (dict), got {type(cfg).__name__}")


def _value(cfg: Config, key: str, default: object) -> object:
    value = cfg.get(key)
    if value is None:
        value = default
    if value is MISSING:
        raise ValueError(f"config key {key!r} is missing")
    return value


def cfg_int(cfg: Config, key: str, default: object = MISSING, minimum: int = 1) -> int:
    """`cfg[key]` as an int >= `minimum` (`default` when absent or null)."""
    value = _value(cfg, key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"config key {key!r} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"config key {key!r} must be >= {minimum}, got {value}")
    return value


def cfg_str(cfg: Config, key: str, default: object = MISSING) -> str:
    value = _value(cfg, key, default)
    if not isinstance(value, str):
        raise TypeError(f"config key {key!r} must be a str, got {value!r}")
    return value


def cfg_dtype(cfg: Config) -> str:
    """The model dtype: ``dtype`` (transformers >= 4.56) or ``torch_dtype``
    (older configs), `DEFAULT_DTYPE` when both are absent or null."""
    key = "dtype" if cfg.get("dtype") is not None else "torch_dtype"
    value = cfg_str(cfg, key, DEFAULT_DTYPE)
    dtype_bytes(value, f"config key {key!r}")
    return value


def cfg_types(cfg: Config, keys: Sequence[str], names: Mapping[str, str], n: int | None) -> str:
    """A per-layer type list (the first of `keys` present) as one letter per
    layer (`names`: the spelling -> its letter); ValueError naming the key for
    an unknown spelling or a length other than `n` (when given)."""
    key = next((k for k in keys if cfg.get(k) is not None), None)
    if key is None:
        raise ValueError(f"config key {keys[0]!r} is missing")
    types = cfg[key]
    if not isinstance(types, (list, tuple)) or any(
        not isinstance(t, str) or t not in names for t in types
    ):
        raise ValueError(f"config key {key!r} must list {sorted(names)}, got {types!r}")
    if not types or (n is not None and len(types) != n):
        raise ValueError(
            f"config key {key!r} must have one entry per layer ({n}), got {len(types)}"
        )
    return "".join(names[t] for t in types)


def geometry(
    name: str, cfg: Config, architecture: str, layers: Sequence[Layer], source: str
) -> Geometry:
    """`layers` with the model-wide fields every builder reads the same way
    (`architecture` when the config has no ``architectures``)."""
    chunk_key = "mamba_chunk_size" if cfg.get("mamba_chunk_size") is not None else "chunk_size"
    archs = cfg.get("architectures")
    if archs is None:  # absent, or transformers' to_dict() of a config without it
        archs = [architecture]
    if not isinstance(archs, (list, tuple)) or not archs or not isinstance(archs[0], str):
        raise ValueError(f"config key 'architectures' must be a non-empty list, got {archs!r}")
    return Geometry(
        name=name,
        architecture=archs[0],
        hidden=cfg_int(cfg, "hidden_size"),
        layers=tuple(layers),
        dtype=cfg_dtype(cfg),
        dtype_settings=tuple((k, cfg_str(cfg, k)) for k in _DTYPE_KEYS if cfg.get(k) is not None),
        mamba_chunk_size=cfg_int(cfg, chunk_key) if cfg.get(chunk_key) is not None else None,
        source=source,
    )


def per_head(width: int, heads: int, what: str) -> int:
    """The channels of one attention head when `heads` heads split `width` (`what`: the
    config's name for the width); ValueError naming the heads key when they do not divide it
    (the model could not be built)."""
    if width % heads:
        raise ValueError(f"config key 'num_attention_heads' ({heads}) must divide {what}")
    return width // heads
