"""The request lifecycle on top of the tree and the pools (`no_buffer` strategy).

Each request owns one running state slot and one row of the request-to-token
table. Its life, driven by a scheduler, an engine or the replay tool:

    admit(req)              match input[:-1], lock the node, copy-on-write the
                            matched state into the request's own slot
    plan_prefill(req, c)    where the prefill stops to checkpoint
    extend(req, n)          KV for the next n tokens (evicting if short)
    ... the caller runs the model over those tokens, advancing req.slot ...
    cache_unfinished(req)   checkpoint at a chunk end: the state is copied into
                            a tree slot, the tree takes the KV
    finish(req)             insert everything computed; the running slot itself
                            is donated to the tree
    abort(req)              give everything back (any point after admit)

Ownership (reference doc I9/I10): positions below `req.prefix_len` in the
request's row are tree-owned; positions in [prefix_len, computed) are the
request's own. `check_conservation()` verifies that every KV index and state
slot is free, in the tree, or held by one request, exactly once.

Identical prompts (SGLang #22935): the match is limited to input - 1 tokens so
that at least one token is computed for logits, so a state cached at the prompt
end is never usable by the same prompt again. In the default mode the prefill
therefore stops at input - 1 and checkpoints there; the last prompt token is
fed with the first decode step. compat="sglang" checkpoints at the prompt end,
as upstream does.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from mambaradix.core.results import EvictResult
from mambaradix.core.tree import LockReceipt, MambaRadixCache


class KVAllocator(Protocol):
    def alloc(self, n: int) -> array[int] | None: ...
    def free(self, indices: Any) -> None: ...
    def available_size(self) -> int: ...
    def is_free(self, i: int) -> bool: ...
    @property
    def capacity(self) -> int: ...


class SlotAllocator(Protocol):
    def alloc(self, n: int) -> Any: ...
    def free(self, slots: Any) -> None: ...
    def available_size(self) -> int: ...
    def is_free(self, i: int) -> bool: ...
    @property
    def capacity(self) -> int: ...


class StatePool(Protocol):
    def copy(self, src: Any, dst: Any) -> None: ...
    def clear(self, slots: Any) -> None: ...


class RowTable(Protocol):
    def alloc(self) -> int | None: ...
    def free(self, row: int) -> None: ...
    def write(self, row: int, start: int, indices: Any) -> None: ...
    def read(self, row: int, start: int, end: int) -> array[int]: ...


@dataclass(eq=False)
class Request:
    """One request's cache bookkeeping. `tokens` is input + output so far."""

    input_ids: array[int]
    extra_key: Any = None
    output_ids: list[int] = field(default_factory=list)
    row: int | None = None
    slot: int | None = None  # running state slot
    lock: LockReceipt | None = None
    prefix_len: int = 0  # tokens whose KV the tree owns (cache_protected_len)
    cached_len: int = 0  # prompt tokens served from the cache at admission
    kv_hit_len: int = 0  # KV matched at admission, also past the last state
    computed: int = 0  # tokens consumed by the running state; their KV exists

    @property
    def tokens(self) -> array[int]:
        return self.input_ids + array("q", self.output_ids)


Evictor = Callable[[MambaRadixCache, int, int], EvictResult]


def lru_evictor(tree: MambaRadixCache, kv_tokens: int, states: int) -> EvictResult:
    """The tree's own LRU eviction (SGLang's rule)."""
    return tree.evict(kv_tokens=kv_tokens, states=states)


