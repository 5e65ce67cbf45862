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
* One block pool for KV and states, with vLLM's free queue (`mambaradix.replay.vllm_pool`):
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
was evicted, a second copy of a block recomputed after a shorter hit); the policy keeps
the hashes and queue places of those blocks (`vllm_pool`), for the junction and for the
memory they take. Departures: docs/vllm-baseline.md.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mambaradix.core.node import TreeNode
from mambaradix.core.results import EvictResult
from mambaradix.core.tree import MambaRadixCache
from mambaradix.geometry.vllm import vllm_block
from mambaradix.lifecycle import Request
from mambaradix.replay.policies.base import Policy, PolicyContext
from mambaradix.replay.policies.vllm_split import (
    checkpoint_position,
    prefill_steps,
    step_checkpoint,
)
from mambaradix.replay.vllm_pool import BlockPool, PoolKV, PoolSlots
from mambaradix.scheduler import DECODED, FINISH, PROMPT_END

if TYPE_CHECKING:
    from mambaradix.replay.models import ModelProfile

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


@dataclass
class _Plan:
    """Where vLLM's prefill steps end for one admission, and which states it keeps."""

    hit: int
    junction: int
    ends: list[int]  # vLLM's step ends, the last at the request's length
    kept: set[int]  # positions whose state is kept
    exports: dict[int, int]  # step start -> the kept state its forward exports
    stops: list[int]  # where our scheduler must end a step (vLLM's ends, exported states)


@dataclass
class _Run:
    """A running request's blocks, as vLLM's block table holds them."""

    plan: _Plan
    pages: list[int] = field(default_factory=list)  # KV page of each block, hit ones first
    untouched: set[int] = field(default_factory=set)  # hit pages the pool no longer had
    hashes: list[int] = field(default_factory=list)  # block hashes of pages[:len(hashes)]
    pending: list[tuple[int, int]] = field(default_factory=list)  # (position, slot) held
    previous: list[Hashable] = field(default_factory=list)  # (`_boundary`)
    export: list[Hashable] = field(default_factory=list)  # held for an exported kept state
    previous_at: int = -1  # the position whose state they stand for
    finish_at: int = 0  # the position of a state kept at the end (interval retention)


