"""Replay a `workload.Workload` through SGLang's MambaRadixCache or ours, timing every op.

Upstream side ("direct" driver): SGLang 0.5.15.post1's own class, loaded by
``tests/upstream_sglang.py``, called the way SGLang's scheduler calls it -- a
``MatchPrefixParams`` / ``InsertParams`` / ``EvictParams`` holding a ``RadixKey`` over an
``array('q')``, int64 torch tensors for KV indices and a ``[1]`` int64 tensor for the state.
No conversion happens inside the timed call. Its pools only append what the tree frees to a
list (no ``.tolist()``, no ``torch.cat``): the cheapest possible allocator, so the allocator
adds as little as it can to upstream's time.

Our side: ``mambaradix.MambaRadixCache`` with ``array('q')`` keys and values (our API takes
them without conversion).

Only the cache call itself is inside ``perf_counter_ns``; building inputs (key slices,
value arrays/tensors, param objects) and reading results happen outside, for both sides.
"""

from __future__ import annotations

import argparse
import sys
from array import array
from pathlib import Path
from time import perf_counter_ns
from typing import Any, NamedTuple

from workload import INSERT, LOCK, MATCH, UNLOCK, Workload

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

SAMPLE_EVERY = 16  # matches whose full KV index list is compared (hashed) across sides


class Match(NamedTuple):
    """A match's result, read after the timer (the same fields for every side)."""

    prefix_len: int
    indices: Any  # the prefix's KV indices (a tensor upstream, an array('q') ours)
    node: Any  # what `lock` takes
    branching_len: int
    kv_hit_len: int  # 0 for SGLang 0.5.15.post1, whose match reports none


# ------------------------------------------------------------------------------ sides
# Each side times only the cache call: `prep_*` builds its inputs untimed; every timed method
# returns the call's time in ns first, and what it returned read after the timer.


def timed(call: Any, arg: Any) -> tuple[int, Any]:
    """`call(arg)`, alone inside the timer: (its time in ns, its result)."""
    t0 = perf_counter_ns()
    res = call(arg)
    t1 = perf_counter_ns()
    return t1 - t0, res


class Upstream:
    """SGLang 0.5.15.post1's MambaRadixCache with list-appending fake pools; `c` is called
    directly, as SGLang's scheduler calls it."""

    def __init__(self, page_size: int = 1, chunk_size: int = 64) -> None:
        import torch

        import upstream_sglang as us

        us.load_upstream()
        mods = sys.modules
        pkg = "sglang.srt.mem_cache"
        base = mods[f"{pkg}.base_prefix_cache"]
        self.torch = torch
        self.RadixKey = mods[f"{pkg}.radix_cache"].RadixKey
        self.MatchPrefixParams = base.MatchPrefixParams
        self.InsertParams = base.InsertParams
        self.EvictParams = base.EvictParams

        class KV(mods[f"{pkg}.allocator"].TokenToKVPoolAllocator):  # type: ignore[misc]
            device = torch.device("cpu")

            def __init__(self) -> None:
                self.freed: list[Any] = []

            def free(self, indices: Any) -> None:
                self.freed.append(indices)

            def available_size(self) -> int:
                return 0

        class Slots:
            def __init__(self) -> None:
                self.freed: list[Any] = []

            def free(self, indices: Any) -> None:
                self.freed.append(indices)

        class ReqPool(mods[f"{pkg}.memory_pool"].HybridReqToTokenPool):  # type: ignore[misc]
            def __init__(self) -> None:
                self.mamba_allocator = Slots()

        self.kv, self.req_pool = KV(), ReqPool()
        params = mods[f"{pkg}.cache_init_params"].CacheInitParams(
            disable=False,
            req_to_token_pool=self.req_pool,
            token_to_kv_pool_allocator=self.kv,
            page_size=page_size,
            enable_mamba_extra_buffer=page_size > 1,  # v1 asserts page_size == 1
        )
        us._SERVER_ARGS.mamba_cache_chunk_size = chunk_size  # read once, in the constructor
        self.c = us.load_upstream().MambaRadixCache(params)

    def drop_freed(self) -> None:
        self.kv.freed.clear()
        self.req_pool.mamba_allocator.freed.clear()

    def prep_match(self, key: array[int]) -> Any:
        return self.MatchPrefixParams(key=self.RadixKey(key, None))

    def match(self, params: Any) -> tuple[int, Match]:
        t, res = timed(self.c.match_prefix, params)
        idx = res.device_indices
        return t, Match(len(idx), idx, res.last_device_node, res.mamba_branching_seqlen, 0)

    def index_bytes(self, indices: Any) -> bytes:
        return indices.numpy().tobytes()  # type: ignore[no-any-return]

    def prep_insert(
        self, key: array[int], base: int, state: int, prev: int = 0, head: Any = None
    ) -> Any:
        """Values: `head` (the `prev` matched indices) then fresh ones from base + prev; without
        `head`, fresh ones from `base` for the whole key."""
        torch, i64, n = self.torch, self.torch.int64, len(key)
        if head is None:
            value = torch.arange(base, base + n, dtype=i64)
        else:
            value = torch.cat((head, torch.arange(base + prev, base + n, dtype=i64)))
        return self.InsertParams(
            key=self.RadixKey(key, None),
            value=value,
            mamba_value=torch.tensor([state], dtype=i64),
            prev_prefix_len=prev,
        )

    def insert(self, params: Any) -> tuple[int, tuple[int, bool]]:
        t, res = timed(self.c.insert, params)
        self.drop_freed()
        return t, (res.prefix_len, bool(res.mamba_exist))

    def lock(self, node: Any) -> tuple[int, Any]:
        return timed(self.c.inc_lock_ref, node)[0], node

    def unlock(self, handle: Any) -> int:
        return timed(self.c.dec_lock_ref, handle)[0]

    def evict(self, kv: int, st: int) -> tuple[int, tuple[int, int]]:
        t, res = timed(self.c.evict, self.EvictParams(num_tokens=kv, mamba_num=st))
        self.drop_freed()
        return t, (res.num_tokens_evicted, res.mamba_num_evicted)

    def evict_lru_leaf(self) -> None:
        """Untimed: evict the LRU leaf; refcounting frees its key and value at once."""
        self.c.evict(self.EvictParams(num_tokens=1))
        self.drop_freed()

    def sizes(self) -> tuple[int, int, int, int]:
        """(KV evictable, KV protected, states evictable, states protected)."""
        c = self.c
        return (
            c.full_evictable_size_,
            c.full_protected_size_,
            c.mamba_evictable_size_,
            c.mamba_protected_size_,
        )

    def nodes(self) -> int | None:
        return len(self.c.full_lru_list.cache)

    def depth(self, node: Any) -> int:
        return parent_depth(node)


