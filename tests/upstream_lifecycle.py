"""SGLang 0.5.15.post1's request lifecycle, run on CPU from its own wheel, behind the surface of
``mambaradix.lifecycle.CacheManager``: the oracle of the lifecycle differential test.

``UpstreamLifecycle`` answers every call the scheduler (``mambaradix.scheduler.Scheduler``)
makes on its cache with upstream's own code, driven the way SGLang's scheduler drives it:

=====================  ========================================================================
our call               what runs (upstream code unless marked *here*)
=====================  ========================================================================
match                  ``Req._compute_max_prefix_len``; ``MambaRadixCache.match_prefix`` with
                       ``cow_mamba=True`` on ``origin_input_ids + output_ids`` (the scheduler's
                       ``init_next_round_input``)
unmatch                *here*, after ``scheduler.py``'s refusal branch: drop the staged copy,
                       free the fresh copy-on-write slot
lock / unlock          ``inc_lock_ref`` / ``dec_lock_ref`` on ``req.last_node``
alloc_extend           ``common.alloc_for_extend`` (``alloc_req_slots`` head-room eviction,
                       ``HybridReqToTokenPool.alloc``, ``alloc_token_slots`` /
                       ``alloc_paged_token_slots_extend``, the row writes), then
                       ``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend`` (what
                       the forward tracks) and ``_collect_deferred_mamba_cow_and_clear``
decode_fits            ``ScheduleBatch.check_decode_mem``
alloc_decode           ``common.alloc_for_decode``; ``kv_committed_len += 1`` and the track
                       mask of ``prepare_for_decode`` (*here*, two lines)
track / track_slot     the slot the forward writes; after a decode,
                       ``SchedulerBatchResultProcessor._mamba_prefix_cache_update``
cache_unfinished       ``MambaRadixCache.cache_unfinished_req``
finish / abort         ``common.release_kv_cache`` (``is_insert`` / ``False``), then
                       ``Req.reset_for_retract`` after an abort (a retraction re-queues it)
evict_kv_for           ``common.evict_from_tree_cache``
=====================  ========================================================================

Everything upstream is loaded from the wheel at run time (nothing is copied here): the four
modules ``upstream_sglang`` loads, plus ``mem_cache/common.py`` and ``mem_cache/allocator/
{base,token,paged,mamba}.py`` as modules, plus single classes and methods compiled out of files
that cannot be imported on CPU (``memory_pool.py``: ``ReqToTokenPool``, ``HybridReqToTokenPool``;
``managers/schedule_batch.py``: ``Req`` and ``ScheduleBatch`` methods;
``scheduler_components/batch_result_processor.py``: the decode track update; ``utils/common.py``:
``Range`` and four arithmetic helpers). What is written here is GPU/server machinery only:
``__init__`` of the fake ``Req`` / batch / pool objects (the fields upstream reads), the state
tensors (``mamba_pool.copy_from`` / ``clear_slots`` do nothing: only slot bookkeeping is
compared), and the two Triton allocator kernels (``alloc_extend_kernel`` runs upstream's own
``alloc_extend_naive``; ``alloc_decode_kernel`` is a Python loop of the kernel's arithmetic).

Where the driver and upstream must agree on a scheduler rule that lives outside the cache, the
oracle computes upstream's answer and raises ``DriverMismatch`` if the driver's call differs:
the key length of a match (``_compute_max_prefix_len``), the extend start (``prefix_indices``:
a chunk end not stashed shows here), where the forward tracks a state (extra_buffer, prefill
and decode), and the prompt end (``process_batch_result_prefill``: ``cache_unfinished_req`` for
a request that goes on decoding, none for one its first token finished).

Where SGLang itself would stop, the oracle follows the driver and counts it in ``crashes``
(SGLang sizes its pools so that none of these happen: ``max_running_requests <= state slots //
3``, with extra_buffer ``// (3 + ping-pong size)``; the differential test requires ``crashes``
to stay empty):

* ``match_prefix`` asserts "Can not alloc mamba cache" when no slot is left for the
  copy-on-write even after evicting one state; the oracle returns False (refused, nothing staged).
* ``alloc_req_slots`` / ``HybridReqToTokenPool.alloc`` / ``alloc_token_slots`` raise or assert
  when rows, slots or KV are short (the admission budget should prevent it); the oracle gives
  back what the call took and returns False.
* ``cache_unfinished_req`` asserts when no slot can be had for the checkpoint (upstream #36770);
  the oracle skips the checkpoint as ``_skip_cache_unfinished_req`` would.

Upstream bugs stepped around, counted in ``worked_around``:

* SGLang #28692: the scheduler matches ``RadixKey(fill_ids, limit=len - 1)``; ``child_key``
  ignores ``limit``, so when the limit is shorter than one page (a prompt of exactly one page,
  page_size > 1) a cached first page is found, the page-rounded match is 0 and the split leaves
  an empty node that breaks the next eviction. The oracle then matches the sliced key, which is
  what ``limit`` is documented to mean (a test shows the bug on upstream's own class).

Not modelled, because only slot and index *identities* change, never a count or a tree
decision: ``MambaSlotAllocator.alloc_group_begin/end`` around the admission loop
(pre-allocated copy-on-write destinations), and the order of the free lists.

Other departures: ``cache_unfinished`` / ``finish`` return None (upstream does not report
whether the tree already held the state; SGLang's checkpoint policy does not read it);
``Request.kv_hit_len`` is set to the matched prefix (upstream does not report the KV hit); the
tree's debug ``pretty_print`` on an out-of-memory path is silenced.

Scope: the oracle answers the calls the driver makes, in the driver's order. Rules that live
only in the driver (the admission budget, the retraction order and the eviction after each
retraction) run the same on both sides and are not checked here. The driver is SGLang's
non-overlap event loop; SGLang's overlap scheduler (its default, with 2 ping-pong slots)
processes each batch's results one step later, an interleaving this comparison does not cover.

Note: like ``upstream_sglang``, this occupies the ``sglang`` package name in ``sys.modules``.
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import os
import sys
import types
import zipfile
from array import array
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np
import torch

import upstream_sglang as us
from lifecycle_oracle import LifecycleOracle, init_pool, no
from mambaradix.lifecycle import Request

_SRT = "sglang/srt"
_MODULES = (  # loaded as modules, in this order
    "mem_cache/allocator/base",
    "mem_cache/allocator/token",
    "mem_cache/allocator/paged",
    "mem_cache/allocator/mamba",
    "mem_cache/common",
)
_PICKS: dict[str, dict[str, tuple[str, ...] | None]] = {  # compiled out of files: name -> methods
    "utils/common": {
        "Range": None,
        "ceil_div": None,
        "ceil_align": None,
        "next_power_of_2": None,
        "get_num_new_pages": None,
    },
    "mem_cache/memory_pool": {
        "ReqToTokenPool": ("write", "available_size", "alloc", "free"),
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
    "managers/schedule_batch": {
        "Req": (
            "_cache_commit_len",
            "pop_committed_kv_cache",
            "pop_overallocated_kv_cache",
            "finished",
            "set_extend_range",
            "get_fill_ids",
            "_compute_max_prefix_len",
            "reset_for_retract",
        ),
        "_MambaRadixCacheV2TrackEntry": None,
        "ScheduleBatch": (
            "_mamba_radix_cache_v2_req_prepare_for_extend",
            "_collect_deferred_mamba_cow_and_clear",
            "new_tokens_required_next_decode",
            "check_decode_mem",
        ),
    },
    "managers/scheduler_components/batch_result_processor": {
        "SchedulerBatchResultProcessor": (
            "_mamba_prefix_cache_update",
            "_mamba_check_track_boundary",
        ),
    },
}
_loaded: SimpleNamespace | None = None


# --------------------------------------------------------------------------- server args


class _ServerArgs:
    """What ``get_global_server_args()`` returns to the loaded code (the fields it reads)."""

    speculative_algorithm = None
    strip_thinking_cache = False
    dcp_size = 1
    extra_metric_labels = None

    def __init__(self, page_size: int, chunk_size: int, extra: bool, interval: int) -> None:
        self.page_size = page_size
        self.mamba_cache_chunk_size = chunk_size
        self.mamba_track_interval = interval
        self._extra = extra

    def enable_mamba_extra_buffer(self) -> bool:
        return self._extra

    def enable_mamba_extra_buffer_lazy(self) -> bool:
        return False


_ACTIVE: list[_ServerArgs] = []


def _server_args() -> _ServerArgs:
    return _ACTIVE[0]


# --------------------------------------------------------------------------- loading


def _wheel_file(member: str) -> Path:
    """Extract ``sglang/srt/<member>.py`` from the wheel once (next to upstream_sglang's)."""
    wheel = us.find_wheel()
    target = us.REPO_ROOT / ".cache" / "sglang" / "src" / wheel.stem / _SRT / f"{member}.py"
    if not target.is_file():
        with zipfile.ZipFile(wheel) as zf:
            data = zf.read(f"{_SRT}/{member}.py")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, target)
    return target


