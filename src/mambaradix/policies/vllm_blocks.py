"""vLLM 0.33.0's block accounting for the `vllm` row: what each running request holds, when
it lets go, the block hashes vLLM has cached, and what the tree loses when vLLM evicts.

The `vllm` policy (`policies/vllm.py`) decides where states are kept; `BlockTables` keeps
vLLM's books on the replay's block pool (`policies/vllm_pool.py`) at the moments vLLM would
(file:line in ``vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl``):

* a lookup takes its hit's blocks before the step allocates (`lookup`, pinned until the
  request is admitted, `admit`; ``kv_cache_manager.py:590-610``, ``block_pool.py:792-814``);
  a hit references the oldest cached copy of each block hash (``get_one_block``);
* a request's block table: its hit's copies, then its own pages, read from its row before a
  checkpoint points the row at the tree's copies (`record`); full blocks get their hash;
* at each of vLLM's step boundaries the state blocks behind the running one are let go,
  kept ones cached, and the block the step's state is written from stays held beside the
  new one (`boundary`; ``single_type_kv_cache_manager.py:1629-1657, 1797-1923``); a state
  the step's forward exports has its block from the step's start;
* at the end, the attention blocks tail first (full ones cached, the partial one freed),
  then each Mamba group's kept states (`release`; ``single_type_kv_cache_manager.py:
  591-601``, ``kv_cache_coordinator.py:404-412``);
* when the pool pops a block (`evicted`): a state's first group block evicts the state from
  the tree; a KV hash's last copy evicts every state at or below it.

Block hashes are chained over the whole prefix, as vLLM's (``kv_cache_utils.py:953-1041``),
and kept per pool copy: a block recomputed after a shorter hit is a second copy
(``block_pool.py:36-131``), the hash lives while any copy is held or cached.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable
from dataclasses import dataclass, field

from mambaradix.core.node import TreeNode
from mambaradix.core.results import EvictResult
from mambaradix.lifecycle import CacheManager, Request
from mambaradix.lifecycle.manager import RowTable
from mambaradix.policies.kinds import FINISH
from mambaradix.policies.seam import PolicyTree
from mambaradix.policies.vllm_pool import BlockPool, PoolKV, PoolSlots
from mambaradix.policies.vllm_split import checkpoint_position

__all__ = ["BlockTables", "Plan", "Run", "chain_hash"]


@dataclass
class Plan:
    """Where vLLM's prefill steps end for one admission, and which states it keeps."""

    hit: int
    junction: int
    ends: list[int]  # vLLM's step ends, the last at the request's length
    kept: set[int]  # positions whose state is kept
    exports: dict[int, int]  # step start -> the kept state its forward exports
    stops: list[int]  # where our scheduler must end a step (vLLM's ends, exported states)


@dataclass
class Run:
    """A running request's blocks, as vLLM's block table holds them."""

    plan: Plan
    pages: list[int] = field(default_factory=list)  # KV page of each block, hit ones first
    untouched: set[int] = field(default_factory=set)  # hit pages the pool no longer had
    hashes: list[int] = field(default_factory=list)  # block hashes of pages[:len(hashes)]
    pending: list[tuple[int, int]] = field(default_factory=list)  # (position, slot) held
    previous: list[Hashable] = field(default_factory=list)  # (`boundary`)
    previous_at: int = -1  # the position whose state they stand for
    export: list[Hashable] = field(default_factory=list)  # held for an exported kept state
    finish_at: int = 0  # the position of a state kept at the end (interval retention)


def chain_hash(parent: int, tokens: array[int], j: int, block: int) -> int:
    """The hash of block `j` of `tokens`, chained on its parent's: it covers the whole
    prefix, as vLLM's ``hash_block_tokens`` (``kv_cache_utils.py:953-1041``)."""
    return hash((parent, tuple(tokens[j * block : (j + 1) * block])))


