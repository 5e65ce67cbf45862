"""Load or recompute: what a cache hit of `n` tokens costs from each tier, and the
break-even length beyond which loading beats recomputing.

A hit on a hybrid model needs the recurrent state at its end and the KV of its `n` tokens
(issue 17: "a hit never uses KV without the state at its end"), so loading it moves

    bytes(n) = state_bytes + n * kv_bytes_per_token

over every link between the tier and the device, one link after the other (the data path
of `pools.store_io`: store -> host staging -> device; no overlap between links is assumed):

    load_s(n) = sum over links of (latency_s + bytes(n) / bandwidth)

Recomputing instead prefills the `n` tokens (its FLOPs as `geometry.derive` and the replay's
`ModelProfile` count them: a linear part per token plus attention scores per causal pair):

    recompute_s(n) = (linear_flops_per_token * n + attn_flops_per_pair * n (n + 1) / 2) / R

with R the prefill FLOP/s (peak x MFU). The fixed cost of a forward is not in it: the suffix
after the hit is prefilled either way, so recomputing the prefix adds only its FLOPs.
`break_even(n)` is the smallest `n >= 1` with ``load_s(n) < recompute_s(n)`` (None when
loading never wins: no attention, and a token's KV takes longer to load than to compute).
Both sides grow with `n` and `recompute_s - load_s` is a convex parabola that starts below
zero, so every hit longer than the break-even also loads faster.

Defaults are published figures, each cited next to it (docs/tiers-data-path.md lists them);
`bench/bench_tier_breakeven.py` measures the same constants on this machine's CPU and
compares the model's break-even with the measured one.

Pure standard library (the replay and the tree may import it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "H100_PREFILL",
    "H200_PREFILL",
    "HitCost",
    "Link",
    "LoadRule",
    "PCIE5_X16",
    "Prefill",
    "TIERS",
    "Tier",
    "break_even",
    "load_s",
    "load_seconds",
    "recompute_s",
]


def _count(n: object, name: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{name} must be an int >= 0, got {n!r}")
    return n


def _real(x: object, name: str, *, positive: bool) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise ValueError(f"{name} must be a finite number, got {x!r}")
    if x < 0 or (positive and x == 0):
        raise ValueError(f"{name} must be {'> 0' if positive else '>= 0'}, got {x!r}")
    return float(x)


class Figures(Protocol):
    """What a model contributes (`geometry.derive.Figures`, `geometry.profile.ModelProfile`)."""

    @property
    def state_bytes(self) -> int: ...
    @property
    def kv_bytes_per_token(self) -> int: ...
    @property
    def linear_flops_per_token(self) -> int: ...
    @property
    def attn_flops_per_pair(self) -> int: ...


@dataclass(frozen=True)
class HitCost:
    """The figures of one model a hit's cost depends on (ints >= 0)."""

    name: str
    state_bytes: int  # one state checkpoint (conv + SSM, every recurrent layer)
    kv_bytes_per_token: int  # K and V of every attention layer
    linear_flops_per_token: int
    attn_flops_per_pair: int  # per causal (query, key) pair

    def __post_init__(self) -> None:
        for field in (
            "state_bytes",
            "kv_bytes_per_token",
            "linear_flops_per_token",
            "attn_flops_per_pair",
        ):
            _count(getattr(self, field), field)

    @classmethod
    def of(cls, name: str, figures: Figures) -> HitCost:  # a ModelProfile or Figures
        """From a `geometry.derive.Figures` or a replay `ModelProfile`."""
        return cls(
            name,
            figures.state_bytes,
            figures.kv_bytes_per_token,
            figures.linear_flops_per_token,
            figures.attn_flops_per_pair,
        )

    def hit_bytes(self, n: int) -> int:
        """Bytes a hit of `n` tokens loads: the state and `n` tokens of KV."""
        return self.state_bytes + _count(n, "n") * self.kv_bytes_per_token

    def prefill_flops(self, n: int, context: int = 0) -> int:
        """FLOPs of prefilling `n` tokens after `context` cached ones (causal attention:
        each new token attends to the context and to the new tokens up to itself)."""
        n, context = _count(n, "n"), _count(context, "context")
        pairs = n * context + n * (n + 1) // 2
        return self.linear_flops_per_token * n + self.attn_flops_per_pair * pairs


