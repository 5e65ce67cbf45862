"""The replay's lower tiers: what is configured (sizes, links) and the rules a row runs.

Sizes and links come from `ServingConfig` (`host_gb`, `store_gb`, `host_gbps`,
`host_latency_us`, `store_gbps`, `store_latency_us`); 0 GB is no tier. The default links
are `tiers.cost`'s published figures, each cited there and in docs/tiers-replay.md:

* host (L2) <-> device: PCIe Gen5 x16, 64 GB/s one way (NVIDIA H100/H200 datasheets),
  10 us per load (two copy calls of 5-7 us, DualPath, arXiv 2602.21548, sec. 5.2);
* store (L3) -> host: an NVMe PCIe Gen5 SSD, 13 GB/s sequential read (Samsung PM1743),
  100 us per load (a NAND read, Pure Storage, 'What is NVMe').

`TierRules` are what differs between the rows that run tiers:

* ours (every policy but the two peer rows): one byte budget per tier shared by KV and
  states (`split="shared"`), every evicted state demoted, and a per-hit choice to load
  or recompute by cost (`choose="cost"`: load seconds vs the prefill seconds saved);
* `sglang-hicache`: SGLang 0.5.23's HiCache for Mamba: the host split into a KV pool and
  a state pool in proportion to the device pools' bytes (`--hicache-size`, sglang #32915),
  every state demoted (its checkpoints per chunk and per finished request are the
  `sglang` row's), the deepest hit always loaded;
* `sglang-hicache-auto`: the same with the host state pool sized by SGLang's proposed
  `auto` rule (sglang #39436, open): `slots = ceil(kv_host_tokens / chunked_prefill_size)
  + 4 x max_running_requests`, the KV pool the rest of the host bytes (`auto_kv_share`);
* `vllm-offload`: vLLM 0.33.0's native CPU offload: per-group keys (a state is one entry
  per Mamba group; a hit needs every group), boundary (prompt) states only, never a
  decode-phase state (vllm #56972), the deepest hit always loaded.

When units go down (`write`, `lifecycle.tier_write`; `ServingConfig.tier_write` overrides it
for every row): ours writes back (a copy when the device lets go of a unit: the host then
holds what the device does not); the peers' rows write through, as their upstreams do by
default: SGLang 0.5.23's `--hicache-write-policy` defaults to `write_through`
(`srt/arg_groups/fields/memory.py:121-127` in its wheel), and vLLM 0.33.0's offloading
connector schedules a store of every block a step computes (`offloading/scheduler.py`
`_build_store_jobs`, 1815-1850), so their host tiers are inclusive of the device.
"""

from __future__ import annotations

from dataclasses import dataclass

from mambaradix.lifecycle.tier_write import WritePolicy
from mambaradix.names import Names
from mambaradix.tiers.cost import NVME_GEN5, PCIE5_X16, Link, Tier


class Split(Names):
    """How a host tier's bytes are shared by KV and states."""

    SHARED = "shared"
    PROPORTIONAL = "proportional"
    AUTO = "auto"


class Choice(Names):
    """Which hit below the device a row loads."""

    COST = "cost"
    DEEPEST = "deepest"


class StateRule(Names):
    """Which states the device lets go of go down."""

    ALL_STATES = "all"
    PROMPT_STATES = "prompt"


SHARED, PROPORTIONAL, AUTO = Split
COST, DEEPEST = Choice
ALL_STATES, PROMPT_STATES = StateRule

DEFAULT_HOST_GBPS = PCIE5_X16.bandwidth / 1e9
DEFAULT_HOST_LATENCY_US = PCIE5_X16.latency_s * 1e6
DEFAULT_STORE_GBPS = NVME_GEN5.bandwidth / 1e9
DEFAULT_STORE_LATENCY_US = NVME_GEN5.latency_s * 1e6


@dataclass(frozen=True)
class TierRules:
    """split: one byte budget per tier (SHARED) or SGLang's KV/state split (PROPORTIONAL).
    choose: load the hit with the most seconds saved, if any (COST), or the deepest
    (DEEPEST). states: which evicted states go down (ALL_STATES, or PROMPT_STATES: only
    those at prompt positions). state_groups: entries per state (vLLM's Mamba groups).
    write: when units go down (the module docstring), unless the run sets one."""

    split: Split = SHARED
    choose: Choice = COST
    states: StateRule = ALL_STATES
    state_groups: int = 1
    write: WritePolicy = WritePolicy.WRITE_BACK


THROUGH = WritePolicy.WRITE_THROUGH  # the peers' upstream default
OURS = TierRules()
SGLANG_HICACHE = TierRules(split=PROPORTIONAL, choose=DEEPEST, write=THROUGH)
SGLANG_HICACHE_AUTO = TierRules(split=AUTO, choose=DEEPEST, write=THROUGH)
VLLM_OFFLOAD = TierRules(choose=DEEPEST, states=PROMPT_STATES, write=THROUGH)  # groups: policy's


def host_link(gbps: float, latency_us: float) -> Link:
    return Link("host (L2) <-> device", gbps * 1e9, latency_us * 1e-6, PCIE5_X16.source)


def store_link(gbps: float, latency_us: float) -> Link:
    return Link("store (L3) -> host", gbps * 1e9, latency_us * 1e-6, NVME_GEN5.source)


def load_tiers(
    host_gbps: float, host_latency_us: float, store_gbps: float, store_latency_us: float
) -> tuple[Tier, Tier]:
    """The paths of a load: host -> device, and store -> host -> device."""
    host = host_link(host_gbps, host_latency_us)
    return Tier("host", (host,)), Tier("store", (store_link(store_gbps, store_latency_us), host))


def auto_kv_share(
    host_bytes: int, kv_token_bytes: float, state_bytes: int, chunk_tokens: int, running: int
) -> float:
    """The KV pool's share of the host bytes under SGLang's proposed `auto` sizing
    (sglang #39436): the state pool holds `kv_host_tokens / chunk + 4 x running` states
    and the KV pool `kv_host_tokens` tokens, together the host bytes. Solved for
    `kv_host_tokens` (the ceiling dropped: under one state's bytes); when the host holds
    no more than the `4 x running` states, all of it is the state pool."""
    per_token = kv_token_bytes + state_bytes / chunk_tokens  # a token's KV, its share of a state
    tokens = (host_bytes - 4 * running * state_bytes) / per_token
    return max(0.0, tokens * kv_token_bytes / host_bytes) if host_bytes else 0.0
