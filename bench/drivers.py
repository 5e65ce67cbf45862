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

import sys
from array import array
from pathlib import Path
from time import perf_counter_ns
from typing import Any

from workload import INSERT, LOCK, MATCH, UNLOCK, Workload

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

SAMPLE_EVERY = 16  # matches whose full KV index list is compared (hashed) across sides


# --------------------------------------------------------------------------- upstream


class UpstreamDirect:
    """SGLang's MambaRadixCache with list-appending fake pools; `inner` is called directly."""

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
        self.inner = us.load_upstream().MambaRadixCache(params)

    def drop_freed(self) -> None:
        self.kv.freed.clear()
        self.req_pool.mamba_allocator.freed.clear()

    def sizes(self) -> tuple[int, int, int, int]:
        c = self.inner
        return (
            c.full_evictable_size_,
            c.full_protected_size_,
            c.mamba_evictable_size_,
            c.mamba_protected_size_,
        )

    def node_count(self) -> int:
        return len(self.inner.full_lru_list.cache)


class UnifiedDirect:
    """SGLang 0.5.23's ``UnifiedRadixCache`` (FULL + MAMBA) over its Python or Rust tree core
    (``backend``), loaded by ``tests/upstream_unified.py``; `inner` is called directly. Its
    pools count what the tree frees and keep the tensors in a list (dropped between ops)."""

    def __init__(self, backend: str, page_size: int = 1, chunk_size: int = 64) -> None:
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
        self.inner = wrapper.inner
        self.core = wrapper.core

    def drop_freed(self) -> None:
        self.kv.freed.clear()
        self.req_pool.mamba_allocator.freed.clear()

    def sizes(self) -> tuple[int, int, int, int]:
        c = self.inner
        return (
            int(c.full_evictable_size()),
            int(c.full_protected_size()),
            int(c.mamba_evictable_size()),
            int(c.mamba_protected_size()),
        )

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


def replay_upstream(
    w: Workload, page_size: int = 1, chunk_size: int = 64, limit: int | None = None
) -> Replay:
    d = UpstreamDirect(page_size, chunk_size)
    torch = d.torch
    inner = d.inner
    RadixKey, MPP, IP, EP = d.RadixKey, d.MatchPrefixParams, d.InsertParams, d.EvictParams
    match_prefix, insert, evict = inner.match_prefix, inner.insert, inner.evict
    inc_lock_ref, dec_lock_ref = inner.inc_lock_ref, inner.dec_lock_ref
    kv_budget, st_budget = w.config.kv_budget, w.config.state_budget
    arange, cat, i64 = torch.arange, torch.cat, torch.int64
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
            params = MPP(key=RadixKey(seqs[op[1]][: op[2]], None))
            t0 = perf_counter_ns()
            res = match_prefix(params)
            t1 = perf_counter_ns()
            idx = res.device_indices
            p = len(idx)
            n_match += 1
            h = hash(idx.numpy().tobytes()) if n_match % SAMPLE_EVERY == 0 else None
            sig[i] = (p, res.mamba_branching_seqlen, h)
            out.matched_tokens += p
            if op[3] >= 0:
                slots[op[3]] = (p, idx, res.last_device_node)
        elif code == LOCK:
            node = slots[op[1]][2]
            t0 = perf_counter_ns()
            inc_lock_ref(node)
            t1 = perf_counter_ns()
            handles[op[2]] = node
            out.locks += 1
            while node.parent is not None:
                out.lock_depth += 1
                node = node.parent
        elif code == UNLOCK:
            node = handles[op[1]]
            t0 = perf_counter_ns()
            dec_lock_ref(node)
            t1 = perf_counter_ns()
            handles[op[1]] = None
        elif code == INSERT:
            _, seq, n, slot, base, state = op
            p, idx, _ = slots[slot]
            slots[slot] = None
            fresh = arange(base + p, base + n, dtype=i64)
            params = IP(
                key=RadixKey(seqs[seq][:n], None),
                value=cat((idx, fresh)) if p else fresh,
                mamba_value=torch.tensor([state], dtype=i64),
                prev_prefix_len=p,
            )
            t0 = perf_counter_ns()
            res = insert(params)
            t1 = perf_counter_ns()
            sig[i] = (res.prefix_len, bool(res.mamba_exist))
            d.drop_freed()
        else:  # EVICT_CHECK
            kv_excess = inner.full_evictable_size_ + inner.full_protected_size_ - kv_budget
            st_excess = inner.mamba_evictable_size_ + inner.mamba_protected_size_ - st_budget
            if kv_excess <= 0 and st_excess <= 0:
                continue
            params = EP(num_tokens=max(kv_excess, 0), mamba_num=max(st_excess, 0))
            t0 = perf_counter_ns()
            res = evict(params)
            t1 = perf_counter_ns()
            sig[i] = (res.num_tokens_evicted, res.mamba_num_evicted)
            d.drop_freed()
        times[i] = t1 - t0
    out.sizes = d.sizes()
    out.nodes = d.node_count()
    return out


