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
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np
import torch

import upstream_sglang as us
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
_NO_SLOT = "Can not alloc mamba cache"
_PROMPT_DONE, _CHECKPOINTED, _DECODING = "prompt done", "checkpointed at the prompt end", "decoding"

_loaded: SimpleNamespace | None = None


class DriverMismatch(AssertionError):
    """The driver made a call that SGLang's scheduler would not have made (``req``: for whom)."""

    def __init__(self, message: str, req: Request | None = None) -> None:
        super().__init__(message)
        self.req = req


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


def _no(*args: Any, **kwargs: Any) -> bool:
    return False


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
    _stub("sglang.srt.utils", package=True, is_cuda=_no, is_hip=_no, is_npu=_no)
    _stub("sglang.srt.utils", support_triton=_no, get_bool_env_var=_no)
    _stub("sglang.srt.utils", get_num_new_pages=helpers["get_num_new_pages"])
    _stub("sglang.srt.utils", next_power_of_2=helpers["next_power_of_2"])
    _stub("sglang.srt.utils.common", ceil_align=helpers["ceil_align"], Range=helpers["Range"])
    _stub("sglang.srt.utils.common", is_pin_memory_available=_no)
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
            self.size, self._alloc_size, self.max_context_len = rows, rows + 1, context
            self.device = "cpu"
            self.req_to_token = torch.zeros((rows + 1, context), dtype=torch.int32)
            self.free_slots = list(range(1, rows + 1))
            self.mamba_ping_pong_track_buffer_size = track
            self.enable_mamba_extra_buffer = extra
            self.enable_mamba_extra_buffer_lazy = False
            self.mamba_pool = SimpleNamespace(
                replayssm_write_pos=None, copy_from=_no, clear_slots=_no, size=slots
            )
            self.mamba_allocator = up.mamba.MambaSlotAllocator(size=slots, device="cpu")
            self.mamba_ckpt_pool = None
            self.req_index_to_mamba_index_mapping = torch.zeros(rows + 1, dtype=torch.int32)
            self.req_index_to_mamba_ping_pong_track_buffer_mapping = torch.zeros(
                (rows + 1, track), dtype=torch.int64
            )

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


def _batch(oracle: UpstreamLifecycle, ureqs: list[Any]) -> Any:
    """A ``ScheduleBatch`` with what ``alloc_for_extend/decode`` and the picked methods read."""
    b = oracle.up.ns["ScheduleBatch"].__new__(oracle.up.ns["ScheduleBatch"])
    b.reqs, b.device = ureqs, "cpu"
    b.req_to_token_pool, b.tree_cache = oracle.pool, oracle.inner
    b.token_to_kv_pool_allocator = oracle.kv_alloc
    b.spec_algorithm = SimpleNamespace(is_none=lambda: True)
    b.model_config = SimpleNamespace(is_encoder_decoder=False)
    b.maybe_evict_swa = lambda: None  # MambaRadixCache.supports_swa() is False: upstream's no-op
    return b


