"""Layer kinds of a hybrid model: shapes and sizes only, no costs.

A model is a list of these blocks in forward order. Each block is one
sublayer as the published configs count them: a token mixer (attention or a
recurrent layer) or a feed-forward block (dense MLP or MoE). A Nemotron-H
layer is one block; a Qwen3-Next or Jamba decoder layer is two (mixer, FFN).

Recurrent layers (`RECURRENT_TYPES`) keep a conv state of ``conv_kernel - 1`` inputs over
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
    "RECURRENT_TYPES",
    "Recurrent",
    "ShortConv",
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
    "int8": 1,
}
"""Bytes per element of the dtype names (torch spelling) a geometry may use.

``int8`` is for quantized state checkpoints only (per-tensor scales not counted)."""


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
    ``in_dim``: width of the q/k/v projections' input when it is not the
    model's hidden size (Zamba2's shared block reads the hidden state
    concatenated with the embeddings: 2 * hidden); 0 means hidden.
    """

    heads: int
    kv_heads: int
    head_dim: int
    gated_query: bool = False
    in_dim: int = 0
    kind: ClassVar[str] = "attention"

    def __post_init__(self) -> None:
        _check_dims(self, {"in_dim": 0})
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
        width = self.in_dim or hidden
        return width * (q_out + 2 * self.kv_heads * self.head_dim) + (
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
class ShortConv:
    """LFM2's gated short convolution: in_proj to B, C and x (3 * channels), a
    depthwise causal conv of ``conv_kernel`` taps over ``channels``, out_proj.
    Its only state is the conv state: no SSM state, no scan."""

    channels: int
    conv_kernel: int
    kind: ClassVar[str] = "short_conv"
    scan_flops_per_state_elem: ClassVar[int] = 0

    def __post_init__(self) -> None:
        _check_dims(self, {"conv_kernel": 2})

    @property
    def conv_dim(self) -> int:
        return self.channels

    @property
    def ssm_shape(self) -> tuple[int, ...]:
        return ()

    def params(self, hidden: int) -> int:
        """in_proj (B, C, x) and out_proj weights."""
        return hidden * 3 * self.channels + self.channels * hidden


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
    """Mixture of experts: router, ``top_k`` routed experts per token and an
    optional shared expert (``shared_intermediate`` > 0) with an optional
    sigmoid gate. Experts are SwiGLU (gate, up, down) unless ``gated`` is
    False (up, down: Nemotron-H's relu2 experts). ``latent`` > 0: the routed
    experts work in a latent width, reached by a down and an up projection
    of the hidden state (Nemotron-H's ``moe_latent_size``)."""

    experts: int
    top_k: int
    intermediate: int
    shared_intermediate: int = 0
    shared_gate: bool = False
    gated: bool = True
    latent: int = 0
    kind: ClassVar[str] = "moe"

    def __post_init__(self) -> None:
        _check_dims(self, {"shared_intermediate": 0, "latent": 0})
        if self.top_k > self.experts:
            raise ValueError(f"MoE.top_k ({self.top_k}) must be <= experts ({self.experts})")
        if self.shared_gate and not self.shared_intermediate:
            raise ValueError("MoE.shared_gate needs a shared expert (shared_intermediate > 0)")

    def active_params(self, hidden: int) -> int:
        """Weights one token touches: router, its experts (and latent
        projections), the shared expert and gate."""
        mats = 3 if self.gated else 2
        width = self.latent or hidden
        return (
            hidden * self.experts
            + self.top_k * mats * width * self.intermediate
            + 2 * hidden * self.latent
            + mats * hidden * self.shared_intermediate
            + (hidden if self.shared_gate else 0)
        )


Recurrent = Mamba2 | Mamba1 | GatedDeltaNet | ShortConv
Layer = Attention | Mamba2 | Mamba1 | GatedDeltaNet | ShortConv | MLP | MoE
RECURRENT_TYPES = (Mamba2, Mamba1, GatedDeltaNet, ShortConv)
"""The layer kinds that keep a recurrent state (what a state checkpoint holds)."""


def conv_shape(layer: Recurrent) -> tuple[int, int]:
    """Conv state of one sequence: the last ``conv_kernel - 1`` inputs."""
    return (layer.conv_dim, layer.conv_kernel - 1)


def ssm_elems(layer: Recurrent) -> int:
    """Elements of the SSM state (0 for a layer without one: `ShortConv`)."""
    shape = layer.ssm_shape
    return math.prod(shape) if shape else 0