class Unified(Upstream):
    """SGLang 0.5.23's ``UnifiedRadixCache`` (FULL + MAMBA) over its Python or Rust tree core
    (``backend``), loaded by ``tests/upstream_unified.py``; `c` is called directly. Its pools
    count what the tree frees and keep the tensors in a list (dropped between ops).

    As its scheduler calls it: ``match_prefix``, then, for a hit, the prefix's KV indices read
    off the path (``path_device_indices``, as ``allocation._prefix_kv_indices`` does;
    0.5.15.post1 and ours return them from the match): both inside the timed match
    (``time_indices=False``: the read after the timer, to show its share).
    ``lock`` / ``unlock`` (``TreeLock``), ``insert``, ``evict`` with counts (inherited)."""

    def __init__(
        self, backend: str, page_size: int = 1, chunk_size: int = 64, time_indices: bool = True
    ) -> None:
        import torch

        import upstream_unified as uu

        wrapper = uu.UpstreamUnifiedCache(page_size, chunk_size, backend=backend)
        base = uu.up("srt.mem_cache.base_prefix_cache")
        self.torch = torch
        self.RadixKey = uu.up("srt.mem_cache.radix_cache").RadixKey
        self.MatchPrefixParams = base.MatchPrefixParams
        self.InsertParams = base.InsertParams
        self.EvictParams = base.EvictParams
        self.kv, self.req_pool = wrapper.kv, wrapper.req_pool
        self.kv.free = self.kv.free_segment = _CheapFree(self.kv)
        slots = self.req_pool.mamba_allocator
        slots.free = _CheapFree(slots)
        self.c = wrapper.inner
        self.core = wrapper.core
        self.empty = torch.empty(0, dtype=torch.int64)
        self.time_indices = time_indices

    def match(self, params: Any) -> tuple[int, Match]:
        c, empty, time_indices = self.c, self.empty, self.time_indices
        match_prefix, path_indices = c.match_prefix, c.path_device_indices
        t0 = perf_counter_ns()
        res = match_prefix(params)
        if time_indices:
            p = res.device_prefix_len
            idx = path_indices(res.last_device_node)[:p] if p else empty
        t1 = perf_counter_ns()
        if not time_indices:
            p = res.device_prefix_len
            idx = path_indices(res.last_device_node)[:p] if p else empty
        node, branching = res.last_device_node, res.mamba_branching_seqlen
        return t1 - t0, Match(p, idx, node, branching, res.full_kv_hit_length)

    def lock(self, node: Any) -> tuple[int, Any]:
        return timed(self.c.lock, node)  # its receipt

    def unlock(self, handle: Any) -> int:
        return timed(self.c.unlock, handle)[0]

    def sizes(self) -> tuple[int, int, int, int]:
        c = self.c
        return (
            int(c.full_evictable_size()),
            int(c.full_protected_size()),
            int(c.mamba_evictable_size()),
            int(c.mamba_protected_size()),
        )

    def nodes(self) -> int | None:
        return None  # the Rust core exposes no node count

    def depth(self, node: Any) -> int:
        """Nodes below the root on the path to ``node`` (untimed; the tree core's own walk)."""
        (path,) = self.core.collect_path_info([node])
        return len(path)


