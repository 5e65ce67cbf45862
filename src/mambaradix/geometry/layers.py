"""Layer kinds of a hybrid model: shapes and sizes only, no costs.

A model is a list of these blocks in forward order. Each block is one
sublayer as the published configs count them: a token mixer (attention or a
recurrent layer) or a feed-forward block (dense MLP or MoE). A Nemotron-H
layer is one block; a Qwen3-Next or Jamba decoder layer is two (mixer, FFN).

Recurrent layers keep a conv state of ``conv_kernel - 1`` inputs over
``conv_dim`` channels and an SSM ("temporal") state of ``ssm_shape``;
their dtypes are not a property of the layer but of the engine that stores
them (see `derive.StateDtypes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import ClassVar

__all__ = [
    "DTYPE_BYTES",
    "MLP",
    "Attention",
    "GatedDeltaNet",
    "Layer",
    "Mamba1",
    "Mamba2",
    "MoE",
    "Recurrent",
    "conv_shape",
    "dtype_bytes",
    "ssm_elems",
]

DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
"""Bytes per element of the dtype names (torch spelling) a geometry may use."""


def dtype_bytes(dtype: object, name: str = "dtype") -> int:
    """Bytes per element of `dtype`; TypeError / ValueError naming `name`."""
    if not isinstance(dtype, str):
        raise TypeError(f"{name} must be a dtype name (str), got {type(dtype).__name__}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"{name}: unknown dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def _check_dims(block: object, minimum: dict[str, int]) -> None:
    """Every int field of `block` is an int >= its minimum (1 unless listed)."""
    kind = type(block).__name__
    for f in fields(block):  # type: ignore[arg-type]
        value = getattr(block, f.name)
        if f.type not in ("int", int):
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{kind}.{f.name} must be an int, got {type(value).__name__}")
        low = minimum.get(f.name, 1)
        if value < low:
            raise ValueError(f"{kind}.{f.name} must be >= {low}, got {value}")
    for f in fields(block):  # type: ignore[arg-type]
        value = getattr(block, f.name)
        if f.type in ("bool", bool) and not isinstance(value, bool):
            raise TypeError(f"{kind}.{f.name} must be a bool, got {type(value).__name__}")


@dataclass(frozen=True)
class Attention:
    """Full causal attention with grouped K/V heads.

    ``gated_query``: q_proj also emits an output gate of the same width
    (Qwen3-Next's gated attention), doubling the query projection.
    """

    heads: int
    kv_heads: int
    head_dim: int
    gated_query: bool = False
    kind: ClassVar[str] = "attention"

    def __post_init__(self) -> None:
        _check_dims(self, {})
        if self.heads % self.kv_heads:
            raise ValueError(
                f"Attention.heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )

    @property
    def kv_elems_per_token(self) -> int:
        """K and V elements one token adds to this layer's cache."""
        return 2 * self.kv_heads * self.head_dim

    def params(self, hidden: int) -> int:
        """q (+ gate), k, v and o projection weights."""
        q_out = self.heads * self.head_dim * (2 if self.gated_query else 1)
        return hidden * (q_out + 2 * self.kv_heads * self.head_dim) + (
            self.heads * self.head_dim * hidden
        )


@dataclass(frozen=True)
class Mamba2:
    """Mamba2 mixer (SSD): heads of ``head_dim`` channels, grouped B/C."""

    heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    kind: ClassVar[str] = "mamba2"
    scan_flops_per_state_elem: ClassVar[int] = 6
    """h <- exp(dt*A)*h + dt*B x (decay 1, outer product 2, add 1), y = C h (2)."""

    def __post_init__(self) -> None:
        _check_dims(self, {"conv_kernel": 2})
        if self.heads % self.n_groups:
            raise ValueError(
                f"Mamba2.heads ({self.heads}) must be a multiple of n_groups ({self.n_groups})"
            )

    @property
    def d_inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the short conv: x, B and C."""
        return self.d_inner + 2 * self.n_groups * self.state_size

    @property
    def ssm_shape(self) -> tuple[int, ...]:
        return (self.heads, self.head_dim, self.state_size)

    def params(self, hidden: int) -> int:
        """in_proj (z, x, B, C, dt) and out_proj weights."""
        in_proj = hidden * (2 * self.d_inner + 2 * self.n_groups * self.state_size + self.heads)
        return in_proj + self.d_inner * hidden


@dataclass(frozen=True)
class Mamba1:
    """Mamba1 mixer (selective scan) as in Jamba: one state row per channel."""

    d_inner: int
    state_size: int
    conv_kernel: int
    dt_rank: int
    kind: ClassVar[str] = "mamba1"
    scan_flops_per_state_elem: ClassVar[int] = 6
    """Same recurrence as Mamba2, per channel instead of per head."""

    def __post_init__(self) -> None:
        _check_dims(self, {"conv_kernel": 2})

    @property
    def conv_dim(self) -> int:
        return self.d_inner

    @property
    def ssm_shape(self) -> tuple[int, ...]:
        return (self.d_inner, self.state_size)

    def params(self, hidden: int) -> int:
        """in_proj (x, z), x_proj (dt, B, C), dt_proj and out_proj weights."""
        return (
            hidden * 2 * self.d_inner
            + self.d_inner * (self.dt_rank + 2 * self.state_size)
            + self.dt_rank * self.d_inner
            + self.d_inner * hidden
        )


@dataclass(frozen=True)
class GatedDeltaNet:
    """Gated DeltaNet mixer (Qwen3-Next linear attention); conv over q, k, v."""

    k_heads: int
    v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    kind: ClassVar[str] = "gated_deltanet"
    scan_flops_per_state_elem: ClassVar[int] = 7
    """S <- a*S (1); S^T k (2); rank-1 write (2); read-out S^T q (2)."""

    def __post_init__(self) -> None:
        _check_dims(self, {"conv_kernel": 2})
        if self.v_heads % self.k_heads:
            raise ValueError(
                f"GatedDeltaNet.v_heads ({self.v_heads}) must be a multiple of "
                f"k_heads ({self.k_heads})"
            )

    @property
    def key_dim(self) -> int:
        return self.k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def ssm_shape(self) -> tuple[int, ...]:
        return (self.v_heads, self.head_k_dim, self.head_v_dim)

    def params(self, hidden: int) -> int:
        """in_proj_qkvz, in_proj_ba (beta, alpha per v-head) and out_proj weights."""
        qkvz = hidden * (2 * self.key_dim + 2 * self.value_dim)
        return qkvz + hidden * 2 * self.v_heads + self.value_dim * hidden


@dataclass(frozen=True)
class MLP:
    """Dense feed-forward: up + down (``gated``: SwiGLU gate + up + down)."""

    intermediate: int
    gated: bool
    kind: ClassVar[str] = "mlp"

    def __post_init__(self) -> None:
        _check_dims(self, {})

    def params(self, hidden: int) -> int:
        return (3 if self.gated else 2) * hidden * self.intermediate


@dataclass(frozen=True)
class MoE:
    """Mixture of SwiGLU experts: router, ``top_k`` routed experts per token and
    an optional shared expert (``shared_intermediate`` > 0) with a sigmoid gate."""

    experts: int
    top_k: int
    intermediate: int
    shared_intermediate: int = 0
    shared_gate: bool = False
    kind: ClassVar[str] = "moe"

    def __post_init__(self) -> None:
        _check_dims(self, {"shared_intermediate": 0})
        if self.top_k > self.experts:
            raise ValueError(f"MoE.top_k ({self.top_k}) must be <= experts ({self.experts})")
        if self.shared_gate and not self.shared_intermediate:
            raise ValueError("MoE.shared_gate needs a shared expert (shared_intermediate > 0)")

    def active_params(self, hidden: int) -> int:
        """Weights one token touches: router, its experts, the shared expert and gate."""
        return (
            hidden * self.experts
            + self.top_k * 3 * hidden * self.intermediate
            + 3 * hidden * self.shared_intermediate
            + (hidden if self.shared_gate else 0)
        )


Recurrent = Mamba2 | Mamba1 | GatedDeltaNet
Layer = Attention | Mamba2 | Mamba1 | GatedDeltaNet | MLP | MoE


def conv_shape(layer: Recurrent) -> tuple[int, int]:
    """Conv state of one sequence: the last ``conv_kernel - 1`` inputs."""
    return (layer.conv_dim, layer.conv_kernel - 1)


def ssm_elems(layer: Recurrent) -> int:
    return math.prod(layer.ssm_shape)