def _pick(member: str, wanted: dict[str, tuple[str, ...] | None], ns: dict[str, Any]) -> None:
    """Compile the wanted top-level classes / functions of an upstream file into ``ns``. A class
    keeps only the listed methods, no decorator, and no base that is not defined here."""
    path = _wheel_file(member)
    tree = ast.parse(path.read_text(), str(path))
    body: list[ast.stmt] = [ast.ImportFrom("__future__", [ast.alias("annotations")], 0)]
    found: set[str] = set()
    for node in tree.body:
        if not isinstance(node, ast.ClassDef | ast.FunctionDef) or node.name not in wanted:
            continue
        keep = wanted[node.name]
        if isinstance(node, ast.ClassDef) and keep is not None:
            node.body = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name in keep]
            if {f.name for f in node.body if isinstance(f, ast.FunctionDef)} != set(keep):
                raise RuntimeError(f"{member}.{node.name} lacks one of {keep}")
            node.decorator_list = []  # e.g. @dataclass: the fields are set by our __init__
            local = set(ns) | set(wanted)
            node.bases = [b for b in node.bases if isinstance(b, ast.Name) and b.id in local]
        found.add(node.name)
        body.append(node)
    if found != set(wanted):
        raise RuntimeError(f"{member}: not found {set(wanted) - found}")
    module = ast.fix_missing_locations(ast.Module(body=body, type_ignores=[]))
    exec(compile(module, str(path), "exec"), ns)