@dataclass(frozen=True)
class Link:
    """One hop of a load: a bandwidth, a fixed latency per load, and where they come from."""

    name: str
    bandwidth: float  # bytes/s, > 0
    latency_s: float  # per load (one batched request), seconds, >= 0
    source: str

    def __post_init__(self) -> None:
        _real(self.bandwidth, "bandwidth", positive=True)
        _real(self.latency_s, "latency_s", positive=False)

    def seconds(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bandwidth


@dataclass(frozen=True)
class Tier:
    """Where a hit is loaded from: the links its bytes cross, in order (at least one)."""

    name: str
    links: tuple[Link, ...]

    def __post_init__(self) -> None:
        if not self.links or not all(isinstance(x, Link) for x in self.links):
            raise ValueError(f"links must be a non-empty tuple of Link, got {self.links!r}")

    def seconds(self, nbytes: int) -> float:
        return sum(link.seconds(nbytes) for link in self.links)


@dataclass(frozen=True)
class Prefill:
    """Prefill throughput of one device: peak FLOP/s times the model FLOPs utilization."""

    name: str
    peak_flops: float  # > 0
    mfu: float  # in (0, 1]
    source: str

    def __post_init__(self) -> None:
        _real(self.peak_flops, "peak_flops", positive=True)
        if not 0 < _real(self.mfu, "mfu", positive=True) <= 1:
            raise ValueError(f"mfu must be in (0, 1], got {self.mfu!r}")

    @property
    def flops_per_s(self) -> float:
        return self.peak_flops * self.mfu


def load_seconds(host: Link, store: Link, host_bytes: int, store_bytes: int) -> float:
    """Seconds a load takes that reads `host_bytes` from the host and `store_bytes` from
    the store: every byte crosses the host link, the store's cross the store link first."""
    seconds = host.seconds(host_bytes + store_bytes)
    if store_bytes:
        seconds += store.seconds(store_bytes)
    return seconds


# --------------------------------------------------------------------------- published figures

PCIE5_X16 = Link(
    "PCIe Gen5 x16 host<->GPU",
    64e9,
    10e-6,
    "NVIDIA H100 and H200 datasheets: PCIe Gen5 128 GB/s (both directions), so 64 GB/s one way; "
    "latency: 2 copy calls x 5-7 us per cudaMemcpyAsync (DualPath, arXiv 2602.21548, sec. 5.2)",
)
NVME_GEN5 = Link(
    "NVMe PCIe Gen5 SSD",
    13e9,
    100e-6,
    "Samsung PM1743: 13 GB/s sequential read (Samsung announcement, AnandTech 2021-12-23); "
    "latency: a NAND read takes ~100 us (Pure Storage, 'What is NVMe')",
)
ETH_100G = Link(
    "Redis over 100GbE",
    12.5e9,
    200e-6,
    "100 Gb/s Ethernet line rate (IEEE 802.3ba) = 12.5 GB/s, an upper bound for one server; "
    "latency: 'about 200 us' per request on a 1 Gbit/s network (redis.io, Diagnosing latency "
    "issues), taken as is",
)
RDMA_4X200G = Link(
    "Mooncake transfer engine, RDMA 4x200 Gb/s RoCE",
    87e9,
    200e-6,
    "Mooncake transfer engine: 87 GB/s on 4x200 Gbps RoCE (kvcache-ai/Mooncake, "
    "doc/en/transfer-engine.md; FAST'25 paper); latency: one master lookup, a TCP round trip "
    "taken as Redis's 200 us",
)

TIERS: dict[str, Tier] = {
    "host": Tier("host (L2, pinned DRAM)", (PCIE5_X16,)),
    "file": Tier("file store on NVMe (L3)", (NVME_GEN5, PCIE5_X16)),
    "redis": Tier("Redis over 100GbE (L3)", (ETH_100G, PCIE5_X16)),
    "mooncake": Tier("Mooncake over RDMA (L3)", (RDMA_4X200G, PCIE5_X16)),
}
"""A hit loads into the GPU across PCIe; an L3 hit first reaches host memory."""

_MFU = 0.3
_MFU_WHY = (
    "MFU 0.3: the replay's default (replay/serving.py: 8 H100-class GPUs at ~30% of bf16 dense "
    "peak); published prefill MFU is 30-50% (zeroentropy.dev, 'MFU'): the break-even scales "
    "as 1/MFU"
)
H100_PREFILL = Prefill(
    "H100 SXM bf16",
    989.4e12,
    _MFU,
    f"NVIDIA H100 datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity, 989.4 dense; {_MFU_WHY}",
)
H200_PREFILL = Prefill(
    "H200 SXM bf16",
    989.4e12,
    _MFU,
    f"NVIDIA H200 datasheet: BF16 1,979 TFLOPS with sparsity (the H100's GH100 die); {_MFU_WHY}",
)


# --------------------------------------------------------------------------- the model


def load_s(model: HitCost, tier: Tier, n: int) -> float:
    """Seconds to load a hit of `n` tokens from `tier`."""
    return tier.seconds(model.hit_bytes(n))


def recompute_s(model: HitCost, prefill: Prefill, n: int) -> float:
    """Seconds to prefill the `n` tokens the hit stands for."""
    return model.prefill_flops(n) / prefill.flops_per_s


def break_even(model: HitCost, tier: Tier, prefill: Prefill) -> int | None:
    """The smallest `n >= 1` with ``load_s(n) < recompute_s(n)``; None if there is none.

    ``recompute_s - load_s = a n^2 + b n - c`` with ``a = attn / (2 R)``,
    ``b = (linear + attn / 2) / R - kv * sum(1 / B)`` and ``c = sum(latency) + state *
    sum(1 / B)``: its positive root, then checked on the integers around it."""
    inv_bw = sum(1.0 / link.bandwidth for link in tier.links)
    rate = prefill.flops_per_s
    a = model.attn_flops_per_pair / (2 * rate)
    b = (model.linear_flops_per_token + model.attn_flops_per_pair / 2) / rate
    b -= model.kv_bytes_per_token * inv_bw
    c = sum(link.latency_s for link in tier.links) + model.state_bytes * inv_bw
    if a > 0:
        root = (-b + math.sqrt(b * b + 4 * a * c)) / (2 * a)
    elif b > 0:
        root = c / b
    else:
        return None
    n = max(1, math.floor(root))
    while n > 1 and _wins(model, tier, prefill, n - 1):
        n -= 1
    while not _wins(model, tier, prefill, n):
        n += 1
    return n


def _wins(model: HitCost, tier: Tier, prefill: Prefill, n: int) -> bool:
    return load_s(model, tier, n) < recompute_s(model, prefill, n)


@dataclass(frozen=True)
class LoadRule:
    """The figures of the per-hit choice to load or recompute where no replay profile is
    at hand (the engine's `tier_cost`): the model's FLOPs (`HitCost`), the prefill rate,
    and the links a load crosses (host -> device, store -> host). The choice itself is
    `lifecycle.tiers.cheapest`, the replay's too."""

    model: HitCost
    prefill: Prefill
    host: Link = PCIE5_X16
    store: Link = NVME_GEN5

    def __post_init__(self) -> None:
        for name, kind in (("model", HitCost), ("prefill", Prefill), ("host", Link)):
            if not isinstance(getattr(self, name), kind):
                raise TypeError(f"{name} must be a {kind.__name__}, got {getattr(self, name)!r}")
        if not isinstance(self.store, Link):
            raise TypeError(f"store must be a Link, got {self.store!r}")

    def load_s(self, host_bytes: int, store_bytes: int) -> float:
        return load_seconds(self.host, self.store, host_bytes, store_bytes)

    def recompute_s(self, context: int, n: int) -> float:
        """Seconds to prefill `n` tokens after `context` cached ones."""
        return self.model.prefill_flops(n, context) / self.prefill.flops_per_s
