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
from types import SimpleNamespace
from typing import Any, NamedTuple, Optional

import numpy as np
import torch

import upstream_unified as uu
from lifecycle_oracle import LifecycleOracle, init_pool, no
from mambaradix.lifecycle import Request

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
            init_pool(self, up, rows, context, slots, extra, track)
            self.req_generation = torch.zeros(rows + 1, dtype=torch.int64)
            self._aux_cache = self._on_alloc_rows = None
            self.mamba_initial_tracking_slots = track if extra else 0
            self.mamba_pool.replayssm_spec_write_pos = None

    return Pool


def _kv_allocator(up: SimpleNamespace, size: int, page: int) -> Any:
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
    u.is_dllm = no
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


# --------------------------------------------------------------------------- the oracle


class UpstreamLifecycle0523(LifecycleOracle):
    """SGLang 0.5.23's request lifecycle behind ``CacheManager``'s surface (see the module
    docstring and ``lifecycle_oracle.LifecycleOracle``)."""

    RULES = "sglang-0.5.23"
    FINISH_CALL = "release_kv_cache"
    load = staticmethod(load_lifecycle)
    pool_class = staticmethod(_pool_class)
    kv_allocator = staticmethod(_kv_allocator)
    new_req = staticmethod(_new_req)

    def _configure(self, chunk_size: int, track_interval: int) -> None:
        self._settings = (chunk_size, self.extra_buffer, track_interval, self.page_size)

    def _activate(self) -> None:
        s = uu.SETTINGS
        s.chunk_size, s.extra_buffer, s.track_interval, s.page_size = self._settings

    def _new_tree(self, chunk_size: int) -> Any:
        params = uu.cache_params(self.pool, self.kv_alloc, self.page_size, self.extra_buffer)
        return uu.up(f"{_MC}.unified_radix_cache").UnifiedRadixCache(params)

    def _kv(self, u: Any) -> Any:
        return u.kv

    def _extend_end(self, u: Any) -> int:
        return u.extend_end  # type: ignore[no-any-return]

    def _prefix_len(self, u: Any) -> int:
        return u.prefix_len  # type: ignore[no-any-return]

    def _match(self, req: Request, u: Any, limit: int) -> tuple[int, int]:
        u.init_next_round_input(self.inner)
        return u.prefix_len, self.up.ns["match_kv_cache"].last.full_kv_hit_length

    def lock(self, req: Request) -> None:
        u = self._u(req)
        u.lock = self.inner.lock(u.last_node)
        req.lock = u.lock

    def unlock(self, req: Request) -> None:
        u = self._u(req)
        self.inner.unlock(u.lock)
        u.lock = req.lock = None

    def _set_extend(self, u: Any, start: int, n: int) -> None:
        u.extend_end = start + n

    def _alloc_for_extend(self, b: Any) -> None:
        self.up.allocation.alloc_for_extend(b)

    def _extend_track_slot(self, u: Any, entry: Any) -> int:
        return int(u.kv.mamba_ping_pong_track_buffer[entry.track_position])

    def _alloc_for_decode(self, b: Any) -> None:
        b.req_pool_indices_cpu = b.req_pool_indices.clone()
        self.up.allocation.alloc_for_decode(b, token_per_req=1)

    def _track_every(self) -> int:
        return uu.up("srt.runtime_context").mamba_track_grid(self.page_size)  # type: ignore[no-any-return]

    def _decode_track_update(self, u: Any) -> None:
        """The three lines of ``_handle_finish_state_updated_req`` for a completed boundary,
        then the processor's update."""
        u.kv.mamba_last_track_idx = u.kv.mamba_next_track_idx
        u.kv.mamba_prev_track_seqlen = u.kv.mamba_last_track_seqlen
        u.kv.mamba_last_track_seqlen = u.kv.kv_committed_len
        b = self._batch([u])
        self.processor._mamba_prefix_cache_update(u, b, None, 0, known_boundary=True)

    def _checkpoint(self, u: Any, chunked: bool) -> None:
        self.up.common.checkpoint_kv_cache(u, self.inner)

    def _skip_checkpoint(self, u: Any) -> str:
        u.prefix_len = u.extend_end
        return "checkpoint: no slot"

    def _lock_handle(self, u: Any) -> Any:
        return u.lock

    def _finishing(self, u: Any) -> None:
        u.finished_reason = "finished"

    def _release(self, u: Any, insert: bool) -> None:
        self.up.common.release_kv_cache(u, self.inner, checkpoint=insert)

    def _unlock_unadmitted(self, req: Request, u: Any) -> None:
        if not u.kv.holds_kv and u.lock is not None:
            self.inner.unlock(u.lock)
            u.lock = None

    def _batch(self, ureqs: list[Any]) -> Any:
        b = super()._batch(ureqs)
        b.model_config = SimpleNamespace(
            is_encoder_decoder=False, hf_text_config=SimpleNamespace(mamba_chunk_size=64)
        )
        b.hisparse_coordinator = None
        b.is_dllm = no
        return b
