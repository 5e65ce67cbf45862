"""Run SGLang 0.5.23's own ``UnifiedRadixCache`` (FULL + MAMBA components, the Python tree core)
on CPU, for the differential tests of ``MambaRadixCache(compat="sglang-0.5.23")``.

Nothing from SGLang is copied here. ``load_unified()`` loads, from the wheel, with
``sglang_wheel.WheelPackage`` (under the package name ``sglang_v0_5_23``, so that 0.5.15.post1's
harness keeps ``sglang`` in the same process), the real modules:

* ``mem_cache/unified_radix_cache.py`` -- the class under comparison (match, insert, evict,
  evict_for_alloc, locks, and the checkpoint / release paths the lifecycle oracle drives);
* ``mem_cache/unified_cache/`` -- the Python ``UnifiedTreeCore``, its registry (the Python core
  is selected with ``CacheInitParams.tree_core_backend="python"``), the FULL / MAMBA / SWA
  components, cache actions, LRU lists;
* ``base_prefix_cache``, ``radix_cache`` (``RadixKey``), ``cache_init_params``, ``evict_policy``
  (the LRU strategy), ``utils``, ``events``, ``hicache_storage`` (enums), ``storage_prefetch``,
  ``buffer_mode/storage_existence_cache``, ``session/streaming_session`` (requests without a
  session take its "not streaming" paths), ``environ`` (``envs``).

Stand-ins (GPU/server machinery): ``runtime_context`` (the configuration bags the loaded code
reads: ``mamba_cache_chunk_size``, ``mamba_max_states_per_path=-1`` (unlimited, the default),
no disaggregation), ``rank_consensus`` (a TP-rank cross-check decorator: identity on one rank),
``is_npu`` (False); every other module they import is a placeholder module that raises when
used (``sglang_wheel``). The pools are fakes that record what the tree frees (the KV
allocator's ``free_segment``, the state allocator's ``free``) and report free space as the caller
sets it (``evict_for_alloc`` reads availability).

``UpstreamUnifiedCache`` wraps it in the API of ``mambaradix.MambaRadixCache`` and returns the
same records.
"""

from __future__ import annotations

import enum
import importlib.util
import math
import sys
from array import array
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

from mambaradix.core.results import EvictResult, MatchResult
from sglang_wheel import WheelPackage, identity_decorator
from upstream_adapter import Recorder, UpstreamAdapter, ints

SGLANG_VERSION = "0.5.23"
PREFIX = "sglang_v0_5_23"
_MC = "srt.mem_cache"
_UC = f"{_MC}.unified_cache"
REAL = {
    "srt.environ",
    "srt.session.streaming_session",
    f"{_MC}.unified_radix_cache",
    f"{_MC}.base_prefix_cache",
    f"{_MC}.radix_cache",
    f"{_MC}.cache_init_params",
    f"{_MC}.utils",
    f"{_MC}.evict_policy",
    f"{_MC}.events",
    f"{_MC}.hicache_storage",
    f"{_MC}.storage_prefetch",
    f"{_MC}.buffer_mode.storage_existence_cache",
    _UC,
    f"{_UC}.cache_action",
    f"{_UC}.component_type",
    f"{_UC}.tree_core_registry",
    f"{_UC}.unified_tree_core",
    f"{_UC}.unified_tree_core_interface",
    f"{_UC}.session_ref_tracker",
    f"{_UC}.components",
    f"{_UC}.components.base",
    f"{_UC}.components.full",
    f"{_UC}.components.mamba",
    f"{_UC}.components.swa",
    # the scheduler helpers the lifecycle oracle drives (upstream_lifecycle_0523)
    f"{_MC}.allocation",
    f"{_MC}.common",
    f"{_MC}.allocator",
    f"{_MC}.allocator.base",
    f"{_MC}.allocator.token",
    f"{_MC}.allocator.paged",
    f"{_MC}.allocator.mamba",
    f"{_MC}.allocation_sizing",
    # the Rust tree core's Python side (``tree_core_backend="rust"``, ``load_rust_core``)
    f"{_MC}.rust_tree_core",
    f"{_MC}.rust_tree_core.adapter",
    "srt.rust_extensions.torch_build",  # the supported torch range the registry checks
}
RUST_SO = "sglang/srt/mem_cache/rust_tree_core/mem_cache.cpython-311-x86_64-linux-gnu.so"
RUST_MODULE = f"{_MC}.rust_tree_core.mem_cache"
BACKENDS = ("python", "rust")


