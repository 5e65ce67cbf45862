"""vLLM's one block pool for KV and states, as the replay's `vllm` row keeps it.

vLLM 0.33.0 draws the KV of every attention group and the state of every Mamba group from
one pool of equal-sized blocks (``v1/core/block_pool.py``; file:line in the wheel
``vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl``). A block is *held* while a running
request references it, *cached* once released with a hash (a full KV block, a kept state),
or *free*. Cached blocks wait in one ``FreeKVCacheBlockQueue``
(``v1/core/kv_cache_utils.py:258-420``) and count as free: an allocation takes free blocks
first (unhashed blocks are prepended when released, ``block_pool.py:890-911``) and then pops
cached ones from the head, which evicts them (``get_new_blocks``, ``block_pool.py:706-735``).

`BlockPool` is that bookkeeping, keyed by what each block holds: ``("kv", page)`` for a page
of KV (one page of `PoolKV` is one attention block) and ``("st", slot, group)`` for one Mamba
group's part of a state slot of `PoolSlots`. The pool knows nothing of the tree: popping a
cached block calls ``evict(key)``, the `vllm` policy's mirror, which removes what the block
held from the tree (or answers False for a block the tree has locked: vLLM would not have
it in the queue, a running request holds it; it is skipped).

`PoolKV` and `PoolSlots` are the index allocators the lifecycle sees. They report the
pool's free and cached blocks as available (vLLM's ``get_num_free_blocks``) and take
blocks from it, popping as needed; `reclaims_cache` tells the scheduler's budget that the
cache is already counted (``scheduler.budget``). Which blocks are cached and in what order
is the policy's to say (`BlockPool.cache`, `touch`, `release`).
"""

from __future__ import annotations

import itertools
from array import array
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

__all__ = ["BlockPool", "PoolKV", "PoolSlots"]

Key = Hashable


class BlockPool:
    """`capacity` blocks, each free, held or cached (see the module docstring).

    Invariant: ``free + len(held) + len(queue) == capacity``."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 block, got {capacity}")
        self.capacity = capacity
        self.free = capacity
        self.held: dict[Key, int] = {}  # key -> references (running requests)
        self.queue: OrderedDict[int, Key] = OrderedDict()  # entry -> block; head: evicted next
        self._entry: dict[Key, int] = {}  # cached block -> its entry
        self._entries = itertools.count()
        self.evict: Callable[[Key], bool] = lambda key: True
        self.popped = 0  # cached blocks evicted so far
        self.pinned: set[Key] = set()  # cached blocks a lookup is about to take (skipped)

    def reclaimable(self) -> int:
        """Blocks an allocation can get: free ones and cached ones not pinned."""
        pinned = sum(1 for key in self.pinned if key in self._entry) if self.pinned else 0
        return self.free + len(self.queue) - pinned

    def reserve(self, n: int) -> bool:
        """Pop cached blocks from the head until `n` are free (the popped ones are evicted:
        `evict` mirrors each); False if the cache runs out first (only blocks the tree has
        locked were left)."""
        skipped: list[Key] = []
        while self.free < n:
            if not self.queue:
                self._requeue_front(skipped)
                return False
            _, key = self.queue.popitem(last=False)
            del self._entry[key]
            if key not in self.pinned and self.evict(key):
                self.free += 1
                self.popped += 1
            else:
                skipped.append(key)
        self._requeue_front(skipped)
        return True

    def hold(self, keys: Sequence[Key]) -> None:
        """Hold `keys` (not in the pool yet) on free blocks (`reserve` them first)."""
        if len(keys) > self.free:
            raise AssertionError(f"{len(keys)} blocks held with {self.free} free")
        for key in keys:
            if self.holds(key):
                raise AssertionError(f"block {key!r} is already in the pool")
            self.held[key] = 1
        self.free -= len(keys)

    def _requeue_front(self, keys: list[Key]) -> None:
        for key in reversed(keys):
            self._append(key)
            self.queue.move_to_end(self._entry[key], last=False)

    def _append(self, key: Key) -> None:
        entry = next(self._entries)
        self.queue[entry] = key
        self._entry[key] = entry

    def can_take(self, n: int) -> bool:
        return self.reclaimable() >= n

    def cache(self, key: Key) -> None:
        """One reference to a held block is released; at the last, the block (it has a
        hash) joins the queue's tail: LRU by release time."""
        if self._unref(key):
            self._append(key)

    def release(self, key: Key) -> None:
        """One reference to a held block is released; at the last, the block (no hash) is
        free at once."""
        if self._unref(key):
            self.free += 1

    def _unref(self, key: Key) -> bool:
        refs = self.held[key] - 1
        if refs:
            self.held[key] = refs
            return False
        del self.held[key]
        return True

    def touch(self, key: Key) -> None:
        """A hit references a block: a cached one leaves the queue (held again)."""
        entry = self._entry.pop(key, None)
        if entry is not None:
            del self.queue[entry]
            self.held[key] = 1
        else:
            self.held[key] += 1

    def pin(self, key: Key) -> None:
        """A lookup found `key`: no allocation evicts it before the request takes it
        (vLLM takes its hit blocks before it allocates, ``kv_cache_manager.py:590-610``)."""
        self.pinned.add(key)

    def unpin(self, key: Key) -> None:
        self.pinned.discard(key)

    def is_cached(self, key: Key) -> bool:
        return key in self._entry

    def substitute(self, cached: Key, key: Key) -> None:
        """`key` (just popped) takes the place in the queue of `cached`, which leaves the
        pool: of two copies of one block hash, the evicted one is the one not in the tree."""
        entry = self._entry.pop(cached)
        self.queue[entry] = key
        self._entry[key] = entry

    def holds(self, key: Key) -> bool:
        return key in self.held or key in self._entry

    def check(self) -> None:
        if self.free < 0 or self.free + len(self.held) + len(self.queue) != self.capacity:
            raise AssertionError(
                f"block pool: {self.free} free + {len(self.held)} held + "
                f"{len(self.queue)} cached != {self.capacity}"
            )
        if sorted(self._entry.values()) != sorted(self.queue) or set(self.queue.values()) != set(
            self._entry
        ):
            raise AssertionError("block pool: the queue and its index disagree")
        if self.held.keys() & self._entry.keys() or min(self.held.values(), default=1) < 1:
            raise AssertionError("block pool: a block is both held and cached, or unreferenced")


