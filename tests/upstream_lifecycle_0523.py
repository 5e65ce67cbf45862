"""SGLang 0.5.23's request lifecycle, run on CPU from its own wheel, behind the surface of
``mambaradix.lifecycle.CacheManager``: the oracle of the 0.5.23 lifecycle differential test.

``UpstreamLifecycle0523`` answers every call the scheduler (``mambaradix.scheduler.Scheduler``)
makes on its cache with 0.5.23's own code, driven the way 0.5.23's scheduler drives it:

=====================  ========================================================================
our call               what runs (upstream code unless marked *here*)
=====================  ========================================================================
match                  ``Req.init_next_round_input``: ``refresh_fill_ids``,
                       ``_compute_max_prefix_len``, ``common.match_kv_cache`` with
                       ``cow_mamba=True`` (``UnifiedRadixCache.match_prefix``, the MAMBA
                       component's copy-on-write)
unmatch                *here*, after ``scheduler.py:4285-4300`` (the refusal branch): drop the
                       staged copy, free the fresh copy-on-write slot
lock / unlock          ``UnifiedRadixCache.lock`` / ``unlock`` on ``req.last_node``
                       (``PrefillAdder._commit_prefill_admission``)
alloc_extend           ``allocation.alloc_for_extend`` (``ensure_mamba_capacity``,
                       ``HybridReqToTokenPool.alloc``, ``alloc_token_slots`` /
                       ``alloc_paged_token_slots_extend`` with the paged allocator's naive path,
                       the row writes), then ``ScheduleBatch._mamba_radix_cache_v2_req_prepare_
                       for_extend`` and ``_collect_deferred_mamba_cow_and_clear``
decode_fits            ``ScheduleBatch.check_decode_mem`` (the allocator's
                       ``check_decode_capacity``)
alloc_decode           ``allocation.alloc_for_decode``; the track mask of ``prepare_for_decode``
                       (*here*, one line: ``seq_len % mamba_track_grid == 0``)
track / track_slot     the slot the forward writes; after a decode, the three lines of
                       ``_handle_finish_state_updated_req`` for a completed boundary (*here*)
                       and ``SchedulerBatchResultProcessor._mamba_prefix_cache_update``
cache_unfinished       ``common.checkpoint_kv_cache`` (``UnifiedRadixCache.checkpoint``)
finish / abort         ``common.release_kv_cache`` (``checkpoint=True`` / ``False``), then
                       ``Req.reset_for_retract`` after an abort (a retraction re-queues it)
evict_kv_for           ``common.evict_from_tree_cache``
=====================  ========================================================================

Everything upstream is loaded from the wheel at run time (nothing is copied here) by
``upstream_unified.load_unified`` (its module list: the tree and these scheduler helpers), plus
single classes and methods compiled out of files that cannot be imported on CPU
(``memory_pool.py``: ``ReqToTokenPool``, ``HybridReqToTokenPool``; ``managers/
schedule_batch.py``: ``ReqKvInfo``, ``Req`` and ``ScheduleBatch`` methods; ``managers/
scheduler_components/batch_result_processor.py``: the decode track update). What is written
here is GPU/server machinery only: ``__init__`` of the fake ``Req`` / batch / pool objects (the
fields upstream reads) and the state tensors (``mamba_pool.copy_from`` / ``clear_slots`` do
nothing: only slot bookkeeping is compared).

As the 0.5.15.post1 oracle (``upstream_lifecycle``): where the driver and upstream must agree on
a scheduler rule that lives outside the cache, the oracle raises ``DriverMismatch``; where
SGLang itself would stop, it follows the driver and counts it in ``crashes`` (the differential
requires none). Not modelled: ``MambaSlotAllocator.alloc_group_begin/end`` around the admission
loop and the order of the free lists (slot identities only), and the overlap scheduler.
"""

from __future__ import annotations

import dataclasses
import logging
from array import array
from collections import Counter
from types import SimpleNamespace
from typing import Any, NamedTuple, Optional

import numpy as np
import torch

import upstream_unified as uu
from mambaradix.lifecycle import Request
from upstream_lifecycle import DriverMismatch, _View

