"""`TorchStatePool`: the real recurrent-state tensors, laid out as SGLang's
`MambaPool` (without its dummy slot 0):

    conv[i]: [num_layers, size, *geometry.conv_shapes[i]]
    ssm:     [num_layers, size, *geometry.ssm_shape]

Slot s of every layer is `t[:, s]`; layer l of every slot is `t[l]`.
This is the only module of `mambaradix.pools` that imports torch (an
optional extra); `import mambaradix.pools` does not load it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import torch

from mambaradix.pools._checks import as_index_array, as_int, as_positive
from mambaradix.pools.geometry import StateGeometry

__all__ = ["TorchStatePool"]

_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "int8": torch.int8,
}

# CPU torch has no index_copy_/index_fill_ for float8: move those as bytes
# (a bitwise copy; all-zero bits are +0.0).
_AS_BYTES = (torch.float8_e4m3fn, torch.float8_e5m2)

SlotIndex: TypeAlias = Sequence[int] | torch.Tensor


class TorchStatePool:
    """Zero-initialised conv and SSM state tensors for `size` slots.

    It only stores contents; which slots are in use is the allocator's
    business (`StateSlotAllocator`). Every method validates its slots first
    and raises ValueError / TypeError leaving the tensors unchanged.
    `conv` and `ssm` are public for kernels: write into them, never rebind.
    """

    __slots__ = ("_geometry", "_size", "_device", "_movable", "conv", "ssm")

    def __init__(
        self, geometry: StateGeometry, size: int, device: str | torch.device = "cpu"
    ) -> None:
        if not isinstance(geometry, StateGeometry):
            raise TypeError(f"geometry must be a StateGeometry, got {type(geometry).__name__}")
        size = as_positive(size, "size")
        dev = torch.device(device)
        layers = geometry.num_layers
        self._geometry = geometry
        self._size = size
        self._device = dev
        self.conv: list[torch.Tensor] = [
            torch.zeros((layers, size, *shape), dtype=_DTYPES[geometry.conv_dtype], device=dev)
            for shape in geometry.conv_shapes
        ]
        """One tensor per conv state: [num_layers, size, *conv_shape]."""
        self.ssm: torch.Tensor = torch.zeros(
            (layers, size, *geometry.ssm_shape), dtype=_DTYPES[geometry.ssm_dtype], device=dev
        )
        """[num_layers, size, *ssm_shape]."""
        # Views of the same storage that copy/clear operate on.
        self._movable = [t.view(torch.uint8) if t.dtype in _AS_BYTES else t for t in self.tensors()]

    @property
    def geometry(self) -> StateGeometry:
        return self._geometry

    @property
    def capacity(self) -> int:
        """Number of slots. Pure."""
        return self._size

    @property
    def device(self) -> torch.device:
        return self._device

    def tensors(self) -> list[torch.Tensor]:
        """All state tensors (conv..., ssm); each has slots on dim 1. Pure."""
        return [*self.conv, self.ssm]

    def layer(self, layer: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Views of one layer: ([conv_i [size, ...] for each conv], ssm
        [size, ...]). Writing through them writes the pool. Pure."""
        layer = as_int(layer, "layer")
        if not 0 <= layer < self._geometry.num_layers:
            raise ValueError(f"layer: {layer} is out of range [0, {self._geometry.num_layers})")
        return [c[layer] for c in self.conv], self.ssm[layer]

    def copy(self, src: SlotIndex, dst: SlotIndex) -> None:
        """dst[k] <- src[k] for every k, every tensor and every layer at once
        (one gather then one scatter per tensor, so overlapping src/dst act
        as a simultaneous copy). Lengths must match and `dst` must not repeat
        a slot (ValueError). Mutates the `dst` slots."""
        s = self._index(src, "src")
        d = self._index(dst, "dst")
        if s.numel() != d.numel():
            raise ValueError(f"src and dst differ in length ({s.numel()} != {d.numel()})")
        if d.numel() and torch.unique(d).numel() != d.numel():
            raise ValueError("dst: a slot appears more than once")
        if not d.numel():
            return
        for t in self._movable:
            t.index_copy_(1, d, t.index_select(1, s))

    def clear(self, slots: SlotIndex) -> None:
        """Zero every tensor at `slots` (repeats allowed). Mutates them."""
        idx = self._index(slots, "slots")
        if not idx.numel():
            return
        for t in self._movable:
            t.index_fill_(1, idx, 0)

    def slot_fingerprint(self, slot: int) -> float:
        """A position-weighted sum of every value of `slot` (all tensors,
        all layers), in float64: equal slots give equal numbers, and a change
        of almost any single value changes it. For tests. Pure."""
        slot = as_int(slot, "slot")
        if not 0 <= slot < self._size:
            raise ValueError(f"slot: {slot} is out of range [0, {self._size})")
        total = 0.0
        for k, t in enumerate(self.tensors()):
            flat = t[:, slot].reshape(-1).to(torch.float64)
            weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64, device=flat.device)
            total += (k + 1) * float((flat * weights).sum())
        return total

    def _index(self, value: SlotIndex, name: str) -> torch.Tensor:
        """`value` as a 1-D int64 index tensor on the pool's device, with
        every slot in [0, size). Pure."""
        if isinstance(value, torch.Tensor):
            if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
                raise TypeError(f"{name} must hold integers, got {value.dtype}")
            if value.dim() != 1:
                raise ValueError(f"{name} must be 1-D, got shape {tuple(value.shape)}")
            idx = value.to(device=self._device, dtype=torch.int64)
        else:
            ids = as_index_array(value, name).tolist()
            idx = torch.tensor(ids, dtype=torch.int64, device=self._device)
        if idx.numel():
            lo, hi = int(idx.min()), int(idx.max())
            if lo < 0 or hi >= self._size:
                bad = lo if lo < 0 else hi
                raise ValueError(f"{name}: {bad} is out of range [0, {self._size})")
        return idx

    def __repr__(self) -> str:
        return (
            f"TorchStatePool(capacity={self._size}, layers={self._geometry.num_layers}, "
            f"device={self._device})"
        )
