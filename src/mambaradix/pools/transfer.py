"""Copies between the device pools and the host pools (L1 <-> L2), issued now, finished later.

Every pool here is a *tensor group*: named tensors that hold their units (state slots, or KV
tokens) on dim 1, ``[layers, units, ...]`` (`TorchStatePool`'s conv/ssm, the engine's k/v,
the host pools of `pools.host`). A copy moves units ``src_idx[k] -> dst_idx[k]`` of every
tensor of a group at once:

    src (device or host)            dst (host or device)
    t[:, src_idx]  --gather-->  staging [layers, n, ...]  --copy-->  --scatter-->  t[:, dst_idx]

Bitwise exact for every dtype: each tensor is moved through a view of the integer type of
its width (uint8 for float8 and int8, int16 for bf16/fp16, int32 for fp32, int64), so no
value is ever converted, NaN payloads and negative zeros included.

`Mover.copy` returns a `Transfer` handle at once; `Transfer.wait()` returns when the bytes
are where they go. On the CPU everything happens inside `copy` (the handle is already done);
on CUDA the device work runs on the mover's side stream, ordered after the caller's current
stream (so it sees everything computed so far) and the host staging buffers are pinned:

* device -> host (demote, write-through): gather on the side stream, an asynchronous copy to
  a pinned buffer, an event; `wait()` waits for the event and scatters into the host pool.
  Do not overwrite or free the source units before `wait()`.
* host -> device (load): gather into a pinned buffer on the CPU (inside `copy`), an
  asynchronous copy and the scatter on the side stream, an event; `wait()` makes the
  caller's current stream wait for it (the CPU does not block): kernels launched after
  `wait()` see the loaded units. Do not read or write the destination units before `wait()`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Generic, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt
import torch

from mambaradix.pools._checks import as_index_array

__all__ = ["Group", "Mover", "Transfer", "bitwise_view", "done", "group_layout"]

Group: TypeAlias = Mapping[str, torch.Tensor]
"""Named tensors with their units on dim 1."""

Index: TypeAlias = npt.NDArray[np.int64]
T = TypeVar("T")

_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class Transfer(Generic[T]):
    """A copy in flight. `done()` polls without blocking; `wait()` finishes it (once; later
    calls return the same result) and returns its result."""

    __slots__ = ("_poll", "_finish", "_result", "_finished")

    def __init__(self, poll: Callable[[], bool], finish: Callable[[], T]) -> None:
        self._poll, self._finish = poll, finish
        self._finished = False
        self._result: T | None = None

    def done(self) -> bool:
        """Whether `wait()` would return without waiting for a device or a thread."""
        return self._finished or self._poll()

    def wait(self) -> T:
        """Block until the copy is complete (device destinations: ordered before the work the
        caller launches next on its current stream) and return its result."""
        if not self._finished:
            self._result = self._finish()
            self._finished = True
        return self._result  # type: ignore[return-value]


def done(result: T) -> Transfer[T]:
    """A transfer that is complete already (CPU copies, answers known at once)."""
    return Transfer(lambda: True, lambda: result)


def bitwise_view(t: torch.Tensor) -> torch.Tensor:
    """`t` viewed as the integer dtype of its width (same shape, same storage)."""
    return t.view(_INT_OF_WIDTH[t.element_size()])


def group_layout(group: Group, name: str) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """part -> (dtype, shape without the units dim) of a tensor group; TypeError /
    ValueError naming `name` when it is not one."""
    if not isinstance(group, Mapping) or not group:
        raise TypeError(f"{name} must be a non-empty mapping of part name -> tensor")
    out = {}
    for part, t in group.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}[{part!r}] must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2 or not t.is_contiguous():
            raise ValueError(f"{name}[{part!r}] must be contiguous [layers, units, ...]")
        if t.element_size() not in _INT_OF_WIDTH or t.is_complex():
            raise ValueError(f"{name}[{part!r}]: dtype {t.dtype} cannot be moved bitwise")
        out[part] = (t.dtype, (t.shape[0], *t.shape[2:]))
    devices = {t.device for t in group.values()}
    if len(devices) != 1:
        raise ValueError(f"{name}: tensors on several devices {sorted(map(str, devices))}")
    return out


def _indices(value: Sequence[int] | torch.Tensor, limit: int, name: str) -> Index:
    """`value` as an int64 numpy array with every unit in [0, limit)."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers, got {value.dtype}")
        if value.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(value.shape)}")
        ids = value.to("cpu", torch.int64).numpy()
    else:
        ids = np.frombuffer(as_index_array(value, name), dtype=np.int64).copy()
    if ids.size and (ids.min() < 0 or ids.max() >= limit):
        bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise ValueError(f"{name}: {bad} is out of range [0, {limit})")
    return ids