class CacheManager:
    """Composes the tree and the pools into the request lifecycle.

    `evictor(tree, kv_tokens, states)` frees at least that much when an
    allocation falls short; the default is the tree's LRU eviction. Eviction
    policies (`mambaradix.replay.policies`) plug in here.
    """

    def __init__(
        self,
        tree: MambaRadixCache,
        kv: KVAllocator,
        slots: SlotAllocator,
        states: StatePool,
        rows: RowTable,
        evictor: Evictor = lru_evictor,
    ) -> None:
        if tree.page_size != 1:
            raise ValueError(
                "the no_buffer lifecycle needs page_size 1 (states sit at exact token ends)"
            )
        self.tree, self.kv, self.slots, self.states, self.rows = tree, kv, slots, states, rows
        self.evictor = evictor
        self.active: set[Request] = set()
        self.evictions = {"kv_tokens": 0, "states": 0}

    # ----------------------------------------------------------- allocation

    def _release(self, result: EvictResult) -> None:
        """Return what the tree let go of to the pools."""
        if result.freed_kv:
            self.kv.free(result.freed_kv)
        if result.freed_states:
            self.slots.free(result.freed_states)
        self.evictions["kv_tokens"] += len(result.freed_kv)
        self.evictions["states"] += len(result.freed_states)

    def alloc_kv(self, n: int) -> array[int] | None:
        """n KV indices, evicting unlocked leaves if the pool is short."""
        got = self.kv.alloc(n)
        if got is None:
            self._release(self.evictor(self.tree, n - self.kv.available_size(), 0))
            got = self.kv.alloc(n)
        return got

    def alloc_slot(self) -> int | None:
        """One state slot, evicting the LRU unlocked state if the pool is short."""
        got = self.slots.alloc(1)
        if got is None:
            self._release(self.evictor(self.tree, 0, 1))
            got = self.slots.alloc(1)
        return None if got is None else int(got[0])

    # ------------------------------------------------------------ lifecycle

    def admit(self, req: Request) -> bool:
        """Match, lock, copy-on-write. False (with nothing held) if the request
        cannot get a row and a state slot now."""
        if req.row is not None or req in self.active:
            raise ValueError("request is already admitted")
        if len(req.input_ids) == 0:
            raise ValueError("a request needs at least one input token")
        m = self.tree.match_prefix(req.input_ids[: len(req.input_ids) - 1], req.extra_key)
        lock = self.tree.inc_lock_ref(m.node)  # pins the COW source before any eviction
        row = self.rows.alloc()
        slot = self.alloc_slot() if row is not None else None
        if row is None or slot is None:
            if row is not None:
                self.rows.free(row)
            self.tree.dec_lock_ref(lock)
            return False
        if m.prefix_len:
            self.states.copy([m.node.state], [slot])
            self.rows.write(row, 0, m.kv_indices)
        else:
            self.states.clear([slot])
        req.row, req.slot, req.lock = row, slot, lock
        req.prefix_len = req.computed = req.cached_len = m.prefix_len
        req.kv_hit_len = m.kv_hit_len
        self.active.add(req)
        return True

    def plan_prefill(self, req: Request, chunk_size: int) -> list[int]:
        """Token positions at which the prefill stops and checkpoints."""
        end = len(req.input_ids) - (0 if self.tree.compat == "sglang" else 1)
        stops = list(range(req.computed + chunk_size, end, chunk_size))
        if end > req.computed:
            stops.append(end)
        return stops

    def extend(self, req: Request, n: int) -> array[int] | None:
        """Allocate KV for the next n tokens of `req` and record it in its row.
        None (nothing changed) if the pool stays short after eviction."""
        self._check_active(req)
        if n < 1 or req.computed + n > len(req.input_ids) + len(req.output_ids):
            raise ValueError(
                f"cannot extend by {n}: {req.computed} of {len(req.tokens)} tokens computed"
            )
        got = self.alloc_kv(n)
        if got is not None:
            assert req.row is not None
            self.rows.write(req.row, req.computed, got)
            req.computed += n
        return got

    def cache_unfinished(self, req: Request) -> None:
        """Checkpoint at req.computed: a copy of the running state goes to the
        tree with the KV computed so far; the request keeps running."""
        self._check_active(req)
        assert req.row is not None and req.slot is not None and req.lock is not None
        donated = self.alloc_slot()
        if donated is None:
            return  # every state is locked: skip this checkpoint (upstream #36770 crashes here)
        self.states.copy([req.slot], [donated])
        key = req.tokens[: req.computed]
        r = self.tree.insert(
            key, self.rows.read(req.row, 0, req.computed), donated, req.prefix_len, req.extra_key
        )
        self._free_kv(r.freed_kv)
        if r.state_existed:
            self.slots.free([donated])
        m = self.tree.match_prefix(key, req.extra_key)  # the tree's canonical indices
        self.rows.write(req.row, req.prefix_len, m.kv_indices[req.prefix_len :])
        new_lock = self.tree.inc_lock_ref(m.node)
        self.tree.dec_lock_ref(req.lock)
        req.lock, req.prefix_len = new_lock, m.prefix_len

    def finish(self, req: Request, insert: bool = True) -> None:
        """Insert everything computed, donate the running slot, release the row.
        With insert=False the request's private KV and slot are freed instead."""
        self._check_active(req)
        assert req.row is not None and req.slot is not None and req.lock is not None
        if not insert:
            self.abort(req)
            return
        key = req.tokens[: req.computed]
        r = self.tree.insert(
            key, self.rows.read(req.row, 0, req.computed), req.slot, req.prefix_len, req.extra_key
        )
        self._free_kv(r.freed_kv)
        if r.state_existed:
            self.slots.free([req.slot])
        self.tree.dec_lock_ref(req.lock)
        self._forget(req)

    def abort(self, req: Request) -> None:
        """Give back everything the request holds (its private KV, its slot, its
        lock, its row); the cached prefix stays in the tree."""
        self._check_active(req)
        assert req.row is not None and req.slot is not None and req.lock is not None
        self._free_kv(self.rows.read(req.row, req.prefix_len, req.computed))
        self.slots.free([req.slot])
        self.tree.dec_lock_ref(req.lock)
        self._forget(req)

    def _forget(self, req: Request) -> None:
        assert req.row is not None
        self.rows.free(req.row)
        self.active.discard(req)
        req.row = req.slot = req.lock = None
        req.prefix_len = req.computed = 0

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
        held_kv: list[int] = []
        held_slots: list[int] = []
        for req in self.active:
            assert req.row is not None and req.slot is not None
            held_kv += self.rows.read(req.row, req.prefix_len, req.computed)
            held_slots.append(req.slot)
        _check_owned("KV index", self.kv, list(self.tree.all_kv_indices()), held_kv)
        _check_owned("state slot", self.slots, self.tree.all_states(), held_slots)


def _check_owned(
    what: str, pool: KVAllocator | SlotAllocator, tree: list[int], held: list[int]
) -> None:
    owned = tree + held
    # A pool that shares a byte budget reports less than its free list as
    # available; conservation is about the free list itself.
    free = getattr(pool, "free_list_size", pool.available_size)()
    if any(pool.is_free(i) for i in owned):
        raise AssertionError(f"a {what} is owned and free at once")
    if free + len(owned) != pool.capacity or len(set(owned)) != len(owned):
        raise AssertionError(
            f"{what} leak or double ownership: free {free} + tree {len(tree)} "
            f"+ requests {len(held)} != capacity {pool.capacity} (or an entry is owned twice)"
        )
