"""`CacheManager`: the request lifecycle on top of the tree and the pools.

The calls a scheduler makes, in SGLang's order (0.5.15.post1, reference doc
§9-§11), each either completing or leaving pools, tree and request as they were:

    match(req, key_len)      admission lookup: match, stage the copy-on-write
                             of the matched state (a destination slot)
    unmatch(req)             admission refused after the match: give the staged
                             slot back (SGLang #16067 / #21404)
    lock(req) / unlock(req)  pin the matched path while the request runs
    alloc_extend(reqs, lens) state head-room, rows, running and track slots,
                             the deferred copy-on-write, KV for the next lens
                             tokens of each request (evicting when short)
    decode_fits(reqs)        check_decode_mem: evict, then whether one more
                             token per request fits
    alloc_decode(reqs)       KV for one more token per request
    track(req, position)     extra_buffer: the forward wrote the state after
                             `position` tokens into the next track slot
    cache_unfinished(req)    checkpoint what is computed (chunk end, prompt end)
    finish(req, insert)      cache what is finished and give everything back
    abort(req)               give everything back, cache nothing

Strategies (SGLang's `--mamba-radix-cache-strategy`):

* `no_buffer`: a checkpoint is a copy of the running state at the position
  where the request stopped (page_size 1 only).
* `extra_buffer`: the forward writes tracked states into `track_slots`
  ping-pong slots at chunk-aligned positions; a checkpoint donates the slot
  holding the newest tracked state to the tree (zero copy) and the request gets
  a fresh one. Page sizes > 1 are allowed.

On an SGLang compat tree the manager applies that release's rules where they
differ from ours (`rules`, the release named by `tree.compat`):

* SGLang 0.5.15.post1: `state_headroom` 3 slots per request of a prefill batch,
  and KV eviction of the whole allocation when it does not fit (ours evicts
  only the shortfall and only the slots the batch will take); a checkpoint
  matches its key again to find the node to lock.
* SGLang 0.5.23: the slots the batch takes (`ensure_mamba_capacity`,
  `mem_cache/allocation.py:298-324`) and KV eviction of the shortfall
  (`evict_to_free_tokens`, `allocator/base.py:155-169`), as ours; a decode step
  evicts for a page per running request (`alloc_for_decode`: `alloc_token_slots`
  / `alloc_paged_token_slots_decode`, `allocation.py:585, 624-660`); a
  checkpoint locks the node its insert ended on, without matching again
  (`unified_radix_cache.py:1285-1310`).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from mambaradix.core.compat import SGLANG_0_5_15, SGLANG_CURRENT, resolve_compat
from mambaradix.core.node import TreeNode
from mambaradix.core.ownership import KVOwner
from mambaradix.core.results import EvictResult
from mambaradix.core.tree import MambaRadixCache
from mambaradix.lifecycle.request import Request
from mambaradix.lifecycle.strategy import PAGE_RULE, check_strategy, takes_page
from mambaradix.pools._checks import as_int

SGLANG_STATE_HEADROOM = 3  # MAMBA_STATE_PER_REQ_PREFIX_CACHE: 2 ping-pong + 1 running


class SlotAllocator(Protocol):
    """State slots. `alloc` and `free` mutate; the rest are pure. `free_list_size` is one
    of the optional capabilities `pools.defaults.SlotPoolDefaults` declares with its
    default (a pool inherits it or overrides it)."""

    def alloc(self, n: int) -> Any: ...
    def free(self, slots: Any) -> None: ...
    def available_size(self) -> int: ...
    def free_list_size(self) -> int: ...
    def is_free(self, i: int) -> bool: ...
    @property
    def capacity(self) -> int: ...


class KVAllocator(Protocol):
    """KV indices. `alloc`, `alloc_extend` and `free` mutate; the rest are pure.
    `free_list_size`, `page_size`, `alloc_extend` and `reclaims_cache` are the optional
    capabilities `pools.defaults.KVPoolDefaults` declares with their defaults."""

    def alloc(self, n: int) -> array[int] | None: ...
    def alloc_extend(self, last_index: int | None, n: int) -> array[int] | None: ...
    def free(self, indices: Any) -> None: ...
    def available_size(self) -> int: ...
    def free_list_size(self) -> int: ...
    def is_free(self, i: int) -> bool: ...
    @property
    def capacity(self) -> int: ...
    @property
    def page_size(self) -> int: ...
    @property
    def reclaims_cache(self) -> bool: ...


class StatePool(Protocol):
    def copy(self, src: Any, dst: Any) -> None: ...
    def clear(self, slots: Any) -> None: ...


class RowTable(Protocol):
    """The request-to-token table: `alloc`, `free` and `write` mutate."""

    def alloc(self) -> int | None: ...
    def free(self, row: int) -> None: ...
    def write(self, row: int, start: int, indices: Any) -> None: ...
    def read(self, row: int, start: int, end: int) -> array[int]: ...
    def available_size(self) -> int: ...
    @property
    def max_context(self) -> int | None:
        """Positions per row (None: the table sets no limit)."""


Evictor = Callable[[MambaRadixCache, int, int], EvictResult]


def lru_evictor(tree: MambaRadixCache, kv_tokens: int, states: int) -> EvictResult:
    """The tree's own LRU eviction (SGLang's rule)."""
    return tree.evict(kv_tokens=kv_tokens, states=states)


class CacheManager:
    """Composes the tree and the pools into the request lifecycle.

    `evictor(tree, kv_tokens, states)` frees at least that much when an
    allocation falls short (default: the tree's LRU eviction); eviction
    policies plug in here. `track_slots` is the ping-pong size of
    extra_buffer (2, SGLang's default with the overlap scheduler).
    `page_checkpoints`: no_buffer on a paged tree, for a caller that
    checkpoints only at page ends and never inserts at finish (vLLM's align
    mode, the replay's `vllm` row); a checkpoint elsewhere is refused by the
    tree.
    `sglang_rules`: whose scheduler rules apply: None for the tree's (its
    compat), False for ours, True for the tree's SGLang release (SGLang's
    current one on a tree of ours), or a release name (`core.compat`).
    """

    def __init__(
        self,
        tree: MambaRadixCache,
        kv: KVAllocator,
        slots: SlotAllocator,
        states: StatePool,
        rows: RowTable,
        *,
        strategy: str = "no_buffer",
        track_slots: int = 2,
        evictor: Evictor = lru_evictor,
        sglang_rules: bool | str | None = None,
        page_checkpoints: bool = False,
    ) -> None:
        _check_setup(tree, kv, strategy, track_slots, page_checkpoints)
        _attach_kv_owner(tree, kv)
        self.rules = rules_release(tree.compat, sglang_rules)  # an SGLang release, or None
        self.tree, self.kv, self.slots, self.states, self.rows = tree, kv, slots, states, rows
        self.strategy = strategy
        self.extra_buffer = strategy == "extra_buffer"
        self.track_slots = track_slots if self.extra_buffer else 0
        self.page_size = tree.page_size
        self.sglang = self.rules is not None
        self._evicts_whole = self.rules == SGLANG_0_5_15  # the whole allocation, not the shortfall
        self.evictor = evictor
        self.active: set[Request] = set()  # admitted: hold a row, slots, KV, a lock
        self.staged: set[Request] = set()  # matched, holding a copy-on-write slot
        self.evictions = {"kv_tokens": 0, "states": 0}

    # ------------------------------------------------------------- eviction

    def _release(self, result: EvictResult) -> None:
        """Return what the tree let go of to the pools."""
        if result.freed_kv:
            self.kv.free(result.freed_kv)
        if result.freed_states:
            self.slots.free(result.freed_states)
        self.evictions["kv_tokens"] += len(result.freed_kv)
        self.evictions["states"] += len(result.freed_states)

    def release(self, result: EvictResult) -> None:
        """Return to the pools what a policy evicted itself, outside an allocation
        (`evictor` results are returned here already)."""
        self._release(result)

    def evict_kv_for(self, n: int) -> None:
        """Make room for n KV tokens: SGLang 0.5.15.post1 evicts n whenever
        fewer are free (evict_from_tree_cache); 0.5.23 and ours the shortfall."""
        free = self.kv.available_size()
        if free < n:
            self._release(self.evictor(self.tree, n if self._evicts_whole else n - free, 0))

    def evict_states_for(self, n: int) -> None:
        free = self.slots.available_size()
        if free < n:
            self._release(self.evictor(self.tree, 0, n - free))

    def alloc_slot(self) -> int | None:
        """One state slot, evicting one unlocked state if none is free."""
        got = self.slots.alloc(1)
        if got is None:
            self._release(self.evictor(self.tree, 0, 1))
            got = self.slots.alloc(1)
        return None if got is None else int(got[0])

    # ------------------------------------------------------------ admission

    def match(self, req: Request, key_len: int) -> bool:
        """Look up tokens[:key_len] and stage the copy-on-write of the matched
        state into a destination slot (SGLang's `match_prefix(cow_mamba=True)`).
        False, with nothing staged, if no slot can be had for it."""
        if req in self.active or req.node is not None:
            raise ValueError("request is already matched or admitted")
        key_len = as_int(key_len, "key_len")
        if not 0 <= key_len <= req.total_len:
            raise ValueError(f"key_len={key_len} outside [0, {req.total_len}]")
        m = self.tree.match_prefix(req.tokens[:key_len], req.extra_key)
        if m.prefix_len:
            if req.slot is None:
                dst = self._cow_destination(m.node)
                if dst is None:
                    return False
                req.slot = dst
                self.staged.add(req)
            req.cow_src = m.node.state
        req.node, req.prefix_kv = m.node, m.kv_indices
        req.prefix_len = req.computed = req.cached_len = m.prefix_len
        req.kv_hit_len, req.branching_len = m.kv_hit_len, m.branching_len
        return True

    def _cow_destination(self, node: Any) -> int | None:
        # The source is pinned while a slot is found: an allocator that evicts as it
        # allocates (the replay's vLLM block pool) must not take the state being copied.
        receipt = self.tree.inc_lock_ref(node)
        got = self.slots.alloc(1)
        if got is None:  # evict one state
            self._release(self.evictor(self.tree, 0, 1))
            got = self.slots.alloc(1)
        self.tree.dec_lock_ref(receipt)
        return None if got is None else int(got[0])

    def unmatch(self, req: Request) -> None:
        """Undo `match` for a request that was not admitted."""
        if req.row is not None or req.lock is not None:
            raise ValueError("request is admitted: abort it instead")
        if req.slot is not None and req not in self.staged:
            raise ValueError("request was matched by another manager: its slot is not ours")
        if req.slot is not None:
            self.slots.free([req.slot])
        self.staged.discard(req)
        _reset(req)

    def lock(self, req: Request) -> None:
        if req.node is None or req.lock is not None:
            raise ValueError("lock needs a matched, unlocked request")
        req.lock = self.tree.inc_lock_ref(req.node)

    def unlock(self, req: Request) -> None:
        if req.lock is None or req.row is not None:
            raise ValueError("unlock is for a locked request that holds no memory yet")
        self.tree.dec_lock_ref(req.lock)
        req.lock = None

    # ----------------------------------------------------------- allocation

    def alloc_extend(self, reqs: Sequence[Request], lens: Sequence[int]) -> bool:
        """Memory for one prefill batch: `lens[i]` more tokens of `reqs[i]`
        (each locked, matched or continuing). False, with every request and
        pool as before (evictions aside), if it cannot be had."""
        _check_batch(reqs, lens, self.rows.max_context)
        self.evict_states_for(self._state_headroom(reqs))
        taken = self._take_rows_and_slots(reqs)
        if taken is None:
            return False
        need = sum(lens) + (len(reqs) * self.page_size if self.page_size > 1 else 0)
        self.evict_kv_for(need)
        fresh = self._alloc_kv_each(reqs, lens)
        if fresh is None:
            self._give_back(taken)
            return False
        self._start_states(reqs)
        for req, got in zip(reqs, fresh, strict=True):
            assert req.row is not None
            self.rows.write(req.row, req.computed, got)
            req.computed += len(got)
            self.active.add(req)
            self.staged.discard(req)
        return True

    def _state_headroom(self, reqs: Sequence[Request]) -> int:
        """Free slots wanted before a prefill batch (SGLang 0.5.15.post1's
        alloc_req_slots evicts until 3 per request are free; 0.5.23 and ours: the
        slots this batch takes)."""
        if self.rules == SGLANG_0_5_15:
            return SGLANG_STATE_HEADROOM * len(reqs)
        return sum(self._slots_needed(req) for req in reqs)

    def _slots_needed(self, req: Request) -> int:
        track = self.track_slots if req.track_slots is None else 0
        return (req.slot is None) + track

    def _take_rows_and_slots(self, reqs: Sequence[Request]) -> list[tuple[Request, str]] | None:
        """Rows, running slots and track slots for requests that lack them;
        what was taken (for `_give_back`), or None if the pools are short."""
        new_rows = sum(req.row is None for req in reqs)
        new_slots = sum(self._slots_needed(req) for req in reqs)
        if new_rows > self.rows.available_size() or new_slots > self.slots.available_size():
            return None
        taken: list[tuple[Request, str]] = []
        for req in reqs:
            if req.row is None:
                req.row = self.rows.alloc()
                assert req.row is not None
                self.rows.write(req.row, 0, req.prefix_kv)
                taken.append((req, "row"))
            if req.slot is None:
                req.slot, req.needs_clear = int(self.slots.alloc(1)[0]), True
                taken.append((req, "slot"))
            if self.track_slots and req.track_slots is None:
                req.track_slots = [int(s) for s in self.slots.alloc(self.track_slots)]
                req.next_track = 0
                taken.append((req, "track"))
        return taken

    def _give_back(self, taken: list[tuple[Request, str]]) -> None:
        for req, what in reversed(taken):
            if what == "row":
                assert req.row is not None
                self.rows.free(req.row)
                req.row = None
            elif what == "slot":
                self.slots.free([req.slot])
                req.slot, req.needs_clear = None, False
            else:
                self.slots.free(req.track_slots)
                req.track_slots = None

    def _alloc_kv_each(
        self, reqs: Sequence[Request], lens: Sequence[int]
    ) -> list[array[int]] | None:
        got: list[array[int]] = []
        for req, n in zip(reqs, lens, strict=True):
            indices = self._alloc_kv_for(req, n)
            if indices is None:
                for back in got:  # all or nothing
                    self.kv.free(back)
                return None
            got.append(indices)
        return got

    def _alloc_kv_for(self, req: Request, n: int) -> array[int] | None:
        """n KV indices continuing req's row (paged: the tail of its last page first)."""
        last = None
        # The request owns the page of its last token; at page 1 that page has no room.
        if self.page_size > 1 and req.computed > req.prefix_len:
            assert req.row is not None
            last = self.rows.read(req.row, req.computed - 1, req.computed)[0]
        return self.kv.alloc_extend(last, n)

    def _start_states(self, reqs: Sequence[Request]) -> None:
        """The deferred copy-on-write and the zeroing of fresh running slots."""
        src = [r.cow_src for r in reqs if r.cow_src is not None]
        dst = [r.slot for r in reqs if r.cow_src is not None]
        clear = [r.slot for r in reqs if r.cow_src is None and r.needs_clear]
        if src:
            self.states.copy(src, dst)
        if clear:
            self.states.clear(clear)
        for req in reqs:
            req.cow_src, req.needs_clear = None, False

    def decode_fits(self, reqs: Sequence[Request]) -> bool:
        """SGLang's check_decode_mem: evict for the pages the next decode step
        needs, then whether they are free."""
        need = self.decode_need(reqs)
        self.evict_kv_for(need)
        return self.kv.available_size() >= need

    def decode_need(self, reqs: Sequence[Request]) -> int:
        """KV tokens the next decode step takes (a page per request on a page end)."""
        p = self.page_size
        return p * sum(1 for r in reqs if r.computed % p == 0)

    def alloc_decode(self, reqs: Sequence[Request]) -> bool:
        """KV for one more token of every request; False (nothing changed) if short."""
        if len(set(map(id, reqs))) != len(reqs):
            raise ValueError("alloc_decode needs distinct requests")
        context = self.rows.max_context
        for req in reqs:
            self._check_active(req)
            if req.computed >= req.total_len:
                raise ValueError("a request has no token left to decode")
            if context is not None and req.computed >= context:
                raise ValueError(f"a request's row is full: {context} positions (max_context)")
        over = len(reqs) * self.page_size  # SGLang evicts for this much (paged: a page each)
        self.evict_kv_for(over if self.sglang else self.decode_need(reqs))
        fresh = self._alloc_kv_each(reqs, [1] * len(reqs))
        if fresh is None:
            return False
        for req, got in zip(reqs, fresh, strict=True):
            assert req.row is not None
            self.rows.write(req.row, req.computed, got)
            req.computed += 1
        return True

    def track(self, req: Request, position: int) -> None:
        """extra_buffer: the forward wrote the state after `position` tokens
        into `track_slots[next_track]`; the ping-pong moves on."""
        position = as_int(position, "position")
        if req.track_slots is None or not 0 < position <= req.computed:
            raise ValueError(f"cannot track position {position} of this request")
        if position < req.prefix_len:  # the forward never ran there: no state to cache
            raise ValueError(
                f"position {position} lies below the cached prefix ({req.prefix_len} tokens)"
            )
        if position % self.page_size:
            raise ValueError(f"tracked position {position} is not page aligned")
        req.last_track_len = position
        req.next_track = (req.next_track + 1) % len(req.track_slots)

    def track_slot(self, req: Request) -> int:
        """The slot the next tracked state is written into."""
        assert req.track_slots is not None
        return req.track_slots[req.next_track]

    # ---------------------------------------------------------- checkpoints

    def cache_unfinished(self, req: Request) -> TreeNode | None:
        """Checkpoint a running request: no_buffer copies its running state
        (at `computed`) into a tree slot; extra_buffer donates the newest
        tracked state (at `last_track_len`; nothing to do if none). The tree
        takes the KV up to there and the request's lock moves to that node.
        Returns the node if it now holds a state the tree did not have."""
        self._check_active(req)
        if self.extra_buffer:
            if req.last_track_len is None:
                return None
            cache_len, donated = req.last_track_len, self._donate_tracked(req)
        else:
            cache_len, donated = req.computed, self.alloc_slot()
            if donated is not None:
                assert req.slot is not None
                self.states.copy([req.slot], [donated])
        if donated is None:
            return None  # every state is locked: skip (upstream #36770 crashes here)
        return self._insert_checkpoint(req, cache_len, donated)

    def _donate_tracked(self, req: Request) -> int | None:
        """The keep slot goes to the tree; a fresh slot takes its place."""
        fresh = self.alloc_slot()
        if fresh is None:
            return None
        assert req.track_slots is not None
        keep = req.keep_track_index()
        donated, req.track_slots[keep] = req.track_slots[keep], fresh
        return donated

    def _insert_checkpoint(self, req: Request, cache_len: int, donated: int) -> TreeNode | None:
        assert req.row is not None and req.lock is not None
        key = req.tokens[:cache_len]
        r = self.tree.insert(
            key, self.rows.read(req.row, 0, cache_len), donated, req.prefix_len, req.extra_key
        )
        self._free_kv(r.freed_kv)
        if r.state_existed:
            self.slots.free([donated])
        node = self._checkpoint_node(r.node)
        self.rows.write(req.row, req.prefix_len, self.tree.path_kv(node, req.prefix_len))
        new_lock = self.tree.inc_lock_ref(node)
        self.tree.dec_lock_ref(req.lock)
        req.lock, req.node, req.prefix_len = new_lock, node, cache_len
        req.last_track_len = None
        return None if r.state_existed else node

    def _checkpoint_node(self, node: TreeNode | None) -> TreeNode:
        """The node a checkpoint's lock moves to: the one its insert ended on (it holds
        the key's state now). SGLang 0.5.15.post1 (and ours) match the key again,
        refreshing its path: `touch` does the same without the walk; 0.5.23 takes the
        node, refreshing nothing."""
        assert node is not None
        if self.rules == SGLANG_0_5_15 or self.rules is None:
            self.tree.touch(node)
        return node

    def finish(self, req: Request, insert: bool = True) -> TreeNode | None:
        """SGLang's cache_finished_req: insert what is computed (no_buffer: up
        to `computed`, donating the running slot; extra_buffer: up to the newest
        tracked state, donating its slot), free the rest, release the row.
        With insert=False nothing is cached. Returns the node holding the state
        if the tree did not have it before, else None."""
        self._check_active(req)
        assert req.row is not None and req.lock is not None
        node = self._insert_finished(req) if insert else None
        if not insert:
            self._free_kv(self.rows.read(req.row, req.prefix_len, req.computed))
        self._free_slots(req, keep_tracked=node is not None and self.extra_buffer)
        if node is None or self.extra_buffer:  # no_buffer: a stored state is the running slot
            assert req.slot is not None
            self.slots.free([req.slot])
        self.tree.dec_lock_ref(req.lock)
        self.rows.free(req.row)
        self.active.discard(req)
        _reset(req)
        return node

    def _insert_finished(self, req: Request) -> TreeNode | None:
        assert req.row is not None
        committed = req.computed
        state: int | None
        if self.extra_buffer:
            cache_len = req.last_track_len or 0
            state = req.track_slots[req.keep_track_index()] if req.track_slots else None
        else:
            cache_len, state = committed, req.slot
        self._free_kv(self.rows.read(req.row, max(cache_len, req.prefix_len), committed))
        if cache_len == 0:
            return None
        assert state is not None
        key = req.tokens[:cache_len]
        r = self.tree.insert(
            key, self.rows.read(req.row, 0, cache_len), state, req.prefix_len, req.extra_key
        )
        self._free_kv(r.freed_kv)
        return None if r.state_existed else r.node

    def _free_slots(self, req: Request, keep_tracked: bool) -> None:
        """Free the track slots (all, or all but the one the tree now holds)."""
        if req.track_slots is None:
            return
        keep = req.keep_track_index() if keep_tracked else None
        self.slots.free([s for i, s in enumerate(req.track_slots) if i != keep])

    def abort(self, req: Request) -> None:
        """Give back everything the request holds (cached prefix stays). Works
        at any point: matched but not admitted, or admitted."""
        if req.row is None:
            if req.lock is not None:
                self.tree.dec_lock_ref(req.lock)
                req.lock = None
            self.unmatch(req)
            return
        self.finish(req, insert=False)

    # --------------------------------------------------------------- helpers

    def _free_kv(self, indices: array[int]) -> None:
        if indices:
            self.kv.free(indices)

    def _check_active(self, req: Request) -> None:
        if req not in self.active:
            raise ValueError("request is not admitted (or already finished)")

    # ------------------------------------------------------------- checking

    def check_conservation(self) -> None:
        """Every KV index and state slot is free, in the tree, or held by one
        active request, exactly once (reference doc I9, I10)."""
        from mambaradix.lifecycle.conservation import check_conservation

        check_conservation(self)


def _reset(req: Request) -> None:
    """Forget everything the cache set on a request (SGLang's reset_for_retract)."""
    req.row = req.slot = req.track_slots = req.node = req.lock = req.cow_src = None
    req.last_track_len = req.branching_len = None
    req.needs_clear = False
    req.next_track = req.prefix_len = req.computed = 0
    req.prefix_kv = array("q")


def _check_batch(reqs: Sequence[Request], lens: Sequence[int], context: int | None) -> None:
    if len(reqs) != len(lens) or len(set(map(id, reqs))) != len(reqs):
        raise ValueError("alloc_extend needs distinct requests, one extend length each")
    for req, n in zip(reqs, lens, strict=True):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"extend lengths must be positive ints, got {n!r}")
        if req.lock is None or req.computed + n > req.total_len:
            raise ValueError("every request must be locked and have that many tokens left")
        if context is not None and req.computed + n > context:
            raise ValueError(
                f"extending a request to {req.computed + n} tokens overflows its row of "
                f"the request table ({context} positions, max_context)"
            )


def rules_release(compat: str | None, sglang_rules: bool | str | None) -> str | None:
    """The SGLang release whose scheduler rules a manager on a tree of `compat` (resolved)
    applies (None: ours); TypeError / ValueError naming `sglang_rules` (the one home of its
    rule: `Engine` asks here before it builds anything)."""
    if sglang_rules is None:
        return compat
    if sglang_rules is False:
        return None
    if sglang_rules is True:
        return compat or SGLANG_CURRENT
    if not isinstance(sglang_rules, str):
        kind = type(sglang_rules).__name__
        raise TypeError(f"sglang_rules must be None, a bool or a release name, got {kind}")
    try:
        return resolve_compat(sglang_rules)
    except ValueError:
        raise ValueError(
            f"sglang_rules must be an SGLang release name, got {sglang_rules!r}"
        ) from None


def _attach_kv_owner(tree: MambaRadixCache, kv: Any) -> None:
    """The KV pool answers for the KV indices the tree takes (`core/ownership.py`),
    when it can (the `pools.kv` allocators) and the tree is still empty."""
    if isinstance(kv, KVOwner) and not tree.root.children:
        tree.attach_kv_owner(kv)


def _check_setup(
    tree: MambaRadixCache, kv: KVAllocator, strategy: str, track_slots: int, page_checkpoints: bool
) -> None:
    check_strategy(strategy)
    if not takes_page(strategy, tree.page_size) and page_checkpoints is not True:
        raise ValueError(
            f"page_size must be 1 with strategy='no_buffer' ({PAGE_RULE}); "
            "use strategy='extra_buffer' for larger pages"
        )
    if strategy == "extra_buffer" and (isinstance(track_slots, bool) or track_slots not in (1, 2)):
        raise ValueError(f"track_slots must be 1 or 2, got {track_slots!r}")
    kv_page = kv.page_size
    if kv_page != tree.page_size:
        raise ValueError(
            f"the KV allocator's page_size ({kv_page}) differs from the tree's ({tree.page_size})"
        )