class Mover:
    """Issues copies between tensor groups on one CUDA device and the host (or between
    CPU groups: then every copy is synchronous). Owns one side stream on CUDA."""

    __slots__ = ("device", "_stream")

    def __init__(self, device: str | torch.device = "cpu") -> None:
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
        self.device = dev
        self._stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None  # type: ignore[no-untyped-call]

    def copy(
        self,
        src: Group,
        src_idx: Sequence[int] | torch.Tensor,
        dst: Group,
        dst_idx: Sequence[int] | torch.Tensor,
    ) -> Transfer[None]:
        """Issue ``dst[part][:, dst_idx[k]] <- src[part][:, src_idx[k]]`` for every part and k.

        Both groups have the same parts, dtypes and shapes but for dim 1; indices in range,
        of equal length, `dst_idx` without repeats. Raises TypeError / ValueError naming the
        argument before anything is copied. Mutates `dst` (by `wait()` at the latest)."""
        s_idx, d_idx = self._check(src, src_idx, dst, dst_idx)
        if not s_idx.size:
            return done(None)
        s_dev = next(iter(src.values())).device
        d_dev = next(iter(dst.values())).device
        for where in (s_dev, d_dev):
            if where.type != "cpu" and where != self.device:
                raise ValueError(f"a group is on {where}; this mover serves {self.device}")
        if s_dev.type == "cpu" and d_dev.type == "cpu":
            _copy_on_cpu(src, s_idx, dst, d_idx)
            return done(None)
        if d_dev.type == "cpu":
            return self._download(src, s_idx, dst, d_idx)
        if s_dev.type == "cpu":
            return self._upload(src, s_idx, dst, d_idx)
        return self._on_device(src, s_idx, dst, d_idx)

    def _check(
        self,
        src: Group,
        src_idx: Sequence[int] | torch.Tensor,
        dst: Group,
        dst_idx: Sequence[int] | torch.Tensor,
    ) -> tuple[Index, Index]:
        s_layout, d_layout = group_layout(src, "src"), group_layout(dst, "dst")
        if s_layout != d_layout:
            raise ValueError(f"src and dst differ: {s_layout} vs {d_layout}")
        s_units = next(iter(src.values())).shape[1]
        d_units = next(iter(dst.values())).shape[1]
        s_idx = _indices(src_idx, s_units, "src_idx")
        d_idx = _indices(dst_idx, d_units, "dst_idx")
        if len(s_idx) != len(d_idx):
            raise ValueError(f"src_idx and dst_idx differ in length ({len(s_idx)} != {len(d_idx)})")
        if np.unique(d_idx).size != d_idx.size:
            raise ValueError("dst_idx: a unit appears more than once")
        return s_idx, d_idx

    # ------------------------------------------------------------------ CUDA paths

    def _side(self) -> torch.cuda.Stream:
        assert self._stream is not None
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        return self._stream

    def _download(self, src: Group, s_idx: Index, dst: Group, d_idx: Index) -> Transfer[None]:
        stream = self._side()
        with torch.cuda.stream(stream):
            idx = torch.from_numpy(s_idx).to(self.device)
            staged = {}
            for part, t in src.items():
                rows = bitwise_view(t).index_select(1, idx)
                host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
                host.copy_(rows, non_blocking=True)
                staged[part] = host
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(stream)

        def finish() -> None:
            event.synchronize()
            _scatter(dst, d_idx, staged)

        return Transfer(event.query, finish)

    def _upload(self, src: Group, s_idx: Index, dst: Group, d_idx: Index) -> Transfer[None]:
        staged = _gather(src, s_idx, pin=True)
        stream = self._side()
        with torch.cuda.stream(stream):
            idx = torch.from_numpy(d_idx).to(self.device)
            for part, t in dst.items():
                rows = staged[part].to(self.device, non_blocking=True)
                bitwise_view(t).index_copy_(1, idx, rows)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(stream)
        return self._ordered(event)

    def _on_device(self, src: Group, s_idx: Index, dst: Group, d_idx: Index) -> Transfer[None]:
        stream = self._side()
        with torch.cuda.stream(stream):
            s = torch.from_numpy(s_idx).to(self.device)
            d = torch.from_numpy(d_idx).to(self.device)
            for part, t in dst.items():
                bitwise_view(t).index_copy_(1, d, bitwise_view(src[part]).index_select(1, s))
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(stream)
        return self._ordered(event)

    def _ordered(self, event: torch.cuda.Event) -> Transfer[None]:
        def finish() -> None:
            torch.cuda.current_stream(self.device).wait_event(event)

        return Transfer(event.query, finish)

    def __repr__(self) -> str:
        return f"Mover(device={self.device})"