class _CheapFree:
    """A pool's ``free`` / ``free_segment`` that keeps the tensor and counts its slots (the
    free space ``evict_for_alloc`` would read), no conversion."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def __call__(self, indices: Any, start_pos: int = 0) -> None:
        self.pool.freed.append(indices)
        self.pool.free_now += len(indices)


class Ours:
    """``mambaradix.MambaRadixCache`` in mode `compat`, or `cache_cls` (a tree class taking the
    same arguments), with ``array('q')`` keys and values."""

    def __init__(
        self, compat: str | None, page_size: int = 1, chunk_size: int = 64, cache_cls: Any = None
    ) -> None:
        if cache_cls is None:
            from mambaradix import MambaRadixCache as cache_cls

        self.c = cache_cls(page_size=page_size, chunk_size=chunk_size, compat=compat)

    def prep_match(self, key: array[int]) -> Any:
        return key

    def match(self, key: Any) -> tuple[int, Match]:
        t, res = timed(self.c.match_prefix, key)
        return t, Match(res.prefix_len, res.kv_indices, res.node, res.branching_len, res.kv_hit_len)

    def match_read_only(self, key: Any) -> int:
        match_prefix = self.c.match_prefix
        t0 = perf_counter_ns()
        match_prefix(key, read_only=True)
        t1 = perf_counter_ns()
        return t1 - t0

    def index_bytes(self, indices: Any) -> bytes:
        return indices.tobytes()  # type: ignore[no-any-return]

    def prep_insert(
        self, key: array[int], base: int, state: int, prev: int = 0, head: Any = None
    ) -> Any:
        """As `Upstream.prep_insert`."""
        if head is None:
            return key, array("q", range(base, base + len(key))), state, prev
        return key, head + array("q", range(base + prev, base + len(key))), state, prev

    def insert(self, params: Any) -> tuple[int, tuple[int, bool]]:
        insert = self.c.insert
        key, values, state, prev = params
        t0 = perf_counter_ns()
        res = insert(key, values, state, prev)
        t1 = perf_counter_ns()
        return t1 - t0, (res.prefix_len, res.state_existed)

    def lock(self, node: Any) -> tuple[int, Any]:
        return timed(self.c.inc_lock_ref, node)  # its receipt

    def unlock(self, handle: Any) -> int:
        return timed(self.c.dec_lock_ref, handle)[0]

    def evict(self, kv: int, st: int) -> tuple[int, tuple[int, int]]:
        evict = self.c.evict
        t0 = perf_counter_ns()
        res = evict(kv, st)
        t1 = perf_counter_ns()
        return t1 - t0, (res.kv_tokens, res.states)

    def evict_lru_leaf(self) -> None:
        """Untimed: evict the LRU leaf and free its arrays now.

        Our TreeNode and its two Links reference each other, so an evicted node (with its
        key and value arrays) lives until the cyclic GC finds it; old nodes sit in the
        oldest generation, collected rarely. Without this, every timed insert of a long key
        page-faults fresh memory (~4x the insert's cost at 64k tokens) while upstream's
        evicted arrays are reused at once. Breaking the cycle here emulates the fix
        suggested for src (clear `link.node` in `_detach`)."""
        link = self.c.lru[0].lru_unlocked_leaf()
        self.c.evict(1, 0)
        if link is not None and link.node is not None:
            node = link.node
            node.kv.node = node.st.node = None

    def sizes(self) -> tuple[int, int, int, int]:
        c = self.c
        return (
            c.full_evictable_size(),
            c.full_protected_size(),
            c.state_evictable_size(),
            c.state_protected_size(),
        )

    def nodes(self) -> int | None:
        return self.c.node_count()  # type: ignore[no-any-return]

    def depth(self, node: Any) -> int:
        return parent_depth(node)


Side = Upstream | Ours


def parent_depth(node: Any) -> int:
    """Nodes below the root on the path to `node` (untimed), by its `parent` links."""
    n = 0
    while node.parent is not None:
        n += 1
        node = node.parent
    return n


class Replay:
    """Per-op timings (ns, -1 where the op did nothing) and decision signatures."""

    def __init__(self, n_ops: int) -> None:
        self.times = array("q", [-1]) * n_ops
        self.sig: list[Any] = [None] * n_ops
        self.sizes: tuple[int, ...] = ()
        self.nodes = 0
        self.matched_tokens = 0
        self.kv_hit_tokens = 0
        self.lock_depth = 0  # sum over locks of the locked node's depth (nodes below root)
        self.locks = 0


def replay(w: Workload, side: Side, limit: int | None = None) -> Replay:
    """Replay `w`'s ops (the first `limit`) through a fresh `side`."""
    kv_budget, st_budget = w.config.kv_budget, w.config.state_budget
    seqs = w.seqs
    ops = w.ops if limit is None else w.ops[:limit]
    out = Replay(len(ops))
    times, sig = out.times, out.sig
    slots: list[Any] = [None] * w.n_slots
    handles: list[Any] = [None] * w.n_handles
    n_match = 0
    for i, op in enumerate(ops):
        code = op[0]
        if code == MATCH:
            t, m = side.match(side.prep_match(seqs[op[1]][: op[2]]))
            n_match += 1
            h = hash(side.index_bytes(m.indices)) if n_match % SAMPLE_EVERY == 0 else None
            sig[i] = (m.prefix_len, m.branching_len, h)
            out.matched_tokens += m.prefix_len
            out.kv_hit_tokens += m.kv_hit_len
            if op[3] >= 0:
                slots[op[3]] = m
        elif code == LOCK:
            node = slots[op[1]].node
            t, handles[op[2]] = side.lock(node)
            out.locks += 1
            out.lock_depth += side.depth(node)
        elif code == UNLOCK:
            t = side.unlock(handles[op[1]])
            handles[op[1]] = None
        elif code == INSERT:
            _, seq, n, slot, base, state = op
            m, slots[slot] = slots[slot], None
            p = m.prefix_len
            params = side.prep_insert(seqs[seq][:n], base, state, p, m.indices if p else None)
            t, sig[i] = side.insert(params)
        else:  # EVICT_CHECK
            ev_kv, pr_kv, ev_st, pr_st = side.sizes()
            kv_excess = ev_kv + pr_kv - kv_budget
            st_excess = ev_st + pr_st - st_budget
            if kv_excess <= 0 and st_excess <= 0:
                continue
            t, sig[i] = side.evict(max(kv_excess, 0), max(st_excess, 0))
        times[i] = t
    out.sizes = side.sizes()
    nodes = side.nodes()
    out.nodes = -1 if nodes is None else nodes  # -1: not counted (the Rust core has no count)
    return out


def add_common_args(ap: argparse.ArgumentParser, flag: str, names: tuple[str, ...]) -> None:
    """`--torch-threads` and `flag`, a comma-separated subset of `names` (`picked` reads it)."""
    ap.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads for upstream's tensors (0: torch's default)",
    )
    ap.add_argument(
        flag,
        default=",".join(names),
        help=f"comma-separated subset of {','.join(names)} (default: all)",
    )