class PoolKV:
    """KV indices on pages of `block` consecutive indices, one page per attention block of
    `pool` (page ``p`` holds ``p * block ... p * block + block - 1``).

    `alloc_extend` continues a request's last page before taking new ones, as a paged
    allocator does (the tree's page is the block too). An index is
    owned from `alloc_extend` until `free`; a page is taken from the pool by `alloc_extend`
    and given back by the policy (cached or released), and a page id is reused only once
    both are done."""

    reclaims_cache = True  # available_size counts cached blocks (scheduler.budget)

    def __init__(self, pool: BlockPool, block: int) -> None:
        if block < 1:
            raise ValueError(f"block must be >= 1 unit, got {block}")
        self.pool, self.block = pool, block
        # A page's id is reused once the pool and the tree are both done with it; the tree
        # may hold a page whose pool copy was evicted while another copy of its block hash
        # stays in the pool, so there are at most twice as many pages in use as blocks.
        self.pages = 2 * pool.capacity
        self._owned = bytearray(self.pages * block)  # 1: the index is owned
        self._in_use = array("q", [0] * self.pages)  # owned indices per page
        self._owned_total = 0
        self._unused = list(range(self.pages - 1, -1, -1))  # page ids neither owned nor pooled
        self._listed = bytearray(b"\x01" * self.pages)  # 1: in _unused
        self._fresh: set[int] = set()  # taken, not yet claimed by the policy (`claim`)

    @property
    def capacity(self) -> int:
        """KV indices the pool's blocks hold (the id space is twice that)."""
        return self.pool.capacity * self.block

    @property
    def page_size(self) -> int:
        return self.block

    def available_size(self) -> int:
        """Indices on blocks the pool can hand out (free or cached)."""
        return self.pool.reclaimable() * self.block

    def free_list_size(self) -> int:
        """Indices nobody owns, of `capacity` (for conservation checks and peaks)."""
        return self.capacity - self._owned_total

    def is_free(self, i: int) -> bool:
        return not self._owned[i]

    def alloc(self, n: int) -> array[int] | None:
        return self.alloc_extend(None, n)

    def alloc_extend(self, last_index: int | None, n: int) -> array[int] | None:
        """Indices for `n` more tokens of a request whose last index is `last_index` (None:
        it owns no page with room). None, changing nothing, if the pool cannot give the
        pages."""
        b = self.block
        room = 0 if last_index is None else b - 1 - last_index % b
        pages = -(-max(0, n - room) // b)
        if not self.pool.can_take(pages) or not self.pool.reserve(pages):
            return None  # (reserve pops first: pops may give pages back through `free`)
        new = self._pick(pages)
        self.pool.hold([("kv", p) for p in new])
        self._fresh.update(new)
        out = array("q")
        if last_index is not None:
            out.extend(range(last_index + 1, last_index + 1 + min(room, n)))
        for p in new:
            out.extend(range(p * b, p * b + min(b, n - len(out))))
        for i in out:
            self._own(i)
        return out

    def _pick(self, pages: int) -> list[int]:
        out = []
        for _ in range(pages):
            p = self._unused.pop()
            self._listed[p] = 0
            out.append(p)
        return out

    def _own(self, i: int) -> None:
        self._owned[i] = 1
        self._in_use[i // self.block] += 1
        self._owned_total += 1

    def claim(self, page: int) -> None:
        """The policy has put `page` in a request's block table: it releases it."""
        self._fresh.discard(page)

    def free(self, indices: Iterable[int]) -> None:
        """Give indices back (the tree evicted them, or a request let them go). A page
        given back whole before the policy claimed it (an allocation rolled back) leaves
        the pool at once."""
        for i in indices:
            if not self._owned[i]:
                raise ValueError(f"KV index {i} is not owned")
            self._owned[i] = 0
            self._owned_total -= 1
            p = i // self.block
            self._in_use[p] -= 1
            if not self._in_use[p] and p in self._fresh:
                self._fresh.discard(p)
                self.pool.release(("kv", p))
            self._maybe_unused(p)

    def page_released(self, page: int) -> None:
        """The pool no longer holds or caches `page`: its id is reusable once unowned."""
        self._maybe_unused(page)

    def _maybe_unused(self, p: int) -> None:
        if not self._in_use[p] and not self._listed[p] and not self.pool.holds(("kv", p)):
            self._listed[p] = 1
            self._unused.append(p)

    def owned_on(self, page: int) -> int:
        return int(self._in_use[page])


class PoolSlots:
    """State slots, each `groups` blocks of `pool` (one per Mamba group). A slot is taken
    by `alloc` and given back by `free` (the lifecycle, or the tree through the policy);
    its blocks are the policy's to cache or release, and its id is reused once neither
    the lifecycle nor the pool holds it."""

    def __init__(self, pool: BlockPool, groups: int) -> None:
        if groups < 1:
            raise ValueError(f"groups must be >= 1, got {groups}")
        self.pool, self.groups = pool, groups
        self.slots = pool.capacity  # ids: a slot in the pool holds at least one block
        self._owned = bytearray(self.slots)
        self._unused = list(range(self.slots - 1, -1, -1))
        self._listed = bytearray(b"\x01" * self.slots)
        self._owned_total = 0

    @property
    def capacity(self) -> int:
        return self.slots

    def keys(self, slot: int) -> list[Key]:
        return [("st", slot, g) for g in range(self.groups)]

    def available_size(self) -> int:
        return self.pool.reclaimable() // self.groups

    def free_list_size(self) -> int:
        return self.slots - self._owned_total

    def is_free(self, slot: int) -> bool:
        return not self._owned[slot]

    def alloc(self, n: int) -> list[int] | None:
        need = n * self.groups
        if not self.pool.can_take(need) or not self.pool.reserve(need):
            return None  # (reserve pops first: pops may give slots back through `free`)
        got = []
        for _ in range(n):
            s = self._unused.pop()
            self._listed[s] = 0
            got.append(s)
        self.pool.hold([k for s in got for k in self.keys(s)])
        for s in got:
            self._owned[s] = 1
        self._owned_total += len(got)
        return got

    def free(self, slots: Any) -> None:
        """The slot's state is gone from the lifecycle's view. Blocks it still holds in the
        pool are released (a running state: unhashed); blocks it has cached stay cached
        until popped (vLLM keeps them; they no longer form a state)."""
        for s in slots:
            s = int(s)
            if not self._owned[s]:
                raise ValueError(f"state slot {s} is not owned")
            self._owned[s] = 0
            self._owned_total -= 1
            for key in self.keys(s):
                if key in self.pool.held:
                    self.pool.release(key)
            self.slot_released(s)

    def slot_released(self, slot: int) -> None:
        if self._owned[slot] or self._listed[slot]:
            return
        if any(self.pool.holds(k) for k in self.keys(slot)):
            return
        self._listed[slot] = 1
        self._unused.append(slot)