MAX_RUNS = 256
"""A CPU-to-CPU copy of at most this many runs of consecutive units is one slice copy per run
(one pass over the bytes, as SGLang's "direct" transfer does per contiguous run); more runs
(scattered KV tokens) go through one gather and one scatter (two passes, no Python loop)."""


def _runs(s_idx: Index, d_idx: Index) -> list[tuple[int, int, int]]:
    """(src start, dst start, length) of the maximal runs where both indices step by 1."""
    steps = (np.diff(s_idx) != 1) | (np.diff(d_idx) != 1)
    starts = np.concatenate(([0], np.flatnonzero(steps) + 1))
    lengths = np.diff(np.concatenate((starts, [len(s_idx)])))
    return list(zip(s_idx[starts].tolist(), d_idx[starts].tolist(), lengths.tolist(), strict=True))


def _copy_on_cpu(src: Group, s_idx: Index, dst: Group, d_idx: Index) -> None:
    runs = _runs(s_idx, d_idx)
    overlap = _same_storage(src, dst) and bool(np.isin(s_idx, d_idx).any())
    if len(runs) > MAX_RUNS or overlap:  # gather first: a simultaneous copy
        _scatter(dst, d_idx, _gather(src, s_idx))
        return
    for part, t in dst.items():
        out, inp = bitwise_view(t), bitwise_view(src[part])
        for s, d, n in runs:
            out[:, d : d + n].copy_(inp[:, s : s + n])


def _same_storage(a: Group, b: Group) -> bool:
    return any(
        x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
        for x, y in zip(a.values(), b.values(), strict=True)
    )


def _gather(group: Group, idx: Index, pin: bool = False) -> dict[str, torch.Tensor]:
    """Units `idx` of every CPU tensor of `group`, as contiguous bitwise views
    [layers, len(idx), ...] (in pinned memory when `pin`)."""
    index = torch.from_numpy(idx)
    out = {}
    for part, t in group.items():
        view = bitwise_view(t)
        shape = (view.shape[0], len(idx), *view.shape[2:])
        buf = torch.empty(shape, dtype=view.dtype, pin_memory=pin)
        torch.index_select(view, 1, index, out=buf)
        out[part] = buf
    return out


def _scatter(group: Group, idx: Index, rows: Mapping[str, torch.Tensor]) -> None:
    """Write `rows[part]` (bitwise views [layers, len(idx), ...] on the group's device)
    into units `idx` of every tensor of `group`."""
    index = torch.from_numpy(idx).to(next(iter(group.values())).device)
    for part, t in group.items():
        bitwise_view(t).index_copy_(1, index, rows[part])