# --------------------------------------------------------------------------- configuration


class Settings:
    """What the loaded code reads from SGLang's runtime configuration (``runtime_context``)."""

    def __init__(self) -> None:
        self.chunk_size = 64  # mamba_cache_chunk_size: max(model mamba chunk, page)
        self.extra_buffer = False
        self.track_interval = 256
        self.page_size = 1

    def exec_bag(self) -> Any:
        mamba = SimpleNamespace(
            mamba_max_states_per_path=-1,  # unlimited (SGLang's default)
            enable_mamba_extra_buffer=self.extra_buffer,
            enable_mamba_extra_buffer_lazy=False,
            mamba_track_interval=self.track_interval,
        )
        features = SimpleNamespace(enable_encoder_swa_bounded_replay=False)
        return SimpleNamespace(mamba=mamba, features=features)

    def serving_bag(self) -> Any:
        return SimpleNamespace(strip_thinking_cache=False)

    def spec_bag(self) -> Any:
        return SimpleNamespace(speculative_algorithm=None)

    def parallel(self) -> Any:
        return SimpleNamespace(dcp_enabled=False, attn_dcp_size=1)


SETTINGS = Settings()


def _runtime_context(pkg: WheelPackage) -> dict[str, Any]:
    """The stand-in ``runtime_context``, with ``mamba_checkpoint_grid`` / ``mamba_track_grid``
    compiled from the wheel's own file over ``mamba_cache_chunk_size`` from ``SETTINGS``."""
    ns: dict[str, Any] = {
        "math": math,
        "mamba_cache_chunk_size": lambda: SETTINGS.chunk_size,
        "get_exec": SETTINGS.exec_bag,
        "get_disagg": lambda: SimpleNamespace(disaggregation_mode="null"),
        "get_observability": lambda: SimpleNamespace(enable_metrics=False),
        "get_serving": SETTINGS.serving_bag,
        "get_spec": SETTINGS.spec_bag,
        "get_parallel": SETTINGS.parallel,
        "attention_backends": lambda: ("torch_native", "torch_native"),
    }
    grids: dict[str, tuple[str, ...] | None] = {"mamba_checkpoint_grid": None}
    grids["mamba_track_grid"] = None
    pkg.pick("sglang/srt/runtime_context.py", grids, ns)
    return ns


def _no(*args: Any, **kwargs: Any) -> bool:
    return False


def _jit(*args: Any, **kwargs: Any) -> Any:
    """``triton.jit`` and ``triton.jit(...)``: the kernel is defined, never launched here."""
    return args[0] if args and callable(args[0]) else (lambda fn: fn)


def _utils(pkg: WheelPackage) -> dict[str, Any]:
    """``srt.utils`` / ``srt.utils.common``: device probes answer "not this device", the
    debug-flag reader answers False, arithmetic helpers compiled from the wheel's own file."""
    ns: dict[str, Any] = dict.fromkeys(
        ("is_npu", "is_cuda", "is_hip", "is_xpu", "is_cpu", "support_triton"), _no
    )
    ns.update(get_bool_env_var=_no, is_pin_memory_available=_no, torch=torch, Optional=Any)
    ns["array"] = array
    ns["List"] = list
    helpers = ("ceil_div", "ceil_align", "next_power_of_2", "get_num_new_pages", "async_h2d")
    helpers += ("assert_int64_array",)  # the Rust core's adapter checks its key buffers
    pkg.pick("sglang/srt/utils/common.py", dict.fromkeys(helpers), ns)
    return ns


class _Unused:
    """A class no object here is an instance of."""


_SHARDS = "page_interleave_shard_size"
_pkg: WheelPackage | None = None


