"""`Geometry`: a model as its list of layers, plus the few model-wide facts
(hidden size, dtype, config keys engines read) the derived figures need."""

from __future__ import annotations

from dataclasses import dataclass

from mambaradix.geometry.layers import (
    MLP,
    RECURRENT_TYPES,
    Attention,
    Layer,
    MoE,
    Recurrent,
    dtype_bytes,
)

__all__ = ["ACCOUNTINGS", "Geometry", "check_geometry"]

ACCOUNTINGS = ("standard", "marconi")
"""``standard``: the formulas documented in `derive`; ``marconi``: Marconi's
released simulator formulas applied to the same layers (see `derive`)."""

_LAYER_TYPES = (Attention, *RECURRENT_TYPES, MLP, MoE)


@dataclass(frozen=True)
class Geometry:
    """One model: its blocks in forward order and where the numbers come from.

    ``dtype`` is the weights' and KV cache's dtype (``torch_dtype``).
    ``dtype_settings`` holds the config's own state-dtype keys verbatim
    (``mamba_ssm_dtype``, ``mamba_ssm_cache_dtype``), which engines read.
    ``mamba_chunk_size`` is the config's ``chunk_size`` / ``mamba_chunk_size``
    (None when the config has none).
    """

    name: str
    architecture: str
    """The config's ``architectures[0]``; engines pick per-model rules by it."""
    hidden: int
    layers: tuple[Layer, ...]
    dtype: str = "bfloat16"
    dtype_settings: tuple[tuple[str, str], ...] = ()
    mamba_chunk_size: int | None = None
    accounting: str = "standard"
    source: str = ""

    def __post_init__(self) -> None:
        for key in ("name", "architecture"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value:
                raise TypeError(f"Geometry.{key} must be a non-empty str, got {value!r}")
        if isinstance(self.hidden, bool) or not isinstance(self.hidden, int):
            raise TypeError(f"Geometry.hidden must be an int, got {type(self.hidden).__name__}")
        if self.hidden < 1:
            raise ValueError(f"Geometry.hidden must be >= 1, got {self.hidden}")
        if not isinstance(self.layers, (tuple, list)) or not self.layers:
            raise ValueError("Geometry.layers must be a non-empty tuple of layers")
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, _LAYER_TYPES):
                raise TypeError(f"Geometry.layers[{i}] is not a layer: {type(layer).__name__}")
        dtype_bytes(self.dtype, "Geometry.dtype")
        settings = self.dtype_settings
        if not isinstance(settings, (tuple, list)) or any(
            not isinstance(kv, (tuple, list)) or len(kv) != 2 for kv in settings
        ):
            raise TypeError(f"Geometry.dtype_settings must be (key, dtype) pairs, got {settings!r}")
        for key, value in settings:
            dtype_bytes(value, f"Geometry.dtype_settings[{key!r}]")
        chunk = self.mamba_chunk_size
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int)):
            raise TypeError(f"Geometry.mamba_chunk_size must be an int or None, got {chunk!r}")
        if chunk is not None and chunk < 1:
            raise ValueError(f"Geometry.mamba_chunk_size must be >= 1, got {chunk}")
        if self.accounting not in ACCOUNTINGS:
            raise ValueError(
                f"Geometry.accounting must be one of {ACCOUNTINGS}, got {self.accounting!r}"
            )
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "dtype_settings", tuple(tuple(kv) for kv in self.dtype_settings))

    @property
    def attention(self) -> tuple[Attention, ...]:
        return tuple(x for x in self.layers if isinstance(x, Attention))

    @property
    def recurrent(self) -> tuple[Recurrent, ...]:
        return tuple(x for x in self.layers if isinstance(x, RECURRENT_TYPES))

    def setting(self, key: str) -> str | None:
        """The config's value for a state-dtype key, or None if it has none."""
        return dict(self.dtype_settings).get(key)

    def count(self, kind: str) -> int:
        """Number of blocks of `kind` (a layer class's ``kind``)."""
        return sum(1 for x in self.layers if x.kind == kind)


def check_geometry(value: object, name: str = "geom") -> Geometry:
    """`value` if it is a `Geometry`; TypeError naming `name` otherwise."""
    if not isinstance(value, Geometry):
        raise TypeError(f"{name} must be a Geometry, got {type(value).__name__}")
    return value
