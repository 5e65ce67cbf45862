"""Where the engine runs: the device and dtype options, checked before any work.

Nothing falls back silently: asking for CUDA on a machine without it, or
handing the engine a model that sits on another device or dtype than asked,
is a ValueError naming the parameter.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["check_dtype", "check_net", "resolve_device"]


def resolve_device(device: object) -> torch.device:
    """`device` ("cpu", "cuda", "cuda:1" or a `torch.device`) as a
    `torch.device` with its index filled in for CUDA; ValueError if it is not
    one or if CUDA is asked for and absent."""
    if not isinstance(device, str | torch.device):
        raise TypeError(f"device must be a str or torch.device, got {type(device).__name__}")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device: {device!r} is not a torch device") from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
    if not torch.cuda.is_available():
        raise ValueError(
            f"device={device!r} but this torch has no usable CUDA device "
            "(torch.cuda.is_available() is False); nothing falls back to the CPU"
        )
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if not 0 <= index < torch.cuda.device_count():
        raise ValueError(f"device: {device!r}, but there are {torch.cuda.device_count()} GPUs")
    return torch.device("cuda", index)


DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def check_dtype(dtype: object) -> torch.dtype:
    """One of `DTYPES` (the float8 types are floating too, but no model runs in them)."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    if dtype not in DTYPES:
        names = ", ".join(map(str, DTYPES))
        raise TypeError(f"dtype must be {names}, got {dtype!r}")
    return dtype


def check_net(net: Any, device: torch.device, dtype: torch.dtype) -> None:
    """A model handed in (`net=`) must already be on `device`, in `dtype`."""
    param = next(net.parameters())
    where = param.device
    if where.type == "cuda" and where.index is None:
        where = torch.device("cuda", torch.cuda.current_device())
    if where != device:
        raise ValueError(f"net is on {where}, but device is {device}: move it first")
    if param.dtype != dtype:
        raise ValueError(f"net is {param.dtype}, but dtype is {dtype}: convert it first")