def load_unified() -> WheelPackage:
    """Install the 0.5.23 package (once per process) and import ``unified_radix_cache``."""
    global _pkg
    if _pkg is not None:
        return _pkg
    pkg = WheelPackage(
        SGLANG_VERSION,
        PREFIX,
        REAL,
        {"srt.utils.rank_consensus_checker": {"rank_consensus": identity_decorator}},
    )
    pkg.overrides["srt.runtime_context"] = _runtime_context(pkg)
    interleave: dict[str, Any] = {"PageInterleavePoolAllocator": _Unused}  # no KV sharding
    pkg.pick("sglang/srt/mem_cache/allocator/page_interleave.py", {_SHARDS: None}, interleave)
    pkg.overrides[f"{_MC}.allocator.page_interleave"] = interleave
    medium: dict[str, Any] = {"enum": enum}
    pkg.pick("sglang/srt/disaggregation/kv_events.py", {"StorageMedium": None}, medium)
    pkg.overrides["srt.disaggregation.kv_events"] = medium
    pkg.overrides["srt.utils"] = _utils(pkg)
    pkg.overrides["srt.utils.common"] = pkg.overrides["srt.utils"]
    no_triton = SimpleNamespace(capabilities=SimpleNamespace(supports_triton=False))
    pkg.overrides["srt.platforms"] = {"current_platform": no_triton}  # the naive allocators
    pkg.overrides["_foreign.triton"] = {"jit": _jit}
    pkg.module(f"{_MC}.unified_radix_cache")
    _pkg = pkg
    return pkg


def load_rust_core() -> Any:
    """Load the wheel's compiled Rust tree core (once per process) and return the binding.

    The extension (``RUST_SO``, a PyO3 module linking libtorch) is extracted from the wheel
    into ``.cache/sglang/src/`` and imported as ``<PREFIX>.srt.mem_cache.rust_tree_core.
    mem_cache``. SGLang's ``rust_tree_core/extension.py`` (a build-or-load step through
    ``rust_extensions.loader``) is replaced by a module holding that binding; the adapter
    (``rust_tree_core/adapter.py``) and the registry are the wheel's own. The registry names
    the binding's module as a string (``_RUST_TREE_CORE_MODULE``, not an import the renaming
    sees): it is set to the renamed name, so its fallback policy finds the binding loaded
    (as it does in a server once imported) and selects the Rust core; its torch range check
    still runs."""
    pkg = load_unified()
    name = f"{PREFIX}.{RUST_MODULE}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, pkg.file(RUST_SO))
    assert spec is not None and spec.loader is not None
    binding = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(binding)  # torch is imported above: libtorch is resident
    sys.modules[name] = binding
    names = ("DecLockRefParamsBinding", "InsertParamsBinding", "MatchParamsBinding")
    names += ("RustBigramUnifiedTreeCoreBinding", "RustUnifiedTreeCoreBinding")
    names += ("TreeCoreInitParamsBinding",)
    extension = {n: getattr(binding, n) for n in names}
    pkg.overrides[f"{_MC}.rust_tree_core.extension"] = {"bindings": binding, **extension}
    up(f"{_UC}.tree_core_registry")._RUST_TREE_CORE_MODULE = name
    return binding


def up(rel: str) -> Any:
    """The loaded module ``sglang.<rel>`` of 0.5.23 (``rel`` dotted)."""
    return sys.modules[f"{PREFIX}.{rel}"]


# --------------------------------------------------------------------------- fake pools


class _Recorder(Recorder):
    """Records frees in order; reports ``free`` slots as free space (set by the caller)."""

    def __init__(self) -> None:
        super().__init__()
        self.free_now = 0

    def free(self, indices: Any) -> None:
        got = ints(indices)
        self.freed.extend(got)
        self.free_now += len(got)

    def free_segment(self, indices: Any, start_pos: int = 0) -> None:
        assert start_pos == 0
        self.free(indices)

    def available_size(self) -> int:
        return self.free_now

    def schedulable_available_size(self) -> int:
        return self.free_now


def make_pools(page_size: int) -> tuple[Any, Any]:
    """A fake KV allocator and a fake ``HybridReqToTokenPool`` (its ``mamba_allocator``)."""
    load_unified()
    pool_marker = up(f"{_MC}.memory_pool").HybridReqToTokenPool

    class FakeKVAllocator(_Recorder):
        device = torch.device("cpu")
        page_size = 1

        def mamba_full_cache_donor(self) -> None:
            return None  # separate KV and state pools (no shared-pool donor)

    class FakeReqToTokenPool(pool_marker):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.mamba_allocator = _Recorder()

    kv = FakeKVAllocator()
    kv.page_size = page_size
    return kv, FakeReqToTokenPool()