def _load_module(member: str) -> types.ModuleType:
    name = f"{_SRT}/{member}".replace("/", ".")
    spec = importlib.util.spec_from_file_location(name, _wheel_file(member))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _stub(name: str, package: bool = False, **attrs: Any) -> types.ModuleType:
    mod = sys.modules.get(name)
    if mod is None:
        mod = types.ModuleType(name, "Stand-in module built by tests/upstream_lifecycle.py")
        mod.__mambaradix_stub__ = True  # type: ignore[attr-defined]
        sys.modules[name] = mod
    if package and not hasattr(mod, "__path__"):
        mod.__path__ = []
    mod.__dict__.update(attrs)
    return mod


def _unused(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("stubbed out in tests/upstream_lifecycle.py")


def _install_stubs(helpers: dict[str, Any]) -> None:
    """Stand-ins for what the loaded files import and our paths never use on CPU."""
    for pkg in ("sglang.srt.hardware_backend", "sglang.srt.hardware_backend.npu"):
        _stub(pkg, package=True)
    _stub("sglang.srt.hardware_backend.npu.dsv4", package=True)
    _stub(
        "sglang.srt.hardware_backend.npu.dsv4.dsv4_common_hooks",
        maybe_evict_dsv4_state_on_swa=_unused,
        maybe_write_dsv4_decode=_unused,
        maybe_write_dsv4_extend=_unused,
    )
    _stub("sglang.srt.utils", package=True, is_cuda=no, is_hip=no, is_npu=no)
    _stub("sglang.srt.utils", support_triton=no, get_bool_env_var=no)
    _stub("sglang.srt.utils", get_num_new_pages=helpers["get_num_new_pages"])
    _stub("sglang.srt.utils", next_power_of_2=helpers["next_power_of_2"])
    _stub("sglang.srt.utils.common", ceil_align=helpers["ceil_align"], Range=helpers["Range"])
    _stub("sglang.srt.utils.common", is_pin_memory_available=no)
    attn = SimpleNamespace(attn=SimpleNamespace(backend="torch_native"))
    _stub("sglang.srt.runtime_context", get_flags=lambda: attn)
    _stub("sglang.srt.server_args", ServerArgs=_ServerArgs, get_global_server_args=_server_args)
    _stub("sglang.srt.mem_cache.allocator", package=True)
    _stub(
        "sglang.srt.mem_cache.allocator.swa",
        SWATokenToKVPoolAllocator=type("SWATokenToKVPoolAllocator", (), {}),
    )
    _stub("sglang.srt.mem_cache.triton_ops", package=True)
    names = ("_get_last_loc_safe_kernel", "get_last_loc_kernel", "get_last_loc_triton")
    names += ("get_last_loc_triton_safe", "write_req_to_token_pool_triton")
    _stub("sglang.srt.mem_cache.triton_ops.common", **dict.fromkeys(names, _unused))
    _stub(
        "sglang.srt.mem_cache.triton_ops.allocator",
        alloc_extend_kernel=_Kernel(_alloc_extend_kernel),
        alloc_decode_kernel=_Kernel(_alloc_decode_kernel),
    )


def load_lifecycle() -> SimpleNamespace:
    """Load (once per process) everything ``UpstreamLifecycle`` runs; returns it by name."""
    global _loaded
    if _loaded is not None:
        return _loaded
    us.load_upstream()
    ns: dict[str, Any] = {"torch": torch, "np": np, "array": array, "NamedTuple": NamedTuple}
    ns.update(Optional=Any, List=list, Tuple=tuple, logger=logging.getLogger("sglang.oracle"))
    ns["get_global_server_args"] = _server_args
    _pick("utils/common", _PICKS["utils/common"], ns)
    _install_stubs(ns)
    mods = {m.rsplit("/", 1)[1]: _load_module(m) for m in _MODULES}
    ns["evict_from_tree_cache"] = mods["common"].evict_from_tree_cache
    for member in ("mem_cache/memory_pool", "managers/schedule_batch"):
        _pick(member, _PICKS[member], ns)
    member = "managers/scheduler_components/batch_result_processor"
    _pick(member, _PICKS[member], ns)
    _loaded = SimpleNamespace(ns=ns, **mods)
    return _loaded


# --------------------------------------------------------------------------- kernels


class _Kernel:
    """``kernel[grid](*args)`` calls ``fn(*args)`` (the grid is one program per request)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __getitem__(self, grid: Any) -> Any:
        return self.fn


def _alloc_extend_kernel(prefix_lens, seq_lens, last_loc, free_pages, out, bs_pow2, page):  # type: ignore[no-untyped-def]
    """Upstream's own ``alloc_extend_naive``. The Triton kernel runs before the free-page check
    and reads past the list when pages are short (the result is then discarded); the naive
    version would raise there, so it is skipped in that case."""
    need = _loaded.ns["get_num_new_pages"](  # type: ignore[union-attr]
        seq_lens=seq_lens.cpu(), page_size=page, prefix_lens=prefix_lens.cpu()
    )
    if need <= len(free_pages):
        paged = sys.modules["sglang.srt.mem_cache.allocator.paged"]
        paged.alloc_extend_naive(prefix_lens, seq_lens, last_loc, free_pages, out, page, "cpu")


def _alloc_decode_kernel(seq_lens, last_loc, free_pages, out, bs_pow2, page):  # type: ignore[no-untyped-def]
    """The arithmetic of upstream's Triton ``alloc_decode_kernel``: a request whose new token
    (at position seq_len - 1) opens a page takes the next free page, in batch order; the others
    continue their last page. (Pages short: the result is discarded, as upstream's is.)"""
    opens = [(n - 1) % page == 0 for n in seq_lens.tolist()]
    pages = free_pages[: sum(opens)].tolist()
    if len(pages) < sum(opens):
        return
    fresh = iter(pages)
    last = last_loc.tolist()
    out.copy_(torch.tensor([next(fresh) * page if o else last[i] + 1 for i, o in enumerate(opens)]))


# --------------------------------------------------------------------------- fakes


def _pool_class(up: SimpleNamespace) -> type:
    marker = sys.modules["sglang.srt.mem_cache.memory_pool"].HybridReqToTokenPool

    class Pool(up.ns["HybridReqToTokenPool"], marker):  # type: ignore[misc]
        """Upstream's HybridReqToTokenPool methods; __init__ builds only the fields they read."""

        def __init__(self, rows: int, context: int, slots: int, extra: bool, track: int) -> None:
            init_pool(self, up, rows, context, slots, extra, track)

    return Pool


def _kv_allocator(up: SimpleNamespace, size: int, page: int) -> Any:
    markers = sys.modules["sglang.srt.mem_cache.allocator"]
    if page == 1:
        cls = type("KV", (up.token.TokenToKVPoolAllocator, markers.TokenToKVPoolAllocator), {})
        return cls(size, torch.bfloat16, "cpu", None, False)
    marker = markers.PagedTokenToKVPoolAllocator
    cls = type("PagedKV", (up.paged.PagedTokenToKVPoolAllocator, marker), {})
    return cls(size, page, torch.bfloat16, "cpu", None, False)


def _new_req(up: SimpleNamespace, req: Request, rid: int) -> Any:
    """An upstream ``Req`` (its lifecycle methods) with the fields those methods and the cache
    read; input and output arrays are shared with our ``Request``."""
    u = up.ns["Req"].__new__(up.ns["Req"])
    u.rid, u.extra_key = str(rid), req.extra_key
    u.origin_input_ids, u.output_ids = req.input_ids, req.output_ids
    u.full_untruncated_fill_ids = req.input_ids + req.output_ids
    u.extend_range = u.last_node = u.req_pool_idx = u.input_embeds = None
    u.mamba_pool_idx = u.mamba_ping_pong_track_buffer = u.mamba_next_track_idx = None
    u.mamba_last_track_seqlen = u.mamba_branching_seqlen = u.mamba_cow_src_index = None
    u.finished_reason = None
    u.mamba_needs_clear = u.return_logprob = False
    u.kv_committed_freed = u.kv_overallocated_freed = False
    u.logprob_start_len = -1
    u.prefix_indices = torch.empty((0,), dtype=torch.int64)
    u.cache_protected_len = u.kv_committed_len = u.kv_allocated_len = 0
    u.inflight_middle_chunks = u.reasoning_tokens = u.retraction_count = 0
    return u


# --------------------------------------------------------------------------- the oracle


class UpstreamLifecycle(LifecycleOracle):
    """SGLang 0.5.15.post1's request lifecycle behind ``CacheManager``'s surface (see the module
    docstring and ``lifecycle_oracle.LifecycleOracle``)."""

    RULES = "sglang-0.5.15.post1"
    FINISH_CALL = "cache_finished_req"
    load = staticmethod(load_lifecycle)
    pool_class = staticmethod(_pool_class)
    kv_allocator = staticmethod(_kv_allocator)
    new_req = staticmethod(_new_req)

    def _configure(self, chunk_size: int, track_interval: int) -> None:
        self._args = _ServerArgs(self.page_size, chunk_size, self.extra_buffer, track_interval)

    def _activate(self) -> None:
        _ACTIVE[:] = [self._args]

    def _new_tree(self, chunk_size: int) -> Any:
        params = sys.modules["sglang.srt.mem_cache.cache_init_params"].CacheInitParams(
            disable=False,
            req_to_token_pool=self.pool,
            token_to_kv_pool_allocator=self.kv_alloc,
            page_size=self.page_size,
            enable_mamba_extra_buffer=self.extra_buffer,
        )
        us._SERVER_ARGS.mamba_cache_chunk_size = chunk_size  # read by the constructor
        return sys.modules["sglang.srt.mem_cache.mamba_radix_cache"].MambaRadixCache(params)

    def _extend_end(self, u: Any) -> int:
        return u.extend_range.end  # type: ignore[no-any-return]

    def _prefix_len(self, u: Any) -> int:
        return len(u.prefix_indices)

    def _match(self, req: Request, u: Any, limit: int) -> tuple[int, int]:
        u.full_untruncated_fill_ids = u.origin_input_ids + u.output_ids
        base = sys.modules["sglang.srt.mem_cache.base_prefix_cache"]
        key = _match_key(u.full_untruncated_fill_ids, u.extra_key, limit)
        if limit < self.page_size <= len(u.full_untruncated_fill_ids):
            # RadixKey.child_key ignores `limit`: the first page would match a cached child, the
            # page-rounded match be 0 and the split leave an empty node that later breaks the
            # tree (SGLang #28692). Match as `limit` is documented to behave: sliced.
            self.worked_around["match: limit shorter than a page (#28692)"] += 1
            key = _match_key(u.full_untruncated_fill_ids[:limit], u.extra_key, None)
        m = self.inner.match_prefix(base.MatchPrefixParams(key=key, req=u, cow_mamba=True))
        u.prefix_indices, u.last_node = m.device_indices, m.last_device_node
        u.mamba_branching_seqlen = m.mamba_branching_seqlen
        u.cache_protected_len = len(u.prefix_indices)
        return u.cache_protected_len, u.cache_protected_len  # no KV hit reported: the prefix

    def lock(self, req: Request) -> None:
        self.inner.inc_lock_ref(self._u(req).last_node)
        req.lock = self._u(req).last_node

    def unlock(self, req: Request) -> None:
        self.inner.dec_lock_ref(self._u(req).last_node)
        req.lock = None

    def _set_extend(self, u: Any, start: int, n: int) -> None:
        u.set_extend_range(start, start + n)

    def _alloc_for_extend(self, b: Any) -> None:
        self.up.common.alloc_for_extend(b)

    def _extended(self, u: Any) -> None:
        u.kv_committed_len = u.kv_allocated_len = u.extend_range.end

    def _extend_track_slot(self, u: Any, entry: Any) -> int:
        return entry.track_index  # type: ignore[no-any-return]

    def _drop_track_buffer(self, kv: Any) -> None:
        kv.mamba_ping_pong_track_buffer = kv.mamba_next_track_idx = None

    def _alloc_for_decode(self, b: Any) -> None:
        self.up.common.alloc_for_decode(b, token_per_req=1)

    def _decoded(self, u: Any) -> None:
        u.kv_committed_len += 1  # prepare_for_decode's two lines
        u.kv_allocated_len += 1

    def _track_every(self) -> int:
        return self._args.mamba_track_interval

    def _decode_track_update(self, u: Any) -> None:
        self.processor._mamba_prefix_cache_update(u, self._batch([u]), None, 0)

    def _checkpoint(self, u: Any, chunked: bool) -> None:
        self.inner.cache_unfinished_req(u, chunked=chunked)

    def _skip_checkpoint(self, u: Any) -> str:
        row = self.pool.req_to_token[u.req_pool_idx, : u.extend_range.end]
        u.prefix_indices = row.to(dtype=torch.int64, copy=True)
        return "cache_unfinished_req: no slot"

    def _lock_handle(self, u: Any) -> Any:
        return u.last_node

    def _release(self, u: Any, insert: bool) -> None:
        self.up.common.release_kv_cache(u, self.inner, is_insert=insert)

    def _unlock_unadmitted(self, req: Request, u: Any) -> None:
        if u.req_pool_idx is None and req.lock is not None:
            self.inner.dec_lock_ref(u.last_node)


def _match_key(tokens: array[int], extra_key: Any, limit: int | None) -> Any:
    radix_key = sys.modules["sglang.srt.mem_cache.radix_cache"].RadixKey
    return radix_key(tokens, extra_key, limit=limit)