class BlockTables:
    """vLLM's books for the running requests and its cached blocks (module docstring)."""

    def __init__(
        self,
        pool: BlockPool,
        kv: PoolKV,
        slots: PoolSlots,
        tree: PolicyTree,
        rows: RowTable,
        cache: CacheManager | None,
    ) -> None:
        self.pool, self.kv, self.slots, self.tree = pool, kv, slots, tree
        self.rows, self.cache = rows, cache
        self.block = kv.block
        self.runs: dict[Request, Run] = {}
        self.page_hash: dict[int, int] = {}  # pool copy (held or queued) -> its hash
        self.hash_pages: dict[int, dict[int, None]] = {}  # hash -> its copies, oldest first
        self.tree_copy: dict[int, int] = {}  # hash -> the page the tree holds it on
        self.tree_copy_hash: dict[int, int] = {}  # the reverse
        self.index = TreeIndex(self.block)
        tree.add_listener(self.index)
        self.dead: set[TreeNode] = set()  # evicted by vLLM while our lifecycle locked them
        self.duplicate_states = 0  # kept states the tree had already (vLLM holds two copies)
        self._pins: dict[int, tuple[list[Hashable], list[tuple[int, int]]]] = {}
        self._exports: dict[int, list[Hashable]] = {}  # id(request) -> blocks held for it
        pool.evict = self.evicted

    # ---------------------------------------------------------------- lookup

    def kv_reach(self, req: Request) -> int:
        """How far the request's blocks are cached, capped at ``tokens - 1``."""
        cap = checkpoint_position(req.total_len, self.block) // self.block
        tokens, b, h, reach = req.tokens, self.block, 0, 0
        while reach < cap:
            h = chain_hash(h, tokens, reach, b)
            if h not in self.hash_pages:
                break
            reach += 1
        return reach * b

    def lookup(self, req: Request) -> None:
        """vLLM's lookup takes the hit's blocks before the step allocates anything: pin
        them (our match may take a slot, evicting as it goes) until `admit`."""
        self.sweep()
        self.unpin(req)
        m = self.tree.match_prefix(req.tokens[: req.total_len - 1], req.extra_key, read_only=True)
        copies = self._hit_copies(req, m.prefix_len, m.kv_indices)
        keys: list[Hashable] = [("kv", page) for page, _ in copies]
        if m.prefix_len and m.node.state is not None:
            keys += self.slots.keys(m.node.state)
        for key in keys:
            self.pool.pin(key)
        self._pins[id(req)] = (keys, copies)

    def _hit_copies(self, req: Request, hit: int, kv: array[int]) -> list[tuple[int, int]]:
        """(page, hash) per hit block: the oldest cached copy of each block hash
        (``BlockHashToBlockMap.get_one_block``), whichever page the tree holds."""
        b, tokens, h, out = self.block, req.tokens, 0, []
        for i in range(0, hit, b):
            h = chain_hash(h, tokens, i // b, b)
            page = int(kv[i]) // b
            out.append((next(iter(self.hash_pages[h])) if h in self.hash_pages else page, h))
        return out

    def unpin(self, req: Request) -> None:
        keys, _ = self._pins.pop(id(req), ([], []))
        for key in keys:
            self.pool.unpin(key)

    def hold_first_export(self, req: Request, plan: Plan) -> None:
        """The request's first step exports a kept state: its block, from the start."""
        self.drop_keys(self._exports.pop(id(req), []))
        if plan.hit in plan.exports:
            self._exports[id(req)] = self.hold_blocks(("export", id(req)))

    # ------------------------------------------------------------- admission

    def admit(self, req: Request, plan: Plan) -> Run:
        """The request is admitted: it references its hit's blocks (``block_pool.py:
        792-814``) and its hit state (released at its next step)."""
        stale = self.runs.pop(req, None)
        if stale is not None:  # retracted without the scheduler telling us
            self.release(stale, req, 0)
        run = self.runs[req] = Run(plan, export=self._exports.pop(id(req), []))
        pins, copies = self._pins.pop(id(req), ([], []))
        for key in pins:
            self.pool.unpin(key)
        if len(copies) != plan.hit // self.block:  # no lookup seen (a caller without it)
            copies = self._hit_copies(req, plan.hit, req.prefix_kv)
        for page, h in copies:
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
        return run

    def abort(self, req: Request) -> None:
        """A request let go unfinished: refused after its lookup, retracted or dropped
        (vLLM frees a preempted request's blocks as a finished one's,
        ``scheduler.py:1799-1843``)."""
        self.unpin(req)
        self.drop_keys(self._exports.pop(id(req), []))
        run = self.runs.pop(req, None)
        if run is not None:
            self.release(run, req, req.computed)

    # ------------------------------------------------------------ block table

    def record(self, req: Request, run: Run) -> None:
        """The request's own KV pages up to `computed`, read before a checkpoint makes
        its row point at the tree's copies; hashes of its full blocks."""
        b = self.block
        assert req.row is not None
        for start in range(len(run.pages) * b, req.computed, b):
            page = int(self.rows.read(req.row, start, start + 1)[0]) // b
            self.kv.claim(page)
            run.pages.append(page)
        tokens = req.tokens
        for j in range(len(run.hashes), req.computed // b):
            h = chain_hash(run.hashes[-1] if run.hashes else 0, tokens, j, b)
            run.hashes.append(h)
            self._hash(run.pages[j], h)

    def adopt(self, tokens: array[int], pages: list[int], first: int, slot: int | None) -> None:
        """A load from a lower tier (`replay.tiered`) put blocks `first..` of `tokens` on
        `pages` in the tree, and its state on `slot` (None: the tree had it): they are
        cached blocks now (queued, hashed, the tree's copies), as vLLM's connector
        leaves a loaded block."""
        h = 0
        for j in range(first + len(pages)):
            h = chain_hash(h, tokens, j, self.block)
            if j >= first:
                page = pages[j - first]
                self.kv.claim(page)
                self._hash(page, h)
                self.tree_copy[h] = page
                self.tree_copy_hash[page] = h
                self.pool.cache(("kv", page))
        if slot is not None:
            for key in self.slots.keys(slot):
                self.pool.cache(key)

    def _hash(self, page: int, h: int) -> None:
        self.page_hash[page] = h
        self.hash_pages.setdefault(h, {})[page] = None

    def _unhash(self, page: int) -> None:
        h = self.page_hash.pop(page, None)
        if h is not None:
            pages = self.hash_pages[h]
            del pages[page]
            if not pages:
                del self.hash_pages[h]

    def _tree_pages(self, req: Request, run: Run) -> None:
        """After a checkpoint the request's row holds the tree's pages up to it: note
        which page the tree holds each block hash on."""
        b = self.block
        assert req.row is not None
        for j in range(min(req.prefix_len // b, len(run.hashes))):
            page = int(self.rows.read(req.row, j * b, j * b + 1)[0]) // b
            self.tree_copy[run.hashes[j]] = page
            self.tree_copy_hash[page] = run.hashes[j]

    # --------------------------------------------------------- step boundaries

    def boundary(self, run: Run, end: int, next_end: int, keep: bool) -> None:
        """vLLM starts the step ``[end, next_end)`` (``MambaManager.remove_skipped_blocks``
        and ``allocate_new_blocks``, 1629-1657, 1797-1923): the request's state blocks
        before the block holding the state at `end` are let go (kept ones cached), and if
        the step writes its state into a new block, the block holding the state at `end`
        stays held beside it. Ours has one running slot for the whole request: that
        block gets a stand-in, unless the state at `end` is kept: its copy stands in (or,
        if the tree had it already, `cached` holds the stand-in)."""
        b = self.block
        self._release_states(run, upto=(end - 1) // b * b)
        self._drop_previous(run)
        if (next_end - 1) // b != (end - 1) // b:
            if keep:
                run.previous_at = end
            else:
                self._hold_previous(run, end)
        if end in run.plan.exports:  # the step's forward exports a kept state: its block
            self.drop_keys(run.export)
            run.export = self.hold_blocks(("export", id(run)))

    def export_taken(self, run: Run) -> None:
        """The exported state is about to be copied: its held block is the copy's."""
        self.drop_keys(run.export)
        run.export = []

    def hold_blocks(self, owner: tuple[str, int]) -> list[Hashable]:
        """A state's worth of blocks held for `owner` (none if the pool has too few)."""
        keys: list[Hashable] = [(*owner, g) for g in range(self.slots.groups)]
        if self.pool.can_take(len(keys)) and self.pool.reserve(len(keys)):
            self.pool.hold(keys)
            return keys
        return []

    def drop_keys(self, keys: list[Hashable]) -> None:
        for key in keys:
            self.pool.release(key)

    def _hold_previous(self, run: Run, end: int) -> None:
        keys = self.hold_blocks(("prev", id(run)))
        if keys:
            run.previous, run.previous_at = keys, end

    def _drop_previous(self, run: Run) -> None:
        self.drop_keys(run.previous)
        run.previous = []

    def cached(self, req: Request, run: Run, node: TreeNode | None, kind: str) -> None:
        """A checkpoint was taken (`node` holds its state, None if the tree had one)."""
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

    # ------------------------------------------------------------------ end

    def _finished(self, req: Request, run: Run, node: TreeNode | None) -> None:
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
        self.release(run, req, run.finish_at)

    def _release_states(self, run: Run, upto: int) -> None:
        """Kept states at or before `upto`: cached, group by group, the later state first
        within a group (``_remove_blocks_in_range``, 1608-1627)."""
        done = sorted((s for s in run.pending if s[0] <= upto), reverse=True)
        if done:
            run.pending = [s for s in run.pending if s[0] > upto]
            self._cache_states(done)

    def _cache_states(self, states: list[tuple[int, int]]) -> None:
        for g in range(self.slots.groups):
            for _, slot in states:
                self.pool.cache(("st", slot, g))

    def release(self, run: Run, req: Request, computed: int) -> None:
        """All of a request's blocks, as ``KVCacheManager.free`` (629-638): the attention
        group's tail first (full blocks cached, the partial one freed), then each Mamba
        group's kept states not yet released. Kept states its last step had let go of
        already (a decode step past them) come first."""
        if req.row is not None:
            self.record(req, run)
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
        self.export_taken(run)

    # ------------------------------------------------------------- eviction

    def evicted(self, key: Hashable) -> bool:
        """The pool popped `key` from its queue: remove what it held from the tree.
        False for a block the tree has locked (vLLM's running request holds it)."""
        assert isinstance(key, tuple)
        if key[0] == "kv":
            return self._evicted_page(int(key[1]))
        return self._evicted_state(int(key[1]))

    def _evicted_state(self, slot: int) -> bool:
        node = self.index.slot_node.get(slot)
        if node is None:  # a state already gone: a leftover group block
            self.slots.slot_released(slot)
            return True
        if node.state_lock or (not node.children and node.kv_lock):
            # a running request's own kept state, released but locked by our lifecycle
            # (its path): vLLM evicts it; the tree lets it go once the request does
            self.dead.add(node)
            return True
        self._free(self.tree.evict_state_of(node))
        return True

    def sweep(self) -> None:
        """Evict the states vLLM evicted while a running request locked them."""
        for node in [n for n in self.dead if not n.state_lock and (n.children or not n.kv_lock)]:
            self.dead.discard(node)
            if node.parent is not None and node.state is not None:
                self._free(self.tree.evict_state_of(node))

    def _evicted_page(self, page: int) -> bool:
        """A KV block copy is evicted. The tree loses the block when its hash's last copy
        goes: every state at or below it is unreachable then."""
        h = self.page_hash.get(page)
        if h is not None and list(self.hash_pages[h]) == [page]:
            node = self._tree_node(h)
            if node is not None:
                if node.kv_lock:
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
        if r.freed_kv:
            self.kv.free(r.freed_kv)
        if r.freed_states:
            self.slots.free(r.freed_states)
        if self.cache is not None:
            self.cache.evictions["kv_tokens"] += len(r.freed_kv)
            self.cache.evictions["states"] += len(r.freed_states)


def _depth(node: TreeNode) -> int:
    d, x = 0, node
    while x.parent is not None:
        d, x = d + len(x.key), x.parent
    return d


class TreeIndex:
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
