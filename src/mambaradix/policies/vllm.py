"""vLLM 0.33.0's hybrid prefix caching with default arguments: the replay's `vllm` row.

What vLLM does (file:line in the wheel ``vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl``;
every rule checked against vLLM's own code driven on CPU, ``tests/test_vllm_differential.py``):

* Mode "align" (forced for hybrids, ``model_executor/models/config.py:750-787``): a state
  exists only where a prefill step ends on a block boundary, or where the step's forward
  exports one (Mamba2, FlashInfer GDN), and at block boundaries passed while decoding.
* Retention interval 0 (``config/cache.py:275-281``): of those, only the prompt's replay
  boundary ``floor((prompt - 1) / B) * B`` and a shared-prefix junction are kept
  (``kv_cache_coordinator.py:67-86, 358-381``, ``single_type_kv_cache_manager.py:
  545-569, 1549-1606, 2028-2094``). The junction: when a request's cached KV runs past its
  cached state, the KV hit (capped at ``tokens - 1``, floored to the block) is kept for its
  siblings, and the scheduler ends a prefill step there (``kv_cache_manager.py:318-325``,
  ``scheduler.py:546-662``). Our split is `vllm_split`.
* One block pool for KV and states, with vLLM's free queue (`mambaradix.policies.vllm_pool`):
  a request holds its blocks while it runs; a kept state is released (cached, at the
  queue's tail) once the running state moved past it (``single_type_kv_cache_manager.py:
  1629-1657``), its KV blocks at its end, tail first (``single_type_kv_cache_manager.py:
  591-601``); an allocation pops cached blocks from the head. A KV block stays cached
  whether or not a state is; full KV blocks of the output are cached too.

Settings users change: ``retention`` (``--prefix-cache-retention-interval``): 0 (default),
N tokens (also keep states at multiples of N, a multiple of the block), or None ("dense":
every state). Names: ``vllm``, ``vllm@dense``, ``vllm@N``.

The tree holds what a hit can use: KV along paths that end at a kept state, and the
states. vLLM's cache also holds KV no state is kept under (output blocks, KV whose state
was evicted, a second copy of a block recomputed after a shorter hit); `vllm_blocks` keeps
the hashes and queue places of those blocks, for the junction and for the memory they take,
and vLLM's books for the running requests. Departures: docs/vllm-baseline.md.
"""

from __future__ import annotations

from array import array
from dataclasses import replace
from typing import TYPE_CHECKING

from mambaradix.core.node import TreeNode
from mambaradix.core.results import EvictResult
from mambaradix.geometry.vllm import vllm_block
from mambaradix.lifecycle import Request
from mambaradix.policies.base import BasePolicy, PolicyContext
from mambaradix.policies.kinds import DECODED, PROMPT_END
from mambaradix.policies.seam import PolicyTree
from mambaradix.policies.tier_rules import VLLM_OFFLOAD, TierRules
from mambaradix.policies.vllm_blocks import BlockTables, Plan
from mambaradix.policies.vllm_pool import BlockPool, PoolKV, PoolSlots
from mambaradix.policies.vllm_split import (
    checkpoint_position,
    prefill_steps,
    step_checkpoint,
)

if TYPE_CHECKING:
    from mambaradix.geometry.profile import ModelProfile

DENSE = "dense"


def retention_name(retention: int | None) -> str:
    """The policy name for a retention interval (0: ``vllm``)."""
    if retention == 0:
        return "vllm"
    return f"vllm@{DENSE if retention is None else retention}"


def parse_retention(value: object, name: str = "retention") -> int | None:
    """A retention interval: an int >= 0 (tokens), or None / "dense" for dense."""
    if value is None or value == DENSE:
        return None
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise ValueError(
                f"{name} must be a number of tokens or 'dense', got {value!r}"
            ) from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, None or 'dense', got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