def replay_unified(
    w: Workload,
    backend: str,
    page_size: int = 1,
    chunk_size: int = 64,
    limit: int | None = None,
    time_indices: bool = True,
) -> Replay:
    """SGLang 0.5.23 as its scheduler calls it: ``match_prefix``, then, for a hit, the prefix's
    KV indices read off the path (``path_device_indices``, as ``allocation._prefix_kv_indices``
    does; 0.5.15.post1 and ours return them from the match): both inside the timed match
    (``time_indices=False``: the read after the timer, to show its share).
    ``lock`` / ``unlock`` (``TreeLock``), ``insert``, ``evict`` with counts."""
    d = UnifiedDirect(backend, page_size, chunk_size)
    torch = d.torch
    inner = d.inner
    RadixKey, MPP, IP, EP = d.RadixKey, d.MatchPrefixParams, d.InsertParams, d.EvictParams
    match_prefix, path_indices = inner.match_prefix, inner.path_device_indices
    insert, evict, lock, unlock = inner.insert, inner.evict, inner.lock, inner.unlock
    kv_budget, st_budget = w.config.kv_budget, w.config.state_budget
    arange, cat, i64 = torch.arange, torch.cat, torch.int64
    empty = torch.empty(0, dtype=i64)
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
            params = MPP(key=RadixKey(seqs[op[1]][: op[2]], None))
            t0 = perf_counter_ns()
            res = match_prefix(params)
            if time_indices:
                p = res.device_prefix_len
                idx = path_indices(res.last_device_node)[:p] if p else empty
            t1 = perf_counter_ns()
            if not time_indices:
                p = res.device_prefix_len
                idx = path_indices(res.last_device_node)[:p] if p else empty
            n_match += 1
            h = hash(idx.numpy().tobytes()) if n_match % SAMPLE_EVERY == 0 else None
            sig[i] = (p, res.mamba_branching_seqlen, h)
            out.matched_tokens += p
            out.kv_hit_tokens += res.full_kv_hit_length
            if op[3] >= 0:
                slots[op[3]] = (p, idx, res.last_device_node)
        elif code == LOCK:
            node = slots[op[1]][2]
            t0 = perf_counter_ns()
            receipt = lock(node)
            t1 = perf_counter_ns()
            handles[op[2]] = receipt
            out.locks += 1
            out.lock_depth += d.depth(node)
        elif code == UNLOCK:
            receipt = handles[op[1]]
            t0 = perf_counter_ns()
            unlock(receipt)
            t1 = perf_counter_ns()
            handles[op[1]] = None
        elif code == INSERT:
            _, seq, n, slot, base, state = op
            p, idx, _ = slots[slot]
            slots[slot] = None
            fresh = arange(base + p, base + n, dtype=i64)
            params = IP(
                key=RadixKey(seqs[seq][:n], None),
                value=cat((idx, fresh)) if p else fresh,
                mamba_value=torch.tensor([state], dtype=i64),
                prev_prefix_len=p,
            )
            t0 = perf_counter_ns()
            res = insert(params)
            t1 = perf_counter_ns()
            sig[i] = (res.prefix_len, bool(res.mamba_exist))
            d.drop_freed()
        else:  # EVICT_CHECK
            ev_kv, pr_kv, ev_st, pr_st = d.sizes()
            kv_excess = ev_kv + pr_kv - kv_budget
            st_excess = ev_st + pr_st - st_budget
            if kv_excess <= 0 and st_excess <= 0:
                continue
            params = EP(num_tokens=max(kv_excess, 0), mamba_num=max(st_excess, 0))
            t0 = perf_counter_ns()
            res = evict(params)
            t1 = perf_counter_ns()
            sig[i] = (res.num_tokens_evicted, res.mamba_num_evicted)
            d.drop_freed()
        times[i] = t1 - t0
    out.sizes = d.sizes()
    out.nodes = -1  # not counted: the Rust core exposes no node count
    return out


