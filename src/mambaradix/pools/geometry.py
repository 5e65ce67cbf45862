"""`StateGeometry`: the shape of one recurrent-state slot of a hybrid model.

A slot holds, for each of `num_layers` recurrent layers, one or more conv
states (the last `conv_kernel - 1` inputs of the short causal convolution)
and one SSM state:

    Mamba2             conv: (conv_dim, conv_kernel - 1)
                            conv_dim = num_heads*head_dim + 2*n_groups*state_size
                       ssm:  (num_heads, head_dim, state_size)
    Gated DeltaNet     conv: (conv_dim, conv_kernel - 1)      over q, k and v
                            conv_dim = 2*num_k_heads*head_k_dim + num_v_heads*head_v_dim
                       ssm:  (num_v_heads, head_k_dim, head_v_dim)

Pure data (no torch); `torch_state.TorchStatePool` allocates tensors from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mambaradix.geometry.layers import DTYPE_BYTES, dtype_bytes
from mambaradix.pools._checks import as_positive

__all__ = ["DTYPE_SIZES", "StateGeometry"]

DTYPE_SIZES = DTYPE_BYTES  # one table of dtype sizes: the model geometry's


def _as_shape(value: object, name: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{name} must be a tuple of ints, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must have at least one dimension")
    return tuple(as_positive(d, f"{name}[{k}]") for k, d in enumerate(value))


@dataclass(frozen=True, slots=True)
class StateGeometry:
    """Shape and dtypes of one state slot (all recurrent layers).

    Lists given for the shapes are stored as tuples; every dimension must be
    a positive int (ValueError / TypeError otherwise).
    """

    num_layers: int
    conv_shapes: tuple[tuple[int, ...], ...]
    ssm_shape: tuple[int, ...]
    conv_dtype: str = "float32"
    ssm_dtype: str = "float32"

    def __post_init__(self) -> None:
        as_positive(self.num_layers, "num_layers")
        if not isinstance(self.conv_shapes, (tuple, list)):
            raise TypeError(
                f"conv_shapes must be a tuple of shapes, got {type(self.conv_shapes).__name__}"
            )
        conv = tuple(_as_shape(s, f"conv_shapes[{k}]") for k, s in enumerate(self.conv_shapes))
        ssm = _as_shape(self.ssm_shape, "ssm_shape")
        dtype_bytes(self.conv_dtype, "conv_dtype")
        dtype_bytes(self.ssm_dtype, "ssm_dtype")
        # Frozen: normalise lists to tuples (and numpy ints to int) in place.
        object.__setattr__(self, "num_layers", int(self.num_layers))
        object.__setattr__(self, "conv_shapes", conv)
        object.__setattr__(self, "ssm_shape", ssm)

    @classmethod
    def mamba2(
        cls,
        num_layers: int,
        num_heads: int,
        head_dim: int,
        state_size: int,
        n_groups: int,
        conv_kernel: int,
        *,
        conv_dtype: str = "float32",
        ssm_dtype: str = "float32",
    ) -> StateGeometry:
        """Geometry of a Mamba2 model's state (one conv tensor per layer)."""
        num_heads = as_positive(num_heads, "num_heads")
        head_dim = as_positive(head_dim, "head_dim")
        state_size = as_positive(state_size, "state_size")
        n_groups = as_positive(n_groups, "n_groups")
        conv_width = _conv_width(conv_kernel)
        conv_dim = num_heads * head_dim + 2 * n_groups * state_size
        return cls(
            num_layers=num_layers,
            conv_shapes=((conv_dim, conv_width),),
            ssm_shape=(num_heads, head_dim, state_size),
            conv_dtype=conv_dtype,
            ssm_dtype=ssm_dtype,
        )

    @classmethod
    def gated_delta_net(
        cls,
        num_layers: int,
        num_k_heads: int,
        num_v_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        conv_kernel: int,
        *,
        conv_dtype: str = "float32",
        ssm_dtype: str = "float32",
    ) -> StateGeometry:
        """Geometry of a Gated DeltaNet model's state (conv over q, k, v)."""
        num_k_heads = as_positive(num_k_heads, "num_k_heads")
        num_v_heads = as_positive(num_v_heads, "num_v_heads")
        head_k_dim = as_positive(head_k_dim, "head_k_dim")
        head_v_dim = as_positive(head_v_dim, "head_v_dim")
        conv_width = _conv_width(conv_kernel)
        conv_dim = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim
        return cls(
            num_layers=num_layers,
            conv_shapes=((conv_dim, conv_width),),
            ssm_shape=(num_v_heads, head_k_dim, head_v_dim),
            conv_dtype=conv_dtype,
            ssm_dtype=ssm_dtype,
        )

    @property
    def conv_bytes_per_slot(self) -> int:
        """Bytes of all conv states of one slot, over all layers."""
        elems = sum(math.prod(s) for s in self.conv_shapes)
        return self.num_layers * elems * DTYPE_SIZES[self.conv_dtype]

    @property
    def ssm_bytes_per_slot(self) -> int:
        """Bytes of the SSM states of one slot, over all layers."""
        return self.num_layers * math.prod(self.ssm_shape) * DTYPE_SIZES[self.ssm_dtype]

    @property
    def bytes_per_slot(self) -> int:
        """Bytes of one whole slot (conv + SSM, all layers)."""
        return self.conv_bytes_per_slot + self.ssm_bytes_per_slot


def _conv_width(conv_kernel: object) -> int:
    k = as_positive(conv_kernel, "conv_kernel")
    if k < 2:
        raise ValueError(f"conv_kernel must be >= 2 (the state keeps kernel-1 inputs), got {k}")
    return k - 1