class VLLM(BasePolicy):
    """vLLM 0.33.0 with default arguments (the module docstring)."""

    name = "vllm"
    finish_insert = False

    def __init__(self, retention: int | None = 0, checkpoint_alignment: int | None = -1) -> None:
        """`checkpoint_alignment`: the Mamba layers' prefill checkpoint alignment (None:
        they export none); -1 (default) takes it from the profile's geometry
        (`geometry.vllm.VllmBlock.checkpoint_alignment`; 1, Mamba2's, without one)."""
        self.retention = parse_retention(retention)
        if checkpoint_alignment is not None and (
            isinstance(checkpoint_alignment, bool)
            or not isinstance(checkpoint_alignment, int)
            or checkpoint_alignment < -1
            or checkpoint_alignment == 0
        ):
            raise ValueError(
                f"checkpoint_alignment must be None, -1 or >= 1, got {checkpoint_alignment!r}"
            )
        self.checkpoint_alignment = checkpoint_alignment
        self.name = retention_name(self.retention)
        self.pool: BlockPool | None = None
        self.kv: PoolKV | None = None
        self.slots: PoolSlots | None = None
        self._plans: dict[int, Plan] = {}  # id(request) -> plan made at its match
        self._reach: dict[int, int] = {}  # id(request) -> its KV reach before its match

    # ----------------------------------------------------------------- sizes

    def state_bytes(self, profile: ModelProfile) -> int:
        return profile.vllm_state_bytes

    @staticmethod
    def block_of(profile: ModelProfile, unit_tokens: int) -> int:
        """vLLM's block in trace units (a block trace's unit may not divide it: rounded up)."""
        return max(1, -(-profile.vllm_block_tokens // unit_tokens))

    @classmethod
    def pool_shape(
        cls, budget: int, kv_unit_bytes: int, profile: ModelProfile, unit_tokens: int
    ) -> tuple[int, int, int]:
        """(blocks, block in units, blocks per state) of a `budget`-byte pool: a block
        holds a block of KV (one attention group); a state takes one block per Mamba
        group. One block is vLLM's null block (``block_pool.py:184-187``)."""
        block = cls.block_of(profile, unit_tokens)
        block_bytes = block * kv_unit_bytes
        groups = max(1, -(-profile.vllm_state_bytes // block_bytes))
        return budget // block_bytes - 1, block, groups

    def tree_page(self, profile: ModelProfile, unit_tokens: int) -> int:
        """vLLM's block: the tree shares KV in whole blocks, as vLLM's block hashes do."""
        return self.block_of(profile, unit_tokens)

    def build_memory(
        self, budget: int, kv_unit_bytes: int, profile: ModelProfile, unit_tokens: int
    ) -> tuple[PoolKV, PoolSlots]:
        """The KV and state allocators over one block pool of `budget` bytes."""
        blocks, block, groups = self.pool_shape(budget, kv_unit_bytes, profile, unit_tokens)
        if blocks < 1:
            raise ValueError(f"{budget / 1e9:g} GB holds no vLLM block of {block} units")
        self.pool = BlockPool(blocks)
        self.kv, self.slots = PoolKV(self.pool, block), PoolSlots(self.pool, groups)
        return self.kv, self.slots

    # ----------------------------------------------------------------- setup

    def attach(self, ctx: PolicyContext) -> None:
        super().attach(ctx)
        profile, unit = ctx.profile, ctx.unit_tokens
        self.block = self.block_of(profile, unit)
        self.decode_interval = self.block
        self.chunk = ctx.budget_units or ctx.chunk_units  # vLLM's max_num_batched_tokens
        self.alignment = self._alignment(profile)
        self.interval = self._interval_units(profile, unit)
        assert self.pool is not None and self.kv is not None and self.slots is not None
        assert ctx.tree is not None and ctx.rows is not None, "build_memory, then attach"
        self.blocks = BlockTables(self.pool, self.kv, self.slots, ctx.tree, ctx.rows, ctx.cache)

    def _alignment(self, profile: ModelProfile) -> int | None:
        """The checkpoint alignment in units (the GDN grid is the block)."""
        align = self.checkpoint_alignment
        if align == -1:
            geom = profile.geometry
            align = vllm_block(geom).checkpoint_alignment if geom is not None else 1
        if align is not None and align > 1:
            return self.block
        return align

    def check_profile(self, profile: ModelProfile) -> None:
        """ValueError when the retention interval is not a multiple of vLLM's block for
        this model, as vLLM refuses it (``kv_cache_coordinator.py:58-63``)."""
        n = self.retention
        if n and n % profile.vllm_block_tokens:
            raise ValueError(
                f"{self.name}: the retention interval {n} must be a multiple of vLLM's block "
                f"({profile.vllm_block_tokens} tokens for {profile.name})"
            )

    def _interval_units(self, profile: ModelProfile, unit: int) -> int | None:
        """The retention interval in units (0 sparse, None dense)."""
        n = self.retention
        if not n:
            return n
        self.check_profile(profile)
        every = n // profile.vllm_block_tokens * self.block
        return None if every <= self.block else every  # one block: every state

    # ------------------------------------------------------------- decisions

    def before_match(self, req: Request) -> None:
        """vLLM's lookup, before the step allocates anything: the junction (from every
        cached KV block's hash) and the hit's blocks (`BlockTables.lookup`)."""
        self._reach[id(req)] = self.blocks.kv_reach(req)
        self.blocks.lookup(req)

    def stops(self, req: Request) -> list[int]:
        plan = self._plan(req)
        self._plans[id(req)] = plan
        self.blocks.hold_first_export(req, plan)
        return plan.stops

    def _plan(self, req: Request) -> Plan:
        b, n, prompt, hit = self.block, req.total_len, len(req.input_ids), req.prefix_len
        junction = self._junction(req, hit)
        ends = prefill_steps(hit, prompt, n, b, self.chunk, junction, self.alignment)
        starts = [hit, *ends[:-1]]
        sparse = self.retention == 0
        by_start = {
            s: step_checkpoint(s, e, prompt, n, b, self.alignment, sparse)
            for s, e in zip(starts, ends, strict=True)
        }
        exported = set(by_start.values()) - {0}
        have = {e for e in ends if e % b == 0} | exported
        replay = checkpoint_position(prompt, b)
        kept = {p for p in have if p > hit and self._keeps(p, replay, junction)}
        stops = sorted(({e for e in ends if e < n} | (kept & exported)) - {0})
        exports = {s: c for s, c in by_start.items() if c in kept and c not in ends}
        return Plan(hit, junction, ends, kept, exports, stops)

    def _keeps(self, position: int, replay: int, junction: int) -> bool:
        if self.interval is None or position in (replay, junction):
            return True
        return bool(self.interval) and position % self.interval == 0

    def _keeps_later(self, position: int) -> bool:
        """A state at or after the prompt end is kept only by interval retention."""
        return self.interval is None or bool(self.interval and position % self.interval == 0)

    def _junction(self, req: Request, hit: int) -> int:
        """The KV hit capped at ``tokens - 1`` and floored to the block, when it runs past
        the state hit (vLLM's ``shared_prefix_boundary``), else 0."""
        reach = self._reach.pop(id(req), None)
        if reach is None:
            reach = self.blocks.kv_reach(req)
        return reach if reach > hit else 0

    def cache_at(self, req: Request, kind: str) -> bool:
        run = self.blocks.runs.get(req)
        if run is None:
            return False
        p = req.computed
        self.blocks.record(req, run)
        if kind in (DECODED, PROMPT_END):
            keep = p % self.block == 0 and self._keeps_later(p)
            self.blocks.boundary(run, p, p + 1, keep)
        else:
            keep = p in run.plan.kept
            later = [e for e in run.plan.ends if e > p]
            if later and p in run.plan.ends:  # a vLLM step boundary (not an exported state)
                self.blocks.boundary(run, p, later[0], keep)
            elif keep:  # an exported state
                self.blocks.export_taken(run)
        return keep

    def on_admitted(self, req: Request) -> None:
        plan = self._plans.pop(id(req), None) or self._plan(req)
        self.blocks.admit(req, plan)

    def on_cached(self, req: Request, node: TreeNode | None, kind: str) -> None:
        run = self.blocks.runs.get(req)
        if run is not None:
            self.blocks.cached(req, run, node, kind)

    def insert_at_finish(self, req: Request) -> bool:
        """vLLM keeps no state at the end unless its interval retention keeps the block
        boundary the request ends on (its running state there is cached); the
        request's blocks are released in vLLM's order."""
        run = self.blocks.runs.get(req)
        if run is None:
            return False
        p = req.computed
        if p % self.block == 0 and p > req.prefix_len and self._keeps_later(p):
            self.blocks.record(req, run)
            run.finish_at = p
            return True  # released in on_cached, once the tree holds the state
        del self.blocks.runs[req]
        self.blocks.release(run, req, p)
        return False

    def on_abort(self, req: Request) -> None:
        """Refused after its lookup, retracted or dropped (`BlockTables.abort`)."""
        self.blocks.abort(req)

    def on_request_done(self) -> None:
        self.blocks.sweep()

    @property
    def duplicate_states(self) -> int:
        """Kept states the tree already held (vLLM would hold two copies)."""
        return self.blocks.duplicate_states

    def adopt_loaded(
        self, tokens: array[int], start: int, kv: array[int], freed: set[int], slot: int | None
    ) -> None:
        """Blocks a lower-tier load put in the tree from unit `start` on (`kv`, less the
        indices the tree had already, `freed`) join vLLM's books as cached blocks."""
        b = self.block
        pages = [int(kv[i]) // b for i in range(0, len(kv), b) if int(kv[i]) not in freed]
        first = start // b + (len(kv) // b - len(pages))
        self.blocks.adopt(tokens, pages, first, slot)

    def evict(self, tree: PolicyTree, kv_units: int, states: int) -> EvictResult:
        """The lifecycle found too little memory: the pool already popped every cached
        block it could (allocations pop as they go), so there is nothing to evict."""
        return EvictResult(0, 0, array("q"), [])


class VLLMOffload(VLLM):
    """vLLM 0.33.0 with its native CPU offload (the OffloadingConnector): the `vllm`
    row on the device, and with `--host-gb` / `--store-gb` the offload's rules
    (`policies.tier_rules.VLLM_OFFLOAD`): per-group keys (`OffloadKey(block_hash,
    group_idx)`: a state is one entry per Mamba group, a hit needs them all), boundary
    (prompt) states only, no decode-phase state (vllm #56972), the deepest hit loaded.
    Without tiers it is the `vllm` row."""

    def __init__(self) -> None:
        super().__init__()
        self.name = "vllm-offload"

    def tier_rules(self, profile: ModelProfile) -> TierRules:
        groups = self.slots.groups if self.slots is not None else 1
        return replace(VLLM_OFFLOAD, state_groups=groups)