def replay_ours(
    w: Workload,
    compat: str | None,
    page_size: int = 1,
    chunk_size: int = 64,
    limit: int | None = None,
    cache_cls: Any = None,
) -> Replay:
    """`cache_cls`: the tree class to replay (default: mambaradix.MambaRadixCache)."""
    if cache_cls is None:
        from mambaradix import MambaRadixCache as cache_cls

    cache = cache_cls(page_size=page_size, chunk_size=chunk_size, compat=compat)
    match_prefix, insert, evict = cache.match_prefix, cache.insert, cache.evict
    inc_lock_ref, dec_lock_ref = cache.inc_lock_ref, cache.dec_lock_ref
    kv_budget, st_budget = w.config.kv_budget, w.config.state_budget
    ev, pr = cache._evictable, cache._protected  # the size counters, read between ops
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
            key = seqs[op[1]][: op[2]]
            t0 = perf_counter_ns()
            res = match_prefix(key)
            t1 = perf_counter_ns()
            idx = res.kv_indices
            p = res.prefix_len
            n_match += 1
            h = hash(idx.tobytes()) if n_match % SAMPLE_EVERY == 0 else None
            sig[i] = (p, res.branching_len, h)
            out.matched_tokens += p
            out.kv_hit_tokens += res.kv_hit_len
            if op[3] >= 0:
                slots[op[3]] = (p, idx, res.node)
        elif code == LOCK:
            node = slots[op[1]][2]
            t0 = perf_counter_ns()
            receipt = inc_lock_ref(node)
            t1 = perf_counter_ns()
            handles[op[2]] = receipt
            out.locks += 1
            while node.parent is not None:
                out.lock_depth += 1
                node = node.parent
        elif code == UNLOCK:
            receipt = handles[op[1]]
            t0 = perf_counter_ns()
            dec_lock_ref(receipt)
            t1 = perf_counter_ns()
            handles[op[1]] = None
        elif code == INSERT:
            _, seq, n, slot, base, state = op
            p, idx, _ = slots[slot]
            slots[slot] = None
            fresh = array("q", range(base + p, base + n))
            key = seqs[seq][:n]
            values = idx + fresh if p else fresh
            t0 = perf_counter_ns()
            res = insert(key, values, state, p)
            t1 = perf_counter_ns()
            sig[i] = (res.prefix_len, res.state_existed)
        else:  # EVICT_CHECK
            kv_excess = ev[0] + pr[0] - kv_budget
            st_excess = ev[1] + pr[1] - st_budget
            if kv_excess <= 0 and st_excess <= 0:
                continue
            kv_n, st_n = max(kv_excess, 0), max(st_excess, 0)
            t0 = perf_counter_ns()
            res = evict(kv_n, st_n)
            t1 = perf_counter_ns()
            sig[i] = (res.kv_tokens, res.states)
        times[i] = t1 - t0
    out.sizes = (
        cache.full_evictable_size(),
        cache.full_protected_size(),
        cache.state_evictable_size(),
        cache.state_protected_size(),
    )
    out.nodes = cache.node_count()
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