def cache_params(
    req_pool: Any,
    kv: Any,
    page_size: int,
    extra_buffer: bool,
    backend: str = "python",
    **kwargs: Any,
) -> Any:
    """``CacheInitParams`` of a hybrid model's tree: FULL + MAMBA, the tree core ``backend``
    (``"python"``, or ``"rust"`` after ``load_rust_core``)."""
    ct = up(f"{_UC}.component_type").ComponentType
    return up(f"{_MC}.cache_init_params").CacheInitParams(
        disable=False,
        req_to_token_pool=req_pool,
        token_to_kv_pool_allocator=kv,
        page_size=page_size,
        enable_mamba_extra_buffer=extra_buffer,
        tree_components=(ct.FULL, ct.MAMBA),
        tree_core_backend=backend,
        **kwargs,
    )


# --------------------------------------------------------------------------- adapter


class _Lock:
    """A lock receipt: the node and upstream's ``DecLockRefParams``."""

    __slots__ = ("node", "params")

    def __init__(self, node: Any, params: Any) -> None:
        self.node, self.params = node, params


class UpstreamUnifiedCache(UpstreamAdapter):
    """SGLang 0.5.23's ``UnifiedRadixCache`` behind the API of ``mambaradix.MambaRadixCache``.

    ``evict`` is ``UnifiedRadixCache.evict`` (counts, no availability target);
    ``evict_for_alloc`` is the allocation-driven eviction (targets: what is free now plus the
    shortfall, as the allocator and ``ensure_mamba_capacity`` call it)."""

    def __init__(self, page_size: int = 1, chunk_size: int = 64, backend: str = "python") -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        load_unified()
        if backend == "rust":
            load_rust_core()
        self._bind(up(f"{_MC}.base_prefix_cache"), up(f"{_MC}.radix_cache"))
        self.kv, self.req_pool = make_pools(page_size)
        SETTINGS.chunk_size = chunk_size  # read once, in the constructor
        params = cache_params(
            self.req_pool, self.kv, page_size, extra_buffer=page_size > 1, backend=backend
        )
        self.inner = up(f"{_MC}.unified_radix_cache").UnifiedRadixCache(params)
        self.core = self.inner.tree_core
        core_cls = {"python": "UnifiedTreeCore", "rust": "RustUnifiedTreeCore"}[backend]
        if type(self.core).__name__ != core_cls:  # the registry may fall back: never silently
            raise RuntimeError(f"asked for the {backend} tree core, got {type(self.core)}")
        self.backend = backend
        self.page_size = page_size
        self.chunk_size = chunk_size

    @property
    def root(self) -> Any:
        return self.core.root_node

    def node(self, node_id: int) -> Any:
        return self.core.node_by_id(node_id)

    def match_prefix(self, key: Sequence[int], extra_key: str | None = None) -> MatchResult:
        res = self.inner.match_prefix(self._MatchPrefixParams(key=self._key(key, extra_key)))
        indices = self.inner.path_device_indices(res.last_device_node)
        indices = array("q", indices.tolist())
        assert len(indices) == res.device_prefix_len
        return MatchResult(
            prefix_len=res.device_prefix_len,
            kv_indices=indices,
            node=res.last_device_node,
            branching_len=res.mamba_branching_seqlen,
            kv_hit_len=res.full_kv_hit_length,
        )

    def evict_for_alloc(self, kv_tokens: int = 0, states: int = 0) -> EvictResult:
        self.kv.take()
        self.req_pool.mamba_allocator.take()
        params = self._EvictParams(num_tokens=kv_tokens, mamba_num=states)
        return self._evict_result(self.inner.evict_for_alloc(params))

    def inc_lock_ref(self, node: Any) -> _Lock:
        return _Lock(node, self.inner.inc_lock_ref(node).to_dec_params())

    def dec_lock_ref(self, receipt: _Lock) -> None:
        self.inner.dec_lock_ref(receipt.node, receipt.params)