_MC = "srt.mem_cache"
_PICKS: dict[str, dict[str, tuple[str, ...] | None]] = {
    "sglang/srt/mem_cache/memory_pool.py": {
        "ReqToTokenPool": (
            "write",
            "available_size",
            "alloc",
            "alloc_rows",
            "free_rows",
            "free",
            "alloc_aux_to_lengths",
        ),
        "HybridReqToTokenPool": (
            "alloc",
            "translate_mamba_indices",
            "get_mamba_ping_pong_other_idx",
            "get_mamba_ping_pong_keep_idx",
            "_alloc_ping_pong_buffer",
            "set_mamba_ping_pong_slot",
            "donate_mamba_ping_pong_slot",
            "free_mamba_cache",
        ),
    },
    "sglang/srt/managers/schedule_batch.py": {
        "ReqKvInfo": None,
        "_MambaRadixCacheV2TrackEntry": None,
        "Req": (
            "seqlen",
            "owned_kv_len",
            "finished",
            "extend_len",
            "get_fill_ids",
            "refresh_fill_ids",
            "init_next_round_input",
            "_compute_max_prefix_len",
            "reset_for_retract",
        ),
        "ScheduleBatch": (
            "_mamba_radix_cache_v2_req_prepare_for_extend",
            "_collect_deferred_mamba_cow_and_clear",
            "new_tokens_required_next_decode",
            "check_decode_mem",
        ),
    },
    "sglang/srt/managers/scheduler_components/batch_result_processor.py": {
        "SchedulerBatchResultProcessor": (
            "_mamba_prefix_cache_update",
            "_mamba_assert_committed_len_lookahead",
        ),
    },
}
_NO_SLOT = "Can not alloc mamba cache"
_PROMPT_DONE, _CHECKPOINTED, _DECODING = "prompt done", "checkpointed at the prompt end", "decoding"

_loaded: SimpleNamespace | None = None


def load_lifecycle() -> SimpleNamespace:
    """Load (once per process) everything ``UpstreamLifecycle0523`` runs; returns it by name."""
    global _loaded
    if _loaded is not None:
        return _loaded
    pkg = uu.load_unified()
    mods = {m: pkg.module(f"{_MC}.{m}") for m in ("allocation", "common", "allocator.mamba")}
    rc = pkg.overrides["srt.runtime_context"]
    ns: dict[str, Any] = {"torch": torch, "np": np, "array": array, "NamedTuple": NamedTuple}
    ns.update(Optional=Optional, List=list, Tuple=tuple, dataclasses=dataclasses)
    ns.update(logger=logging.getLogger("sglang.oracle.0523"), _MAMBA_DEBUG_ASSERTS=False)
    ns.update({k: rc[k] for k in ("get_exec", "get_serving", "get_spec", "get_parallel")})
    ns.update({k: rc[k] for k in ("mamba_cache_chunk_size", "mamba_checkpoint_grid")})
    ns.update(mamba_track_grid=rc["mamba_track_grid"], async_h2d=uu.up("srt.utils").async_h2d)
    ns.update(ceil_align=uu.up("srt.utils").ceil_align, num_beam_member_rows=lambda reqs: 0)
    ns["ComponentType"] = uu.up(f"{_MC}.unified_cache.component_type").ComponentType
    ns["RetractionBackup"] = object
    ns["match_kv_cache"] = _Recorded(mods["common"].match_kv_cache)
    for member, wanted in _PICKS.items():
        pkg.pick(member, wanted, ns)
    _loaded = SimpleNamespace(ns=ns, pkg=pkg, **{k.rsplit(".", 1)[-1]: v for k, v in mods.items()})
    return _loaded