class VLLM(Policy):
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
        self._plans: dict[int, _Plan] = {}  # id(request) -> plan made at its match
        self._reach: dict[int, int] = {}  # id(request) -> its KV reach before its match
        self._pins: dict[int, tuple[list[Hashable], list[tuple[int, int]]]] = {}
        self._exports: dict[int, list[Hashable]] = {}  # id(request) -> blocks held for it

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
        self.pool.evict = self._evicted
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
        self.runs: dict[Request, _Run] = {}
        # A KV block hash is cached while some copy of it is held or queued in the pool
        # (vLLM keeps a second copy of a recomputed block, ``block_pool.py:36-56``); the
        # tree holds one page per hash it holds, whichever copy that was.
        self.page_hash: dict[int, int] = {}  # pool copy (held or queued) -> its hash
        self.hash_pages: dict[int, dict[int, None]] = {}  # hash -> its copies, oldest first
        self.tree_copy: dict[int, int] = {}  # hash -> the page the tree holds it on
        self.tree_copy_hash: dict[int, int] = {}  # the reverse
        assert ctx.tree is not None and self.pool is not None, "build_memory, then attach"
        self.tree = ctx.tree
        self.index = _TreeIndex(self.block)
        self.tree.add_listener(self.index)
        self.dead: set[TreeNode] = set()  # evicted by vLLM while our lifecycle locked them
        self.duplicate_states = 0  # kept states the tree had already (vLLM holds two copies)

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
        """vLLM's lookup, before the step allocates anything (our match may take a slot,
        evicting as it goes): the junction, and the hit's blocks, which vLLM takes before
        it allocates (pinned here until the request is admitted, `on_admitted`)."""
        self._sweep()
        self._unpin(req)
        self._reach[id(req)] = self._kv_reach(req)
        m = self.tree.match_prefix(req.tokens[: req.total_len - 1], req.extra_key, read_only=True)
        assert self.pool is not None and self.slots is not None
        tokens, b, h = req.tokens, self.block, 0
        copies: list[tuple[int, int]] = []  # (page, hash) per hit block
        for i in range(0, m.prefix_len, b):
            h = _chain(h, tokens, i // b, b)
            page = int(m.kv_indices[i]) // b
            # vLLM's hit references the oldest cached copy of each block hash
            # (``BlockHashToBlockMap.get_one_block``), whichever page the tree holds
            copies.append((next(iter(self.hash_pages[h])) if h in self.hash_pages else page, h))
        keys: list[Hashable] = [("kv", page) for page, _ in copies]
        if m.prefix_len and m.node.state is not None:
            keys += self.slots.keys(m.node.state)
        for key in keys:
            self.pool.pin(key)
        self._pins[id(req)] = (keys, copies)

    def _unpin(self, req: Request) -> None:
        assert self.pool is not None
        keys, _ = self._pins.pop(id(req), ([], []))
        for key in keys:
            self.pool.unpin(key)

    def stops(self, req: Request) -> list[int]:
        plan = self._plan(req)
        self._plans[id(req)] = plan
        self._drop_keys(self._exports.pop(id(req), []))
        if plan.hit in plan.exports:  # the first step's forward exports a kept state
            self._exports[id(req)] = self._hold_blocks(("export", id(req)))
        return plan.stops

    def _plan(self, req: Request) -> _Plan:
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
        return _Plan(hit, junction, ends, kept, exports, stops)

    def _keeps(self, position: int, replay: int, junction: int) -> bool:
        if self.interval is None or position in (replay, junction):
            return True
        return bool(self.interval) and position % self.interval == 0

    def _junction(self, req: Request, hit: int) -> int:
        """The KV hit capped at ``tokens - 1`` and floored to the block, when it runs past
        the state hit (vLLM's ``shared_prefix_boundary``), else 0."""
        reach = self._reach.pop(id(req), None)
        if reach is None:
            reach = self._kv_reach(req)
        return reach if reach > hit else 0

    def _kv_reach(self, req: Request) -> int:
        """How far the request's blocks are cached, capped at ``tokens - 1``."""
        cap = checkpoint_position(req.total_len, self.block) // self.block
        tokens, b, h, reach = req.tokens, self.block, 0, 0
        while reach < cap:
            h = _chain(h, tokens, reach, b)
            if h not in self.hash_pages:
                break
            reach += 1
        return reach * b

    def cache_at(self, req: Request, kind: str) -> bool:
        run = self.runs.get(req)
        if run is None:
            return False
        p = req.computed
        self._record(req, run)
        if kind in (DECODED, PROMPT_END):
            keep = p % self.block == 0 and self._keeps_later(p)
            self._boundary(run, p, p + 1, keep)
        else:
            keep = p in run.plan.kept
            later = [e for e in run.plan.ends if e > p]
            if later and p in run.plan.ends:  # a vLLM step boundary (not an exported state)
                self._boundary(run, p, later[0], keep)
            elif keep:  # an exported state: the block held for it is the copy's
                self._drop_keys(run.export)
                run.export = []
        return keep

    def _keeps_later(self, position: int) -> bool:
        """A state at or after the prompt end is kept only by interval retention."""
        return self.interval is None or bool(self.interval and position % self.interval == 0)

    def _boundary(self, run: _Run, end: int, next_end: int, keep: bool) -> None:
        """vLLM starts the step ``[end, next_end)`` (``MambaManager.remove_skipped_blocks``
        and ``allocate_new_blocks``, 1629-1657, 1797-1923): the request's state blocks
        before the block holding the state at `end` are let go (kept ones cached), and if
        the step writes its state into a new block, the block holding the state at `end`
        stays held beside it. Ours has one running slot for the whole request: that
        block gets a stand-in (`_hold_previous`), unless the state at `end` is kept: its
        copy stands in (or, if the tree had it already, `on_cached` holds the stand-in)."""
        b = self.block
        self._release_states(run, upto=(end - 1) // b * b)
        self._drop_previous(run)
        if (next_end - 1) // b != (end - 1) // b:
            if keep:
                run.previous_at = end
            else:
                self._hold_previous(run, end)
        if end in run.plan.exports:  # the step's forward exports a kept state: its block
            self._drop_keys(run.export)
            run.export = self._hold_blocks(("export", id(run)))

    def _hold_blocks(self, owner: tuple[str, int]) -> list[Hashable]:
        """A state's worth of blocks held for `owner` (none if the pool has too few)."""
        assert self.pool is not None and self.slots is not None
        keys: list[Hashable] = [(*owner, g) for g in range(self.slots.groups)]
        if self.pool.can_take(len(keys)) and self.pool.reserve(len(keys)):
            self.pool.hold(keys)
            return keys
        return []

    def _drop_keys(self, keys: list[Hashable]) -> None:
        assert self.pool is not None
        for key in keys:
            self.pool.release(key)

    def _hold_previous(self, run: _Run, end: int) -> None:
        keys = self._hold_blocks(("prev", id(run)))
        if keys:
            run.previous, run.previous_at = keys, end

    def _drop_previous(self, run: _Run) -> None:
        self._drop_keys(run.previous)
        run.previous = []

    def on_admitted(self, req: Request) -> None:
        stale = self.runs.pop(req, None)
        if stale is not None:  # retracted without the scheduler telling us
            self._release_run(stale, req, 0)
        plan = self._plans.pop(id(req), None) or self._plan(req)
        run = self.runs[req] = _Run(plan, export=self._exports.pop(id(req), []))
        assert self.pool is not None and self.slots is not None
        pins, copies = self._pins.pop(id(req), ([], []))
        for key in pins:
            self.pool.unpin(key)
        if len(copies) != plan.hit // self.block:  # no lookup seen (a caller without it)
            copies = self._hit_copies(req, plan.hit)
        for page, h in copies:  # a hit references its blocks (block_pool.py:792-814)
            if self.pool.holds(("kv", page)):
                self.pool.touch(("kv", page))
            else:  # concurrent only: a block vLLM evicted under a running request's lock
                run.untouched.add(page)
            run.pages.append(page)
            run.hashes.append(h)
        node = req.node
        if plan.hit and node is not None and node.state is not None:
            keys = self.slots.keys(node.state)
            if all(self.pool.holds(k) for k in keys):  # (else: a state in `dead`)
                for key in keys:
                    self.pool.touch(key)
                run.pending.append((plan.hit, node.state))

    def _hit_copies(self, req: Request, hit: int) -> list[tuple[int, int]]:
        b, tokens, h, out = self.block, req.tokens, 0, []
        for i in range(0, hit, b):
            h = _chain(h, tokens, i // b, b)
            page = int(req.prefix_kv[i]) // b
            out.append((next(iter(self.hash_pages[h])) if h in self.hash_pages else page, h))
        return out

    def on_cached(self, req: Request, node: TreeNode | None, kind: str) -> None:
        run = self.runs.get(req)
        if run is None:
            return
        if kind == FINISH:
            self._finished(req, run, node)
            return
        self._tree_pages(req, run)
        if node is not None and node.state is not None:
            run.pending.append((req.computed, node.state))
            return
        there = self.tree.peek(req.tokens[: req.computed], req.extra_key)
        if there is not None and there.state is not None:
            self.duplicate_states += 1  # vLLM would cache a second copy (docs/vllm-baseline.md)
        if req.computed == run.previous_at and not run.previous:
            self._hold_previous(run, req.computed)  # no copy taken: the stand-in is due

    def insert_at_finish(self, req: Request) -> bool:
        """vLLM keeps no state at the end unless its interval retention keeps the block
        boundary the request ends on (its running state there is cached); the
        request's blocks are released in vLLM's order (``kv_cache_manager.py:629-638``)."""
        run = self.runs.get(req)
        if run is None:
            return False
        p = req.computed
        if p % self.block == 0 and p > req.prefix_len and self._keeps_later(p):
            self._record(req, run)
            run.finish_at = p
            return True  # released in on_cached, once the tree holds the state
        del self.runs[req]
        self._release_run(run, req, p)
        return False

    def on_abort(self, req: Request) -> None:
        """A retracted or dropped request: vLLM frees a preempted request's blocks as a
        finished one's (``scheduler.py:1799-1843``)."""
        self._unpin(req)
        self._drop_keys(self._exports.pop(id(req), []))
        run = self.runs.pop(req, None)
        if run is not None:
            self._release_run(run, req, req.computed)

    # ------------------------------------------------------------ bookkeeping

    def _record(self, req: Request, run: _Run) -> None:
        """The request's own KV pages up to `computed`, read before a checkpoint makes
        its row point at the tree's copies; hashes of its full blocks."""
        b, rows = self.block, self.ctx.rows
        assert rows is not None and req.row is not None
        assert self.kv is not None
        for start in range(len(run.pages) * b, req.computed, b):
            page = int(rows.read(req.row, start, start + 1)[0]) // b
            self.kv.claim(page)
            run.pages.append(page)
        tokens = req.tokens
        for j in range(len(run.hashes), req.computed // b):
            h = _chain(run.hashes[-1] if run.hashes else 0, tokens, j, b)
            run.hashes.append(h)
            self._hash(run.pages[j], h)

    def _hash(self, page: int, h: int) -> None:
        self.page_hash[page] = h
        self.hash_pages.setdefault(h, {})[page] = None

    def _unhash(self, page: int) -> bool:
        """Forget a pool copy; True if it was its hash's last."""
        h = self.page_hash.pop(page, None)
        if h is None:
            return False
        pages = self.hash_pages[h]
        del pages[page]
        if pages:
            return False
        del self.hash_pages[h]
        return True

    def _tree_pages(self, req: Request, run: _Run) -> None:
        """After a checkpoint the request's row holds the tree's pages up to it: note
        which page the tree holds each block hash on."""
        b, rows = self.block, self.ctx.rows
        assert rows is not None and req.row is not None
        for j in range(min(req.prefix_len // b, len(run.hashes))):
            page = int(rows.read(req.row, j * b, j * b + 1)[0]) // b
            h = run.hashes[j]
            self.tree_copy[h] = page
            self.tree_copy_hash[page] = h

    def _finished(self, req: Request, run: _Run, node: TreeNode | None) -> None:
        """The tree took the finished request's blocks and its state at `finish_at`: its
        own pages are the tree's where the tree did not have the block."""
        del self.runs[req]
        for j, h in enumerate(run.hashes):
            page = run.pages[j]
            if self._tree_node(h) is None and self.index.page_node.get(page) is not None:
                self.tree_copy[h] = page
                self.tree_copy_hash[page] = h
        if node is not None and node.state is not None:
            run.pending.append((run.finish_at, node.state))
        else:
            self.duplicate_states += 1
        self._release_run(run, req, run.finish_at)

    def _release_states(self, run: _Run, upto: int) -> None:
        """Kept states at or before `upto`: cached, group by group, the later state first
        within a group (``_remove_blocks_in_range``, 1608-1627)."""
        done = sorted((s for s in run.pending if s[0] <= upto), reverse=True)
        if done:
            run.pending = [s for s in run.pending if s[0] > upto]
            self._cache_states(done)

    def _cache_states(self, states: list[tuple[int, int]]) -> None:
        assert self.pool is not None and self.slots is not None
        for g in range(self.slots.groups):
            for _, slot in states:
                self.pool.cache(("st", slot, g))

    def _release_run(self, run: _Run, req: Request, computed: int) -> None:
        """All of a request's blocks, as ``KVCacheManager.free``: the attention group's
        tail first (full blocks cached, the partial one freed), then each Mamba group's
        kept states not yet released. Kept states its last step had let go of already
        (a decode step past them) come first."""
        assert self.pool is not None and self.kv is not None
        if req.row is not None:
            self._record(req, run)
        if computed > run.plan.ends[-1]:  # it decoded: the last step started at computed - 1
            last_start = computed - 1
        else:
            last_start = max((e for e in run.plan.ends if e < computed), default=run.plan.hit)
        self._release_states(run, upto=(last_start - 1) // self.block * self.block)
        full = len(run.hashes)
        for j in range(len(run.pages) - 1, -1, -1):
            page = run.pages[j]
            if page in run.untouched:
                continue
            if j < full:
                self.pool.cache(("kv", page))
            else:
                self.pool.release(("kv", page))
                self._unhash(page)
                self.kv.page_released(page)
        self._cache_states(sorted(run.pending, reverse=True))
        run.pending = []
        self._drop_previous(run)
        self._drop_keys(run.export)
        run.export = []

    # -------------------------------------------------------------- eviction

    def evict(self, tree: MambaRadixCache, kv_units: int, states: int) -> EvictResult:
        """The lifecycle found too little memory: the pool already popped every cached
        block it could (allocations pop as they go), so there is nothing to evict."""
        return EvictResult(0, 0, array("q"), [])

    def _evicted(self, key: Hashable) -> bool:
        """The pool popped `key` from its queue: remove what it held from the tree.
        False for a block the tree has locked (vLLM's running request holds it)."""
        assert isinstance(key, tuple)
        if key[0] == "kv":
            return self._evicted_page(int(key[1]))
        return self._evicted_state(int(key[1]))

    def _evicted_state(self, slot: int) -> bool:
        assert self.slots is not None
        node = self.index.slot_node.get(slot)
        if node is None:  # a state already gone: a leftover group block
            self.slots.slot_released(slot)
            return True
        if node.st.lock or (not node.children and node.kv.lock):
            # a running request's own kept state, released but locked by our lifecycle
            # (its path): vLLM evicts it; the tree lets it go once the request does
            self.dead.add(node)
            return True
        self._free(self.tree.evict_state_of(node))
        return True

    def _sweep(self) -> None:
        """Evict the states vLLM evicted while a running request locked them."""
        for node in [n for n in self.dead if not n.st.lock and (n.children or not n.kv.lock)]:
            self.dead.discard(node)
            if node.parent is not None and node.state is not None:
                self._free(self.tree.evict_state_of(node))

    def on_request_done(self) -> None:
        self._sweep()

    def _evicted_page(self, page: int) -> bool:
        """A KV block copy is evicted. The tree loses the block when its hash's last copy
        goes: every state at or below it is unreachable then."""
        assert self.kv is not None
        h = self.page_hash.get(page)
        if h is not None and list(self.hash_pages[h]) == [page]:
            node = self._tree_node(h)
            if node is not None:
                if node.kv.lock:
                    return False
                self._evict_below(node)
            self.tree_copy.pop(h, None)
        self._unhash(page)
        self.kv.page_released(page)
        return True

    def _tree_node(self, h: int) -> TreeNode | None:
        """The tree node holding the block of hash `h`, if the tree holds it."""
        page = self.tree_copy.get(h)
        if page is None or self.tree_copy_hash.get(page) != h:
            return None
        return self.index.page_node.get(page)

    def _evict_below(self, top: TreeNode) -> None:
        """A KV block the tree holds is gone: every state at or below it is unreachable."""
        below, stack = [], [top]
        while stack:
            node = stack.pop()
            if node.state is not None:
                below.append(node)
            stack.extend(node.children.values())
        for node in sorted(below, key=_depth, reverse=True):
            if node.parent is not None and node.state is not None:
                self._free(self.tree.evict_state_of(node))

    def _free(self, r: EvictResult) -> None:
        """Return what the tree let go of to the allocators (``CacheManager._release``)."""
        assert self.kv is not None and self.slots is not None
        if r.freed_kv:
            self.kv.free(r.freed_kv)
        if r.freed_states:
            self.slots.free(r.freed_states)
        cache = self.ctx.cache
        if cache is not None:
            cache.evictions["kv_tokens"] += len(r.freed_kv)
            cache.evictions["states"] += len(r.freed_states)


def _depth(node: TreeNode) -> int:
    d, x = 0, node
    while x.parent is not None:
        d, x = d + len(x.key), x.parent
    return d


def _chain(parent: int, tokens: array[int], j: int, block: int) -> int:
    """The hash of block `j` of `tokens`, chained on its parent's: it covers the whole
    prefix, as vLLM's ``hash_block_tokens`` (``kv_cache_utils.py:953-1041``)."""
    return hash((parent, tuple(tokens[j * block : (j + 1) * block])))


class _TreeIndex:
    """Tree listener: the node holding each state slot and each KV page (the tree's
    pages are vLLM's blocks). A node may have lost its state by the time
    ``state_removed`` is called, so the state map is kept both ways."""

    def __init__(self, block: int) -> None:
        self.block = block
        self.slot_node: dict[int, TreeNode] = {}
        self.page_node: dict[int, TreeNode] = {}
        self._slot_of: dict[TreeNode, int] = {}

    def _pages(self, node: TreeNode) -> list[int]:
        b = self.block
        return [int(node.value[k]) // b for k in range(0, len(node.value), b)]

    def node_added(self, node: TreeNode) -> None:
        for page in self._pages(node):
            self.page_node[page] = node

    def node_split(self, upper: TreeNode, lower: TreeNode) -> None:
        for page in self._pages(upper):
            self.page_node[page] = upper

    def node_removed(self, node: TreeNode) -> None:
        for page in self._pages(node):
            if self.page_node.get(page) is node:
                del self.page_node[page]

    def state_added(self, node: TreeNode) -> None:
        assert node.state is not None
        self.slot_node[node.state] = node
        self._slot_of[node] = node.state

    def state_removed(self, node: TreeNode) -> None:
        slot = self._slot_of.pop(node, None)
        if slot is not None:
            del self.slot_node[slot]

    def tree_reset(self) -> None:
        self.slot_node.clear()
        self.page_node.clear()
        self._slot_of.clear()
