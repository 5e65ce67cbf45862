"""Run SGLang 0.5.15.post1's own ``MambaRadixCache`` on CPU, for differential tests and benchmarks.

Nothing from SGLang is copied into this repository. At run time this module opens the
SGLang wheel (a dev/test-only download, see ``find_wheel``), extracts four pure-Python
files from it into ``.cache/sglang/src/<wheel>/`` and executes them as the real modules:

* ``sglang/srt/mem_cache/mamba_radix_cache.py`` -- the class under comparison;
* ``sglang/srt/mem_cache/radix_cache.py``       -- for ``RadixKey`` (matching, child keys);
* ``sglang/srt/mem_cache/base_prefix_cache.py`` -- base class and param/result dataclasses;
* ``sglang/srt/mem_cache/cache_init_params.py`` -- the constructor's ``CacheInitParams``.

Everything else those files import is GPU/server machinery that the tree logic never
touches on the paths we drive (match / insert / evict / lock / sanity check), so it is
replaced by small stand-in modules written here and placed in ``sys.modules``:

* allocator / pool *classes* (``TokenToKVPoolAllocator``, ``HybridReqToTokenPool``, ...)
  become empty marker classes, so the constructor's ``isinstance`` assert accepts our fakes;
* ``distributed.get_tensor_model_parallel_rank`` returns 0 (only used when a sanity
  check fails, to decide who prints);
* ``server_args.get_global_server_args()`` returns an object whose
  ``mamba_cache_chunk_size`` is set per ``UpstreamCache`` (read once in the constructor);
* ``events.KVCacheEventMixin`` records nothing (KV events are off), and
  ``utils.split_node_hash_value`` only has to handle the ``None`` hashes nodes then carry;
* the session-cache mixin and the metrics collector are empty (metrics are off).

The pools themselves are fakes that only *record* what the tree frees: the KV allocator's
``free`` and the mamba slot allocator's ``free``. The callers hand out KV indices and state
slots themselves, so no free lists are managed. ``UpstreamCache`` wraps it all in the same
API as ``mambaradix.MambaRadixCache(..., compat="sglang")`` and returns the same records.

Note: the stand-ins occupy the ``sglang`` package name in ``sys.modules`` for the life of
the process, so do not import a real SGLang install in the same process.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
import types
import zipfile
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mambaradix.core.results import MatchResult
from upstream_adapter import Recorder, UpstreamAdapter

SGLANG_VERSION = "0.5.15.post1"
REPO_ROOT = Path(__file__).resolve().parents[1]
WHEEL_ENV = "MAMBARADIX_SGLANG_WHEEL"
_PKG = "sglang.srt.mem_cache"
# Real upstream files, in an order where each one's sglang imports are already loaded.
_REAL_MODULES = ("cache_init_params", "base_prefix_cache", "radix_cache", "mamba_radix_cache")

_loaded: types.ModuleType | None = None


# --------------------------------------------------------------------------- wheel


def find_wheel() -> Path:
    """The SGLang wheel: ``$MAMBARADIX_SGLANG_WHEEL``, else ``.cache/sglang/sglang-<ver>-*.whl``."""
    env = os.environ.get(WHEEL_ENV)
    if env:
        candidates = [Path(env)]
    else:
        pattern = str(REPO_ROOT / ".cache" / "sglang" / f"sglang-{SGLANG_VERSION}-*.whl")
        candidates = [Path(p) for p in sorted(glob.glob(pattern))]
    for path in candidates:
        if path.is_file():
            return path
    where = env if env else f"{REPO_ROOT}/.cache/sglang/sglang-{SGLANG_VERSION}-*.whl"
    raise RuntimeError(
        f"SGLang {SGLANG_VERSION} wheel not found (looked for {where}). The upstream "
        f"comparison needs it; fetch it from the repository root with\n"
        f"    .venv/bin/python -m pip download sglang=={SGLANG_VERSION} --no-deps"
        f" -d .cache/sglang\n"
        f"(scripts/setup.sh does this), or set {WHEEL_ENV} to the wheel's path."
    )


def _extract(wheel: Path) -> Path:
    """Extract the real modules once; returns the folder holding ``sglang/``."""
    root = REPO_ROOT / ".cache" / "sglang" / "src" / wheel.stem
    with zipfile.ZipFile(wheel) as zf:
        for name in _REAL_MODULES:
            member = f"{_PKG.replace('.', '/')}/{name}.py"
            target = root / member
            if target.is_file():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(zf.read(member))
            os.replace(tmp, target)  # atomic, so concurrent test workers are safe
    return root


# --------------------------------------------------------------------------- stand-ins


class _ServerArgs:
    """What ``get_global_server_args()`` returns; only these fields are read."""

    mamba_cache_chunk_size = 64
    extra_metric_labels = None


_SERVER_ARGS = _ServerArgs()


def _marker(name: str, base: type = object) -> type:
    return type(name, (base,), {"__doc__": "Stand-in marker class (isinstance checks only)."})


class _NoEvents:
    """Stand-in for ``KVCacheEventMixin``: KV cache events are disabled, record nothing."""

    def _record_store_event(self, node: Any, medium: Any = None) -> None:
        pass

    def _record_remove_event(self, node: Any, medium: Any = None) -> None:
        pass

    def _record_all_cleared_event(self) -> None:
        pass

    def take_events(self) -> list[Any]:
        return []


def _split_hashes(hashes: list[str] | None, split_len: int, page_size: int) -> tuple[Any, Any]:
    """Stand-in for ``utils.split_node_hash_value``: split per-page hashes at a split point."""
    if hashes is None:
        return None, None
    pages = split_len // page_size
    return hashes[:pages], hashes[pages:]


def _unused(name: str) -> Any:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{name} is stubbed out in tests/upstream_sglang.py")

    return fail


def _install_stubs() -> dict[str, types.ModuleType]:
    base_alloc = _marker("BaseTokenToKVPoolAllocator")
    req_pool = _marker("ReqToTokenPool")
    collector = _marker("RadixCacheMetricsCollector")
    specs: dict[str, dict[str, Any]] = {
        "sglang": {},
        "sglang.srt": {},
        _PKG: {},
        "sglang.srt.observability": {},
        "sglang.srt.distributed": {"get_tensor_model_parallel_rank": lambda: 0},
        "sglang.srt.server_args": {"get_global_server_args": lambda: _SERVER_ARGS},
        "sglang.srt.observability.metrics_collector": {
            "STAT_LOGGER_ROLE_RADIX_CACHE": "radix_cache",
            "RadixCacheMetricsCollector": collector,
            "resolve_collector_class": lambda server_args, role, default: default,
        },
        f"{_PKG}.allocator": {
            "BaseTokenToKVPoolAllocator": base_alloc,
            "TokenToKVPoolAllocator": _marker("TokenToKVPoolAllocator", base_alloc),
            "PagedTokenToKVPoolAllocator": _marker("PagedTokenToKVPoolAllocator", base_alloc),
        },
        f"{_PKG}.multi_ended_allocator": {
            "UnifiedMambaTokenToKVPoolAllocator": _marker(
                "UnifiedMambaTokenToKVPoolAllocator", base_alloc
            ),
        },
        f"{_PKG}.memory_pool": {
            "ReqToTokenPool": req_pool,
            "HybridReqToTokenPool": _marker("HybridReqToTokenPool", req_pool),
        },
        f"{_PKG}.events": {"KVCacheEventMixin": _NoEvents},
        f"{_PKG}.session_radix_cache": {"SessionRadixCacheMixin": _marker("SessionMixin")},
        f"{_PKG}.utils": {
            "split_node_hash_value": _split_hashes,
            "get_hash_str": _unused("get_hash_str"),
            "get_eviction_strategy": _unused("get_eviction_strategy"),
        },
    }
    modules = {}
    for name, attrs in specs.items():
        mod = types.ModuleType(name, "Stand-in module built by tests/upstream_sglang.py")
        mod.__dict__.update(attrs)
        mod.__mambaradix_stub__ = True  # type: ignore[attr-defined]
        if "." not in name or name.rsplit(".", 1)[1] in ("srt", "mem_cache", "observability"):
            mod.__path__ = []  # a package, so submodule imports resolve via sys.modules
        sys.modules[name] = mod
        modules[name] = mod
    for name, mod in modules.items():  # make `parent.child` attribute access work too
        if "." in name:
            parent, child = name.rsplit(".", 1)
            setattr(modules[parent], child, mod)
    return modules


def load_upstream() -> types.ModuleType:
    """Import upstream ``mamba_radix_cache`` (once per process) and return the module."""
    global _loaded
    if _loaded is not None:
        return _loaded
    existing = sys.modules.get("sglang")
    if existing is not None and not getattr(existing, "__mambaradix_stub__", False):
        raise RuntimeError("a real `sglang` is already imported; the harness needs its own stubs")
    src_root = _extract(find_wheel())
    stubs = _install_stubs()
    module = None
    for name in _REAL_MODULES:
        full = f"{_PKG}.{name}"
        path = src_root / _PKG.replace(".", "/") / f"{name}.py"
        spec = importlib.util.spec_from_file_location(full, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module  # before exec: dataclasses look their module up here
        spec.loader.exec_module(module)
        setattr(stubs[_PKG], name, module)
    assert module is not None
    _loaded = module
    return module


# --------------------------------------------------------------------------- fake pools


def _make_pools() -> tuple[Any, Any]:
    allocator_cls = sys.modules[f"{_PKG}.allocator"].TokenToKVPoolAllocator
    pool_cls = sys.modules[f"{_PKG}.memory_pool"].HybridReqToTokenPool

    class FakeKVAllocator(Recorder, allocator_cls):  # type: ignore[misc, valid-type]
        """Records every KV index the tree frees; hands out nothing."""

        device = torch.device("cpu")

        def available_size(self) -> int:
            return 0

    class FakeReqToTokenPool(pool_cls):  # type: ignore[misc, valid-type]
        """Only ``mamba_allocator`` is used by the paths we drive; it records freed slots."""

        def __init__(self) -> None:
            self.mamba_allocator = Recorder()

    return FakeKVAllocator(), FakeReqToTokenPool()


# --------------------------------------------------------------------------- adapter


class UpstreamCache(UpstreamAdapter):
    """SGLang's ``MambaRadixCache`` behind the API of ``mambaradix.MambaRadixCache``."""

    def __init__(self, page_size: int = 1, chunk_size: int = 64) -> None:
        mod = load_upstream()
        self._bind(sys.modules[f"{_PKG}.base_prefix_cache"], sys.modules[f"{_PKG}.radix_cache"])
        self.kv, self.req_pool = _make_pools()
        params = sys.modules[f"{_PKG}.cache_init_params"].CacheInitParams(
            disable=False,
            req_to_token_pool=self.req_pool,
            token_to_kv_pool_allocator=self.kv,
            page_size=page_size,
            # v1 (no extra buffer) asserts page_size == 1; the tree code is the same otherwise.
            enable_mamba_extra_buffer=page_size > 1,
        )
        _SERVER_ARGS.mamba_cache_chunk_size = chunk_size  # read once, in the constructor
        self.inner = mod.MambaRadixCache(params)
        self.page_size = page_size
        self.chunk_size = chunk_size

    @property
    def root(self) -> Any:
        return self.inner.root_node

    def match_prefix(self, key: Sequence[int], extra_key: str | None = None) -> MatchResult:
        res = self.inner.match_prefix(self._MatchPrefixParams(key=self._key(key, extra_key)))
        indices = array("q", res.device_indices.tolist())
        return MatchResult(
            prefix_len=len(indices),
            kv_indices=indices,
            node=res.last_device_node,
            branching_len=res.mamba_branching_seqlen,
            kv_hit_len=-1,  # upstream 0.5.15 does not report the full KV hit
        )

    def inc_lock_ref(self, node: Any) -> Any:
        self.inner.inc_lock_ref(node)
        return node  # the node itself is the receipt for dec_lock_ref

    def dec_lock_ref(self, receipt: Any) -> None:
        self.inner.dec_lock_ref(receipt)
