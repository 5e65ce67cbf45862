"""What the two lifecycle oracles share: ``upstream_lifecycle.UpstreamLifecycle`` (SGLang
0.5.15.post1) and ``upstream_lifecycle_0523.UpstreamLifecycle0523`` (0.5.23) answer the calls
of ``mambaradix.lifecycle.CacheManager``'s surface the same way wherever the two releases'
scheduler code does; each subclass supplies what differs (see its module docstring).

0.5.23 moved a request's KV and state fields (``req_pool_idx``, ``mamba_pool_idx``, the
ping-pong track buffer, ``kv_committed_len``, ...) from ``Req`` onto ``Req.kv`` (a
``ReqKvInfo``); ``LifecycleOracle._kv`` says where they are.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from mambaradix.lifecycle import Request

NO_SLOT = "Can not alloc mamba cache"
PROMPT_DONE, CHECKPOINTED, DECODING = "prompt done", "checkpointed at the prompt end", "decoding"


class DriverMismatch(AssertionError):
    """The driver made a call that SGLang's scheduler would not have made (``req``: for whom)."""

    def __init__(self, message: str, req: Request | None = None) -> None:
        super().__init__(message)
        self.req = req


class View:
    """Read-only facades with the attributes the scheduler reads."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


def no(*args: Any, **kwargs: Any) -> bool:
    return False


def clear(req: Request) -> None:
    """Forget the cache fields of our ``Request`` (it holds nothing now)."""
    req.row = req.slot = req.track_slots = req.node = req.lock = req.cow_src = None
    req.last_track_len = req.branching_len = None
    req.next_track = req.prefix_len = req.computed = 0


def init_pool(
    pool: Any, up: SimpleNamespace, rows: int, context: int, slots: int, extra: bool, track: int
) -> None:
    """The fields of upstream's ``HybridReqToTokenPool`` that its picked methods read (both
    releases); ``mamba_pool`` gets what ``copy_from`` / ``clear_slots`` need: nothing."""
    pool.size, pool._alloc_size, pool.max_context_len = rows, rows + 1, context
    pool.device = "cpu"
    pool.req_to_token = torch.zeros((rows + 1, context), dtype=torch.int32)
    pool.free_slots = list(range(1, rows + 1))
    pool.mamba_ping_pong_track_buffer_size = track
    pool.enable_mamba_extra_buffer = extra
    pool.enable_mamba_extra_buffer_lazy = False
    pool.mamba_pool = SimpleNamespace(
        replayssm_write_pos=None, copy_from=no, clear_slots=no, size=slots
    )
    pool.mamba_allocator = up.mamba.MambaSlotAllocator(size=slots, device="cpu")
    pool.mamba_ckpt_pool = None
    pool.req_index_to_mamba_index_mapping = torch.zeros(rows + 1, dtype=torch.int32)
    pool.req_index_to_mamba_ping_pong_track_buffer_mapping = torch.zeros(
        (rows + 1, track), dtype=torch.int64
    )


class LifecycleOracle:
    """An SGLang release's request lifecycle behind ``CacheManager``'s surface.

    Pool sizes mean what they mean for ``CacheManager``'s pools: ``kv_tokens`` KV indices,
    ``state_slots`` state slots, ``rows`` request rows. ``track_slots`` is the ping-pong size
    (2 with SGLang's overlap scheduler, 1 without); ``track_interval`` is
    ``--mamba-track-interval``, ``chunk_size`` ``mamba_cache_chunk_size``.
    """

    RULES = ""  # the release, as ``compat`` names it
    FINISH_CALL = ""  # what caches a request its first token finished
    # functions of the release's module: everything the oracle runs, loaded once per process
    # (``ns``: the picked names); the pool class; a KV allocator (size, page); an upstream
    # ``Req`` for one of ours (its index)
    load: Callable[[], SimpleNamespace]
    pool_class: Callable[[SimpleNamespace], type]
    kv_allocator: Callable[[SimpleNamespace, int, int], Any]
    new_req: Callable[[SimpleNamespace, Request, int], Any]

    def __init__(
        self,
        *,
        kv_tokens: int,
        state_slots: int,
        rows: int,
        max_context: int,
        page_size: int = 1,
        chunk_size: int = 64,
        strategy: str = "no_buffer",
        track_slots: int = 2,
        track_interval: int = 256,
    ) -> None:
        self.up = self.load()
        self.extra_buffer = strategy == "extra_buffer"
        self.strategy, self.page_size = strategy, page_size
        self.track_slots = track_slots if self.extra_buffer else 0
        self.sglang = True  # SGLang's rules, by construction
        self.rules = self.RULES
        self._configure(chunk_size, track_interval)
        self._activate()
        self.kv_alloc = self.kv_allocator(self.up, kv_tokens, page_size)
        pool_cls = self.pool_class(self.up)
        self.pool = pool_cls(rows, max_context, state_slots, self.extra_buffer, track_slots)
        self.inner = self._new_tree(chunk_size)
        self.inner.pretty_print = lambda: None  # upstream prints the tree on out-of-memory paths
        proc = self.up.ns["SchedulerBatchResultProcessor"]
        self.processor = proc.__new__(proc)
        self.processor.tree_cache = self.inner  # 0.5.23's reads it, 0.5.15.post1's does not
        inner = self.inner
        self.tree = View(
            chunk_size=chunk_size,
            page_size=page_size,
            compat=self.RULES,
            full_evictable_size=inner.full_evictable_size,
            full_protected_size=inner.full_protected_size,
            state_evictable_size=inner.mamba_evictable_size,
            state_protected_size=inner.mamba_protected_size,
        )
        self.kv = View(
            available_size=self.kv_alloc.available_size, capacity=kv_tokens, reclaims_cache=False
        )
        self.rows = View(
            available_size=self.pool.available_size,
            capacity=rows,
            max_context=self.pool.max_context_len,  # the width of upstream's table
        )
        self.slots = View(
            available_size=self.pool.mamba_allocator.available_size, capacity=state_slots
        )
        self._ureqs: dict[Request, Any] = {}
        self._pending: dict[Request, tuple[int, int, str]] = {}  # slot, position, kind
        self._phase: dict[Request, str] = {}  # after its prompt: done, checkpointed, decoding
        self.crashes: Counter[str] = Counter()  # where SGLang would have stopped (docstrings)
        self.worked_around: Counter[str] = Counter()  # upstream bugs stepped around

    # ------------------------------------------- what each release supplies

    def _configure(self, chunk_size: int, track_interval: int) -> None:
        """Keep the configuration the loaded code reads (``_activate`` installs it)."""
        raise NotImplementedError

    def _activate(self) -> None:
        raise NotImplementedError

    def _new_tree(self, chunk_size: int) -> Any:
        raise NotImplementedError

    def _kv(self, u: Any) -> Any:
        """Where a request's KV and state fields are."""
        return u

    def _extend_end(self, u: Any) -> int:
        raise NotImplementedError

    def _prefix_len(self, u: Any) -> int:
        raise NotImplementedError

    def _match(self, req: Request, u: Any, limit: int) -> tuple[int, int]:
        """The scheduler's match (may raise upstream's no-slot assertion); (cached length,
        KV hit length)."""
        raise NotImplementedError

    def _set_extend(self, u: Any, start: int, n: int) -> None:
        raise NotImplementedError

    def _alloc_for_extend(self, b: Any) -> None:
        raise NotImplementedError

    def _extend_track_slot(self, u: Any, entry: Any) -> int:
        raise NotImplementedError

    def _extended(self, u: Any) -> None:
        """After ``alloc_for_extend``, before the forward's tracking (nothing by default)."""

    def _drop_track_buffer(self, kv: Any) -> None:
        kv.mamba_ping_pong_track_buffer = None

    def _alloc_for_decode(self, b: Any) -> None:
        raise NotImplementedError

    def _decoded(self, u: Any) -> None:
        """After ``alloc_for_decode``, what ``prepare_for_decode`` adds (nothing by default)."""

    def _track_every(self) -> int:
        """The decode track boundary: a state is tracked where the committed length is a
        multiple of it."""
        raise NotImplementedError

    def _decode_track_update(self, u: Any) -> None:
        raise NotImplementedError

    def _checkpoint(self, u: Any, chunked: bool) -> None:
        raise NotImplementedError

    def _skip_checkpoint(self, u: Any) -> str:
        """What the request keeps when no slot can be had for its checkpoint; the crash key."""
        raise NotImplementedError

    def _lock_handle(self, u: Any) -> Any:
        raise NotImplementedError

    def _finishing(self, u: Any) -> None:
        """Before a finished request's release (nothing by default)."""

    def _release(self, u: Any, insert: bool) -> None:
        raise NotImplementedError

    def _unlock_unadmitted(self, req: Request, u: Any) -> None:
        raise NotImplementedError

    def _batch(self, ureqs: list[Any]) -> Any:
        """A ``ScheduleBatch`` with what ``alloc_for_extend/decode`` and the picked methods
        read."""
        b = self.up.ns["ScheduleBatch"].__new__(self.up.ns["ScheduleBatch"])
        b.reqs, b.device = ureqs, "cpu"
        b.req_to_token_pool, b.tree_cache = self.pool, self.inner
        b.token_to_kv_pool_allocator = self.kv_alloc
        b.spec_algorithm = SimpleNamespace(is_none=lambda: True)
        b.model_config = SimpleNamespace(is_encoder_decoder=False)
        b.maybe_evict_swa = lambda: None  # no SWA component: upstream's no-op
        return b

    # ------------------------------------------------------------ admission

    def _u(self, req: Request) -> Any:
        u = self._ureqs.get(req)
        if u is None:
            u = self._ureqs[req] = self.new_req(self.up, req, len(self._ureqs))
        return u

    def match(self, req: Request, key_len: int) -> bool:
        self._activate()
        if req.row is not None:
            raise ValueError("request is already admitted")
        u = self._u(req)
        limit = u._compute_max_prefix_len(len(u.origin_input_ids) + len(u.output_ids))
        if key_len != limit:
            raise DriverMismatch(f"the driver matches {key_len} tokens, SGLang {limit}", req)
        try:
            cached, hit = self._match(req, u, limit)
        except AssertionError as e:
            if NO_SLOT not in str(e):
                raise
            self.crashes["match: no slot for the copy-on-write"] += 1
            return False
        self._sync(req, u)
        req.computed = req.cached_len = cached
        req.kv_hit_len = hit
        return True

    def unmatch(self, req: Request) -> None:
        """``scheduler.py``'s refusal branch: drop the staged copy, free the fresh slot."""
        if req.row is not None or req.lock is not None:
            raise ValueError("request is admitted: abort it instead")
        kv = self._kv(self._u(req))
        kv.mamba_cow_src_index, kv.mamba_needs_clear = None, False
        if kv.mamba_pool_idx is not None:
            self.pool.mamba_allocator.free(kv.mamba_pool_idx.unsqueeze(-1))
            kv.mamba_pool_idx = None
        clear(req)

    # ----------------------------------------------------------- allocation

    def alloc_extend(self, reqs: list[Request], lens: list[int]) -> bool:
        self._activate()
        us_ = [self._u(r) for r in reqs]
        for req, u, n in zip(reqs, us_, lens, strict=True):
            self._no_pending(req)
            start = self._prefix_len(u)
            if start != req.computed:
                raise DriverMismatch(f"extend starts at {req.computed}, SGLang's at {start}", req)
            self._set_extend(u, start, n)
        b = self._batch(us_)
        b.prefix_lens = [self._prefix_len(u) for u in us_]
        b.extend_lens = list(lens)
        b.extend_num_tokens = sum(lens)
        b.seq_lens = torch.tensor([self._extend_end(u) for u in us_], dtype=torch.int64)
        b.seq_lens_cpu = b.seq_lens.clone()
        kvs = [self._kv(u) for u in us_]
        before = [(k.req_pool_idx, k.mamba_pool_idx, k.mamba_ping_pong_track_buffer) for k in kvs]
        try:
            self._alloc_for_extend(b)
        except (RuntimeError, AssertionError) as e:
            if isinstance(e, AssertionError) and "Not enough space for mamba" not in str(e):
                raise
            self._give_back(us_, before)
            self.crashes[f"alloc_for_extend: {str(e).splitlines()[0][:40]}"] += 1
            return False
        self._prepare_for_extend(reqs, us_, b)
        return True

    def _prepare_for_extend(self, reqs: list[Request], us_: list[Any], b: Any) -> None:
        """The cache part of ``ScheduleBatch.prepare_for_extend`` after its allocation."""
        for req, u in zip(reqs, us_, strict=True):
            self._extended(u)
            if self.extra_buffer:
                entry = b._mamba_radix_cache_v2_req_prepare_for_extend(u)
                if entry.track_mask:
                    slot = self._extend_track_slot(u, entry)
                    self._pending[req] = (slot, self._kv(u).mamba_last_track_seqlen, "extend")
        if any(self._kv(u).mamba_pool_idx is not None for u in us_):
            b._collect_deferred_mamba_cow_and_clear(us_)
        for req, u in zip(reqs, us_, strict=True):
            self._sync(req, u)
            req.computed = self._kv(u).kv_committed_len
            if self._extend_end(u) == len(u.full_untruncated_fill_ids):
                self._phase[req] = PROMPT_DONE

    def _give_back(self, us_: list[Any], before: list[tuple[Any, Any, Any]]) -> None:
        """Undo the rows and slots a failed ``alloc_for_extend`` took (SGLang would crash)."""
        for u, (row, slot, track) in zip(us_, before, strict=True):
            kv = self._kv(u)
            if track is None and kv.mamba_ping_pong_track_buffer is not None:
                self.pool.mamba_allocator.free(kv.mamba_ping_pong_track_buffer)
                self._drop_track_buffer(kv)
            if slot is None and kv.mamba_pool_idx is not None:
                self.pool.mamba_allocator.free(kv.mamba_pool_idx.unsqueeze(0))
                kv.mamba_pool_idx, kv.mamba_needs_clear = None, False
            if row is None and kv.req_pool_idx is not None:
                self.pool.free(u)

    def decode_fits(self, reqs: list[Request]) -> bool:
        self._activate()
        return bool(self._batch([self._u(r) for r in reqs]).check_decode_mem())

    def alloc_decode(self, reqs: list[Request]) -> bool:
        self._activate()
        us_ = [self._u(r) for r in reqs]
        for req in reqs:
            self._no_pending(req)
        b = self._batch(us_)
        kvs = [self._kv(u) for u in us_]
        b.seq_lens = torch.tensor([k.kv_committed_len for k in kvs], dtype=torch.int64)
        b.seq_lens_cpu = b.seq_lens.clone()
        b.req_pool_indices = torch.tensor([k.req_pool_idx for k in kvs], dtype=torch.int64)
        try:
            self._alloc_for_decode(b)
        except RuntimeError:
            self.crashes["alloc_for_decode: out of memory"] += 1
            return False
        every = self._track_every()
        for req, u, kv in zip(reqs, us_, kvs, strict=True):  # prepare_for_decode
            if self._phase.get(req) == PROMPT_DONE:
                raise DriverMismatch("it decodes without SGLang's prompt-end checkpoint", req)
            self._phase[req] = DECODING
            self._decoded(u)
            req.computed = kv.kv_committed_len
            if self.extra_buffer and kv.kv_committed_len % every == 0:
                slot = int(kv.mamba_ping_pong_track_buffer[kv.mamba_next_track_idx])
                self._pending[req] = (slot, kv.kv_committed_len, "decode")
        return True

    def track_slot(self, req: Request) -> int:
        got = self._pending.get(req)
        if got is None:
            msg = f"the driver tracks a state at {req.computed}; SGLang does not"
            raise DriverMismatch(msg, req)
        return got[0]

    def track(self, req: Request, position: int) -> None:
        self._activate()
        got = self._pending.pop(req, None)
        if got is None or got[1] != position:
            where = "nowhere" if got is None else got[1]
            raise DriverMismatch(f"the driver tracked {position}, SGLang tracks {where}", req)
        u = self._u(req)
        if got[2] == "decode":  # process_batch_result_decode, after the forward
            self._decode_track_update(u)
        self._sync(req, u)

    def _no_pending(self, req: Request) -> None:
        got = self._pending.pop(req, None)
        if got is not None:
            raise DriverMismatch(f"SGLang tracks a state at {got[1]}; the driver did not", req)

    # ---------------------------------------------------------- checkpoints

    def cache_unfinished(self, req: Request) -> None:
        self._activate()
        self._no_pending(req)
        u = self._u(req)
        chunked = self._extend_end(u) < len(u.full_untruncated_fill_ids)
        if not chunked:  # process_batch_result_prefill: only for a request that goes on decoding
            if self._phase.get(req) != PROMPT_DONE:
                raise DriverMismatch("a prompt-end checkpoint where SGLang takes none", req)
            self._phase[req] = CHECKPOINTED
        try:
            self._checkpoint(u, chunked)
        except AssertionError as e:
            if NO_SLOT not in str(e):
                raise
            self.crashes[self._skip_checkpoint(u)] += 1
        self._sync(req, u)
        req.lock = self._lock_handle(u)
        return None

    def finish(self, req: Request, insert: bool = True) -> None:
        self._activate()
        self._no_pending(req)
        if self._phase.pop(req, None) == CHECKPOINTED:
            raise DriverMismatch(
                "finished by its first token, it got a prompt-end checkpoint; SGLang's "
                f"process_batch_result_prefill caches it with {self.FINISH_CALL} only",
                req,
            )
        u = self._ureqs.pop(req)
        self._finishing(u)
        self._release(u, insert)
        clear(req)
        return None

    def abort(self, req: Request) -> None:
        """``release_kv_cache`` without caching (before admission: the staged slot only), then
        ``reset_for_retract``. A request locked but never given a row (its batch's memory
        could not be had, where SGLang would crash) is unlocked first."""
        self._activate()
        self._pending.pop(req, None)
        self._phase.pop(req, None)
        u = self._u(req)
        self._unlock_unadmitted(req, u)
        self._release(u, False)
        u.reset_for_retract()
        clear(req)

    def evict_kv_for(self, n: int) -> None:
        self._activate()
        self.up.common.evict_from_tree_cache(self.inner, n)

    # --------------------------------------------------------------- helpers

    def _sync(self, req: Request, u: Any) -> None:
        """Copy the upstream request's cache fields onto ours (the fields the scheduler and
        the checkpoint policies read)."""
        kv = self._kv(u)
        req.row = kv.req_pool_idx
        req.slot = None if kv.mamba_pool_idx is None else int(kv.mamba_pool_idx)
        buf = kv.mamba_ping_pong_track_buffer
        req.track_slots = None if buf is None else [int(s) for s in buf.tolist()]
        req.next_track = kv.mamba_next_track_idx or 0
        req.last_track_len = kv.mamba_last_track_seqlen
        req.node, req.prefix_len = u.last_node, kv.cache_protected_len
        req.branching_len = u.mamba_branching_seqlen
        cow = kv.mamba_cow_src_index
        req.cow_src = None if cow is None else int(cow)

    def check_conservation(self) -> None:
        """Every KV index (page) and state slot is free, in the tree, or held by one running
        request, exactly once (what SGLang's idle self-check asserts, per request here)."""
        page = self.page_size
        tree_kv = [int(i) for i in self.inner.all_values_flatten().tolist()]
        held_kv: list[int] = []
        held_slots: list[int] = []
        for u in self._ureqs.values():
            kv = self._kv(u)
            if kv.mamba_pool_idx is not None:
                held_slots.append(int(kv.mamba_pool_idx))
            if kv.mamba_ping_pong_track_buffer is not None:
                held_slots += [int(s) for s in kv.mamba_ping_pong_track_buffer.tolist()]
            if kv.req_pool_idx is not None:
                row = self.pool.req_to_token[kv.req_pool_idx]
                held_kv += row[kv.cache_protected_len : kv.kv_committed_len].tolist()
        kv_units = {i // page for i in tree_kv} | {i // page for i in held_kv}
        n_kv = len({i // page for i in tree_kv}) + len({i // page for i in held_kv})
        free_kv = self.kv_alloc.available_size() // page
        if n_kv != len(kv_units) or free_kv + n_kv != self.kv.capacity // page:
            raise AssertionError(f"KV: free {free_kv} + owned {n_kv} != {self.kv.capacity // page}")
        tree_slots = [int(s) for s in self.inner.all_mamba_values_flatten().tolist()]
        owned = tree_slots + held_slots
        free = self.pool.mamba_allocator.available_size()
        if len(set(owned)) != len(owned) or free + len(owned) != self.slots.capacity:
            raise AssertionError(f"slots: free {free} + owned {len(owned)} != capacity")