def picked(ap: argparse.ArgumentParser, flag: str, text: str, names: Any) -> tuple[str, ...]:
    """The names `text` lists (a bad one: `ap.error`, naming `flag`)."""
    out = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [x for x in out if x not in names]
    if unknown or not out:
        ap.error(f"{flag}: unknown {unknown}; choose from {','.join(names)}")
    return out


def warm_allocator(nbytes: int = 16 << 20) -> None:
    """Raise glibc malloc's dynamic mmap threshold once per process.

    glibc serves large blocks (initially >= 128 KiB) with a fresh mmap, page-faulting every
    page on first touch, until a freed mmapped block raises the threshold to its size. Which
    implementation runs first would otherwise pay that for every long key or value (several
    times the real cost at 32k-64k tokens). A long-running server is past this point; so is
    every implementation after this call. Freeing one 16 MiB block does it for both Python
    arrays and torch's CPU tensors (both allocate through malloc)."""
    block = bytearray(nbytes)
    del block


def set_torch_threads(n: int = 1) -> None:
    """Pin torch's intra-op pool (default 1 thread).

    The upstream tree's tensors stand in for GPU tensors, where `torch.cat` / `clone` are
    asynchronous launches. On CPU, tensors above 32768 elements (torch's grain size) go
    parallel, and waking a sleeping OpenMP worker on a small VM can cost milliseconds
    (seen: 8 ms for one 32769-element `torch.cat` on 2 vCPUs). One thread removes that
    noise from upstream's numbers; pass --torch-threads 0 to keep torch's default."""
    if n > 0:
        import torch

        torch.set_num_threads(n)


def timer_overhead_ns(n: int = 200_000) -> int:
    """Median cost of an empty `perf_counter_ns` pair (what every timed op includes)."""
    samples = array("q", [0]) * n
    for i in range(n):
        t0 = perf_counter_ns()
        t1 = perf_counter_ns()
        samples[i] = t1 - t0
    return sorted(samples)[n // 2]