class _View:
    """Read-only facades with the attributes the scheduler reads."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


# --------------------------------------------------------------------------- the oracle


class UpstreamLifecycle:
    """SGLang's request lifecycle behind ``CacheManager``'s surface (see the module docstring).

    Pool sizes mean what they mean for ``CacheManager``'s pools: ``kv_tokens`` KV indices,
    ``state_slots`` state slots, ``rows`` request rows. ``track_slots`` is the ping-pong size
    (2 with SGLang's overlap scheduler, 1 without); ``track_interval`` is
    ``--mamba-track-interval``, ``chunk_size`` ``mamba_cache_chunk_size``.
    """

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
        self.rules = "sglang-0.5.15.post1"
        self._args = _ServerArgs(page_size, chunk_size, self.extra_buffer, track_interval)
        self._activate()
        self.kv_alloc = _kv_allocator(up, kv_tokens, page_size)
        pool_cls = _pool_class(up)
        self.pool = pool_cls(rows, max_context, state_slots, self.extra_buffer, track_slots)
        params = sys.modules["sglang.srt.mem_cache.cache_init_params"].CacheInitParams(
            disable=False,
            req_to_token_pool=self.pool,
            token_to_kv_pool_allocator=self.kv_alloc,
            page_size=page_size,
            enable_mamba_extra_buffer=self.extra_buffer,
        )
        us._SERVER_ARGS.mamba_cache_chunk_size = chunk_size  # read by the constructor
        self.inner = sys.modules["sglang.srt.mem_cache.mamba_radix_cache"].MambaRadixCache(params)
        self.inner.pretty_print = lambda: None  # upstream prints the tree on out-of-memory paths
        self.processor = up.ns["SchedulerBatchResultProcessor"].__new__(
            up.ns["SchedulerBatchResultProcessor"]
        )
        inner = self.inner
        self.tree = _View(
            chunk_size=chunk_size,
            page_size=page_size,
            compat="sglang-0.5.15.post1",
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
        self.crashes: Counter[str] = Counter()  # where SGLang would have stopped (see docstring)
        self.worked_around: Counter[str] = Counter()  # upstream bugs stepped around (docstring)

    def _activate(self) -> None:
        _ACTIVE[:] = [self._args]

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
        u.full_untruncated_fill_ids = u.origin_input_ids + u.output_ids
        limit = u._compute_max_prefix_len(len(u.full_untruncated_fill_ids))
        if key_len != limit:
            raise DriverMismatch(f"the driver matches {key_len} tokens, SGLang {limit}", req)
        base = sys.modules["sglang.srt.mem_cache.base_prefix_cache"]
        key = _match_key(u.full_untruncated_fill_ids, u.extra_key, limit)
        if limit < self.page_size <= len(u.full_untruncated_fill_ids):
            # RadixKey.child_key ignores `limit`: the first page would match a cached child, the
            # page-rounded match be 0 and the split leave an empty node that later breaks the
            # tree (SGLang #28692). Match as `limit` is documented to behave: sliced.
            self.worked_around["match: limit shorter than a page (#28692)"] += 1
            key = _match_key(u.full_untruncated_fill_ids[:limit], u.extra_key, None)
        try:
            m = self.inner.match_prefix(base.MatchPrefixParams(key=key, req=u, cow_mamba=True))
        except AssertionError as e:
            if _NO_SLOT not in str(e):
                raise
            self.crashes["match: no slot for the copy-on-write"] += 1
            return False
        u.prefix_indices, u.last_node = m.device_indices, m.last_device_node
        u.mamba_branching_seqlen = m.mamba_branching_seqlen
        u.cache_protected_len = len(u.prefix_indices)
        self._sync(req, u)
        req.computed = req.cached_len = req.kv_hit_len = u.cache_protected_len
        return True

    def unmatch(self, req: Request) -> None:
        """``scheduler.py``'s refusal branch: drop the staged copy, free the fresh slot."""
        if req.row is not None or req.lock is not None:
            raise ValueError("request is admitted: abort it instead")
        u = self._u(req)
        u.mamba_cow_src_index, u.mamba_needs_clear = None, False
        if u.mamba_pool_idx is not None:
            self.pool.mamba_allocator.free(u.mamba_pool_idx.unsqueeze(-1))
            u.mamba_pool_idx = None
        _clear(req)

    def lock(self, req: Request) -> None:
        self.inner.inc_lock_ref(self._u(req).last_node)
        req.lock = self._u(req).last_node

    def unlock(self, req: Request) -> None:
        self.inner.dec_lock_ref(self._u(req).last_node)
        req.lock = None

    # ----------------------------------------------------------- allocation

    def alloc_extend(self, reqs: list[Request], lens: list[int]) -> bool:
        self._activate()
        us_ = [self._u(r) for r in reqs]
        for req, u, n in zip(reqs, us_, lens, strict=True):
            self._no_pending(req)
            start = len(u.prefix_indices)
            if start != req.computed:
                raise DriverMismatch(f"extend starts at {req.computed}, SGLang's at {start}", req)
            u.set_extend_range(start, start + n)
        b = _batch(self, us_)
        b.prefix_lens = [len(u.prefix_indices) for u in us_]
        b.extend_lens = list(lens)
        b.extend_num_tokens = sum(lens)
        b.seq_lens = torch.tensor([u.extend_range.end for u in us_], dtype=torch.int64)
        b.seq_lens_cpu = b.seq_lens.clone()
        before = [(u.req_pool_idx, u.mamba_pool_idx, u.mamba_ping_pong_track_buffer) for u in us_]
        try:
            self.up.common.alloc_for_extend(b)
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
            u.kv_committed_len = u.kv_allocated_len = u.extend_range.end
            if self.extra_buffer:
                entry = b._mamba_radix_cache_v2_req_prepare_for_extend(u)
                if entry.track_mask:
                    self._pending[req] = (entry.track_index, u.mamba_last_track_seqlen, "extend")
        if any(u.mamba_pool_idx is not None for u in us_):
            b._collect_deferred_mamba_cow_and_clear(us_)
        for req, u in zip(reqs, us_, strict=True):
            self._sync(req, u)
            req.computed = u.kv_committed_len
            if u.extend_range.end == len(u.full_untruncated_fill_ids):
                self._phase[req] = _PROMPT_DONE

    def _give_back(self, us_: list[Any], before: list[tuple[Any, Any, Any]]) -> None:
        """Undo the rows and slots a failed ``alloc_for_extend`` took (SGLang would crash)."""
        for u, (row, slot, track) in zip(us_, before, strict=True):
            if track is None and u.mamba_ping_pong_track_buffer is not None:
                self.pool.mamba_allocator.free(u.mamba_ping_pong_track_buffer)
                u.mamba_ping_pong_track_buffer = u.mamba_next_track_idx = None
            if slot is None and u.mamba_pool_idx is not None:
                self.pool.mamba_allocator.free(u.mamba_pool_idx.unsqueeze(0))
                u.mamba_pool_idx, u.mamba_needs_clear = None, False
            if row is None and u.req_pool_idx is not None:
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
        b.seq_lens = torch.tensor([u.kv_committed_len for u in us_], dtype=torch.int64)
        b.seq_lens_cpu = b.seq_lens.clone()
        b.req_pool_indices = torch.tensor([u.req_pool_idx for u in us_], dtype=torch.int64)
        try:
            self.up.common.alloc_for_decode(b, token_per_req=1)
        except RuntimeError:
            self.crashes["alloc_for_decode: out of memory"] += 1
            return False
        interval = self._args.mamba_track_interval
        for req, u in zip(reqs, us_, strict=True):  # prepare_for_decode
            if self._phase.get(req) == _PROMPT_DONE:
                raise DriverMismatch("it decodes without SGLang's prompt-end checkpoint", req)
            self._phase[req] = _DECODING
            u.kv_committed_len += 1
            u.kv_allocated_len += 1
            req.computed = u.kv_committed_len
            if self.extra_buffer and u.kv_committed_len % interval == 0:
                slot = int(u.mamba_ping_pong_track_buffer[u.mamba_next_track_idx])
                self._pending[req] = (slot, u.kv_committed_len, "decode")
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
            self.processor._mamba_prefix_cache_update(u, _batch(self, [u]), None, 0)
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
        chunked = u.extend_range.end < len(u.full_untruncated_fill_ids)
        if not chunked:  # process_batch_result_prefill: only for a request that goes on decoding
            if self._phase.get(req) != _PROMPT_DONE:
                raise DriverMismatch("a prompt-end checkpoint where SGLang takes none", req)
            self._phase[req] = _CHECKPOINTED
        try:
            self.inner.cache_unfinished_req(u, chunked=chunked)
        except AssertionError as e:
            if _NO_SLOT not in str(e):
                raise
            self.crashes["cache_unfinished_req: no slot"] += 1
            row = self.pool.req_to_token[u.req_pool_idx, : u.extend_range.end]
            u.prefix_indices = row.to(dtype=torch.int64, copy=True)
        self._sync(req, u)
        req.lock = u.last_node
        return None

    def finish(self, req: Request, insert: bool = True) -> None:
        self._activate()
        self._no_pending(req)
        if self._phase.pop(req, None) == _CHECKPOINTED:
            raise DriverMismatch(
                "finished by its first token, it got a prompt-end checkpoint; SGLang's "
                "process_batch_result_prefill caches it with cache_finished_req only",
                req,
            )
        u = self._ureqs.pop(req)
        self.up.common.release_kv_cache(u, self.inner, is_insert=insert)
        _clear(req)
        return None

    def abort(self, req: Request) -> None:
        """``release_kv_cache(is_insert=False)`` (before admission: the staged slot only), then
        ``reset_for_retract``. A request locked but never given a row (its batch's memory
        could not be had, where SGLang would crash) is unlocked first."""
        self._activate()
        self._pending.pop(req, None)
        self._phase.pop(req, None)
        u = self._u(req)
        if u.req_pool_idx is None and req.lock is not None:
            self.inner.dec_lock_ref(u.last_node)
        self.up.common.release_kv_cache(u, self.inner, is_insert=False)
        u.reset_for_retract()
        _clear(req)

    def evict_kv_for(self, n: int) -> None:
        self._activate()
        self.up.common.evict_from_tree_cache(self.inner, n)

    # --------------------------------------------------------------- helpers

    def _sync(self, req: Request, u: Any) -> None:
        """Copy the upstream request's cache fields onto ours (the fields the scheduler and
        the checkpoint policies read)."""
        req.row = u.req_pool_idx
        req.slot = None if u.mamba_pool_idx is None else int(u.mamba_pool_idx)
        buf = u.mamba_ping_pong_track_buffer
        req.track_slots = None if buf is None else [int(s) for s in buf.tolist()]
        req.next_track = u.mamba_next_track_idx or 0
        req.last_track_len = u.mamba_last_track_seqlen
        req.node, req.prefix_len = u.last_node, u.cache_protected_len
        req.branching_len = u.mamba_branching_seqlen
        req.cow_src = None if u.mamba_cow_src_index is None else int(u.mamba_cow_src_index)

    def check_conservation(self) -> None:
        """Every KV index (page) and state slot is free, in the tree, or held by one running
        request, exactly once (what SGLang's idle self-check asserts, per request here)."""
        page = self.page_size
        tree_kv = [int(i) for i in self.inner.all_values_flatten().tolist()]
        held_kv: list[int] = []
        held_slots: list[int] = []
        for u in self._ureqs.values():
            if u.mamba_pool_idx is not None:
                held_slots.append(int(u.mamba_pool_idx))
            if u.mamba_ping_pong_track_buffer is not None:
                held_slots += [int(s) for s in u.mamba_ping_pong_track_buffer.tolist()]
            if u.req_pool_idx is not None:
                row = self.pool.req_to_token[u.req_pool_idx]
                held_kv += row[u.cache_protected_len : u.kv_committed_len].tolist()
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


def _match_key(tokens: array[int], extra_key: Any, limit: int | None) -> Any:
    radix_key = sys.modules["sglang.srt.mem_cache.radix_cache"].RadixKey
    return radix_key(tokens, extra_key, limit=limit)


def _clear(req: Request) -> None:
    """Forget the cache fields of our ``Request`` (it holds nothing now)."""
    req.row = req.slot = req.track_slots = req.node = req.lock = req.cow_src = None
    req.last_track_len = req.branching_len = None
    req.next_track = req.prefix_len = req.computed = 0