class _Recorded:
    """Calls ``fn``, keeping its last result (the match result ``init_next_round_input``
    discards: its full KV hit)."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.last = fn, None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.last = self.fn(*args, **kwargs)
        return self.last


# --------------------------------------------------------------------------- fakes


def _pool_class(up: SimpleNamespace) -> type:
    marker = uu.up(f"{_MC}.memory_pool").HybridReqToTokenPool

    class Pool(up.ns["HybridReqToTokenPool"], up.ns["ReqToTokenPool"], marker):  # type: ignore[misc]
        """Upstream's ReqToTokenPool / HybridReqToTokenPool methods; __init__ builds only the
        fields they read."""

        def __init__(self, rows: int, context: int, slots: int, extra: bool, track: int) -> None:
            self.size, self._alloc_size, self.max_context_len = rows, rows + 1, context
            self.device = "cpu"
            self.req_to_token = torch.zeros((rows + 1, context), dtype=torch.int32)
            self.free_slots = list(range(1, rows + 1))
            self.req_generation = torch.zeros(rows + 1, dtype=torch.int64)
            self._aux_cache = self._on_alloc_rows = None
            self.mamba_ping_pong_track_buffer_size = track
            self.mamba_initial_tracking_slots = track if extra else 0
            self.enable_mamba_extra_buffer = extra
            self.enable_mamba_extra_buffer_lazy = False
            self.mamba_pool = SimpleNamespace(
                replayssm_write_pos=None,
                replayssm_spec_write_pos=None,
                copy_from=_no,
                clear_slots=_no,
                size=slots,
            )
            self.mamba_allocator = up.mamba.MambaSlotAllocator(size=slots, device="cpu")
            self.mamba_ckpt_pool = None
            self.req_index_to_mamba_index_mapping = torch.zeros(rows + 1, dtype=torch.int32)
            self.req_index_to_mamba_ping_pong_track_buffer_mapping = torch.zeros(
                (rows + 1, track), dtype=torch.int64
            )

    return Pool


def _no(*args: Any, **kwargs: Any) -> bool:
    return False


def _kv_allocator(size: int, page: int) -> Any:
    if page == 1:
        cls = uu.up(f"{_MC}.allocator.token").TokenToKVPoolAllocator
        return cls(size, torch.bfloat16, "cpu", None, False)
    cls = uu.up(f"{_MC}.allocator.paged").PagedTokenToKVPoolAllocator
    return cls(size, page, torch.bfloat16, "cpu", None, False)


def _new_req(up: SimpleNamespace, req: Request, rid: int) -> Any:
    """An upstream ``Req`` (its lifecycle methods) with the fields those methods and the cache
    read; input and output arrays are shared with our ``Request``."""
    u = up.ns["Req"].__new__(up.ns["Req"])
    u.rid, u.extra_key, u.cache_salt = str(rid), req.extra_key, None
    u.kv = up.ns["ReqKvInfo"]()
    u.origin_input_ids, u.output_ids = req.input_ids, req.output_ids
    u.full_untruncated_fill_ids = array("q")
    u.is_dllm = _no
    u.session = u.positional_embed_overrides = u.multimodal_inputs = None
    u.dllm_config = u.input_embeds = u.finished_reason = u.finished_len = None
    u.last_node = u.last_host_node = u.best_match_node = u.lock = None
    u.extend_end = u.kv_rotation_base = u.mamba_branching_seqlen = None
    u.swa_branching_seqlen = u.priority = u.session_id = None
    u.return_logprob, u.logprob_start_len = False, -1
    u.skip_radix_cache_insert = u.is_retracted = u.retracted_stain = False
    u.prefix_len = u.reasoning_tokens = u.retraction_count = 0
    u.inflight_middle_chunks = u.already_computed = 0
    u.extend_batch_idx = u.decode_batch_idx = 0
    u.host_hit_length = u.swa_host_hit_length = u.mamba_host_hit_length = 0
    u.num_matched_prefix_tokens = 0
    return u


def _batch(oracle: UpstreamLifecycle0523, ureqs: list[Any]) -> Any:
    """A ``ScheduleBatch`` with what ``alloc_for_extend/decode`` and the picked methods read."""
    b = oracle.up.ns["ScheduleBatch"].__new__(oracle.up.ns["ScheduleBatch"])
    b.reqs, b.device = ureqs, "cpu"
    b.req_to_token_pool, b.tree_cache = oracle.pool, oracle.inner
    b.token_to_kv_pool_allocator = oracle.kv_alloc
    b.spec_algorithm = SimpleNamespace(is_none=lambda: True)
    b.model_config = SimpleNamespace(
        is_encoder_decoder=False, hf_text_config=SimpleNamespace(mamba_chunk_size=64)
    )
    b.hisparse_coordinator = None
    b.is_dllm = _no
    b.maybe_evict_swa = lambda: None  # no SWA component: upstream's no-op
    return b


# --------------------------------------------------------------------------- the oracle


class UpstreamLifecycle0523:
    """SGLang 0.5.23's request lifecycle behind ``CacheManager``'s surface (see the module
    docstring). Arguments as ``upstream_lifecycle.UpstreamLifecycle``'s."""

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
        self.up = up = load_lifecycle()
        self.extra_buffer = strategy == "extra_buffer"
        self.strategy, self.page_size = strategy, page_size
        self.track_slots = track_slots if self.extra_buffer else 0
        self.sglang = True  # SGLang's rules, by construction
        self.rules = "sglang-0.5.23"
        self._settings = (chunk_size, self.extra_buffer, track_interval, page_size)
        self._activate()
        self.kv_alloc = _kv_allocator(kv_tokens, page_size)
        self.pool = _pool_class(up)(rows, max_context, state_slots, self.extra_buffer, track_slots)
        params = uu.cache_params(self.pool, self.kv_alloc, page_size, self.extra_buffer)
        self.inner = uu.up(f"{_MC}.unified_radix_cache").UnifiedRadixCache(params)
        self.inner.pretty_print = lambda: None  # upstream prints the tree on out-of-memory paths
        proc = up.ns["SchedulerBatchResultProcessor"]
        self.processor = proc.__new__(proc)
        self.processor.tree_cache = self.inner
        inner = self.inner
        self.tree = _View(
            chunk_size=chunk_size,
            page_size=page_size,
            compat="sglang-0.5.23",
            full_evictable_size=inner.full_evictable_size,
            full_protected_size=inner.full_protected_size,
            state_evictable_size=inner.mamba_evictable_size,
            state_protected_size=inner.mamba_protected_size,
        )
        self.kv = _View(
            available_size=self.kv_alloc.available_size, capacity=kv_tokens, reclaims_cache=False
        )
        self.rows = _View(
            available_size=self.pool.available_size,
            capacity=rows,
            max_context=self.pool.max_context_len,  # the width of upstream's table
        )
        self.slots = _View(
            available_size=self.pool.mamba_allocator.available_size, capacity=state_slots
        )
        self._ureqs: dict[Request, Any] = {}
        self._pending: dict[Request, tuple[int, int, str]] = {}  # slot, position, kind
        self._phase: dict[Request, str] = {}  # after its prompt: done, checkpointed, decoding
        self.crashes: Counter[str] = Counter()  # where SGLang would have stopped
        self.worked_around: Counter[str] = Counter()  # none known in 0.5.23

    def _activate(self) -> None:
        s = uu.SETTINGS
        s.chunk_size, s.extra_buffer, s.track_interval, s.page_size = self._settings

    def _u(self, req: Request) -> Any:
        u = self._ureqs.get(req)
        if u is None:
            u = self._ureqs[req] = _new_req(self.up, req, len(self._ureqs))
        return u

    # ------------------------------------------------------------ admission

    def match(self, req: Request, key_len: int) -> bool:
        self._activate()
        if req.row is not None:
            raise ValueError("request is already admitted")
        u = self._u(req)
        limit = u._compute_max_prefix_len(len(u.origin_input_ids) + len(u.output_ids))
        if key_len != limit:
            raise DriverMismatch(f"the driver matches {key_len} tokens, SGLang {limit}", req)
        try:
            u.init_next_round_input(self.inner)
        except AssertionError as e:
            if _NO_SLOT not in str(e):
                raise
            self.crashes["match: no slot for the copy-on-write"] += 1
            return False
        self._sync(req, u)
        req.computed = req.cached_len = u.prefix_len
        req.kv_hit_len = self.up.ns["match_kv_cache"].last.full_kv_hit_length
        return True

    def unmatch(self, req: Request) -> None:
        """``scheduler.py``'s refusal branch: drop the staged copy, free the fresh slot."""
        if req.row is not None or req.lock is not None:
            raise ValueError("request is admitted: abort it instead")
        u = self._u(req)
        u.kv.mamba_cow_src_index, u.kv.mamba_needs_clear = None, False
        if u.kv.holds_mamba:
            self.pool.mamba_allocator.free(u.kv.mamba_pool_idx.unsqueeze(-1))
            u.kv.mamba_pool_idx = None
        _clear(req)

    def lock(self, req: Request) -> None:
        u = self._u(req)
        u.lock = self.inner.lock(u.last_node)
        req.lock = u.lock

    def unlock(self, req: Request) -> None:
        u = self._u(req)
        self.inner.unlock(u.lock)
        u.lock = req.lock = None

    # ----------------------------------------------------------- allocation

    def alloc_extend(self, reqs: list[Request], lens: list[int]) -> bool:
        self._activate()
        us_ = [self._u(r) for r in reqs]
        for req, u, n in zip(reqs, us_, lens, strict=True):
            self._no_pending(req)
            if u.prefix_len != req.computed:
                msg = f"extend starts at {req.computed}, SGLang's at {u.prefix_len}"
                raise DriverMismatch(msg, req)
            u.extend_end = u.prefix_len + n
        b = _batch(self, us_)
        b.prefix_lens = [u.prefix_len for u in us_]
        b.extend_lens = list(lens)
        b.extend_num_tokens = sum(lens)
        b.seq_lens = torch.tensor([u.extend_end for u in us_], dtype=torch.int64)
        b.seq_lens_cpu = b.seq_lens.clone()
        before = [
            (u.kv.req_pool_idx, u.kv.mamba_pool_idx, u.kv.mamba_ping_pong_track_buffer) for u in us_
        ]
        try:
            self.up.allocation.alloc_for_extend(b)
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
            if self.extra_buffer:
                entry = b._mamba_radix_cache_v2_req_prepare_for_extend(u)
                if entry.track_mask:
                    slot = int(u.kv.mamba_ping_pong_track_buffer[entry.track_position])
                    self._pending[req] = (slot, u.kv.mamba_last_track_seqlen, "extend")
        if any(u.kv.holds_mamba for u in us_):
            b._collect_deferred_mamba_cow_and_clear(us_)
        for req, u in zip(reqs, us_, strict=True):
            self._sync(req, u)
            req.computed = u.kv.kv_committed_len
            if u.extend_end == len(u.full_untruncated_fill_ids):
                self._phase[req] = _PROMPT_DONE

    def _give_back(self, us_: list[Any], before: list[tuple[Any, Any, Any]]) -> None:
        """Undo the rows and slots a failed ``alloc_for_extend`` took (SGLang would crash)."""
        for u, (row, slot, track) in zip(us_, before, strict=True):
            if track is None and u.kv.mamba_ping_pong_track_buffer is not None:
                self.pool.mamba_allocator.free(u.kv.mamba_ping_pong_track_buffer)
                u.kv.mamba_ping_pong_track_buffer = None
            if slot is None and u.kv.mamba_pool_idx is not None:
                self.pool.mamba_allocator.free(u.kv.mamba_pool_idx.unsqueeze(0))
                u.kv.mamba_pool_idx, u.kv.mamba_needs_clear = None, False
            if row is None and u.kv.req_pool_idx is not None:
                self.pool.free(u)

    def decode_fits(self, reqs: list[Request]) -> bool:
        self._activate()
        return bool(_batch(self, [self._u(r) for r in reqs]).check_decode_mem())

    def alloc_decode(self, reqs: list[Request]) -> bool:
        self._activate()
        us_ = [self._u(r) for r in reqs]
        for req in reqs:
            self._no_pending(req)
        b = _batch(self, us_)
        b.seq_lens = torch.tensor([u.kv.kv_committed_len for u in us_], dtype=torch.int64)
        b.seq_lens_cpu = b.seq_lens.clone()
        b.req_pool_indices = torch.tensor([u.kv.req_pool_idx for u in us_], dtype=torch.int64)
        b.req_pool_indices_cpu = b.req_pool_indices.clone()
        try:
            self.up.allocation.alloc_for_decode(b, token_per_req=1)
        except RuntimeError:
            self.crashes["alloc_for_decode: out of memory"] += 1
            return False
        grid = uu.up("srt.runtime_context").mamba_track_grid(self.page_size)
        for req, u in zip(reqs, us_, strict=True):
            if self._phase.get(req) == _PROMPT_DONE:
                raise DriverMismatch("it decodes without SGLang's prompt-end checkpoint", req)
            self._phase[req] = _DECODING
            req.computed = u.kv.kv_committed_len
            if self.extra_buffer and u.kv.kv_committed_len % grid == 0:  # prepare_for_decode
                slot = int(u.kv.mamba_ping_pong_track_buffer[u.kv.mamba_next_track_idx])
                self._pending[req] = (slot, u.kv.kv_committed_len, "decode")
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
            u.kv.mamba_last_track_idx = u.kv.mamba_next_track_idx
            u.kv.mamba_prev_track_seqlen = u.kv.mamba_last_track_seqlen
            u.kv.mamba_last_track_seqlen = u.kv.kv_committed_len
            b = _batch(self, [u])
            self.processor._mamba_prefix_cache_update(u, b, None, 0, known_boundary=True)
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
        chunked = u.extend_end < len(u.full_untruncated_fill_ids)
        if not chunked:  # process_batch_result_prefill: only for a request that goes on decoding
            if self._phase.get(req) != _PROMPT_DONE:
                raise DriverMismatch("a prompt-end checkpoint where SGLang takes none", req)
            self._phase[req] = _CHECKPOINTED
        try:
            self.up.common.checkpoint_kv_cache(u, self.inner)
        except AssertionError as e:
            if _NO_SLOT not in str(e):
                raise
            self.crashes["checkpoint: no slot"] += 1
            u.prefix_len = u.extend_end
        self._sync(req, u)
        req.lock = u.lock
        return None

    def finish(self, req: Request, insert: bool = True) -> None:
        self._activate()
        self._no_pending(req)
        if self._phase.pop(req, None) == _CHECKPOINTED:
            raise DriverMismatch(
                "finished by its first token, it got a prompt-end checkpoint; SGLang's "
                "process_batch_result_prefill caches it with release_kv_cache only",
                req,
            )
        u = self._ureqs.pop(req)
        u.finished_reason = "finished"
        self.up.common.release_kv_cache(u, self.inner, checkpoint=insert)
        _clear(req)
        return None

    def abort(self, req: Request) -> None:
        """``release_kv_cache(checkpoint=False)`` (before admission: the staged slot only),
        then ``reset_for_retract``. A request locked but never given a row (its batch's memory
        could not be had, where SGLang would crash) is unlocked first."""
        self._activate()
        self._pending.pop(req, None)
        self._phase.pop(req, None)
        u = self._u(req)
        if not u.kv.holds_kv and u.lock is not None:
            self.inner.unlock(u.lock)
            u.lock = None
        self.up.common.release_kv_cache(u, self.inner, checkpoint=False)
        u.reset_for_retract()
        _clear(req)

    def evict_kv_for(self, n: int) -> None:
        self._activate()
        self.up.common.evict_from_tree_cache(self.inner, n)

    # --------------------------------------------------------------- helpers

    def _sync(self, req: Request, u: Any) -> None:
        """Copy the upstream request's cache fields onto ours (the fields the scheduler and
        the checkpoint policies read)."""
        kv = u.kv
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
        request, exactly once."""
        page = self.page_size
        tree_kv = [int(i) for i in self.inner.all_values_flatten().tolist()]
        held_kv: list[int] = []
        held_slots: list[int] = []
        for u in self._ureqs.values():
            kv = u.kv
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


def _clear(req: Request) -> None:
    """Forget the cache fields of our ``Request`` (it holds nothing now)."""
    req.row = req.slot = req.track_slots = req.node = req.lock = req.cow_src = None
    req.last_track_len = req.branching_len = None
    req.next_track = req.prefix_len = req.computed = 0
