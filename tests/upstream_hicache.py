"""Run SGLang 0.5.23's own HiCache storage code on CPU, for the tier-store tests.

Nothing from SGLang is copied into this repository. At run time this module opens the SGLang
0.5.23 wheel (``.cache/sglang/sglang-0.5.23-*.whl``, fetched by scripts/setup.sh, or
``$MAMBARADIX_SGLANG_0523_WHEEL``) and uses three of its files:

* ``sglang/srt/mem_cache/hicache_storage.py``: executed as a real module; its ``HiCacheFile``
  backend answers ``batch_exists_v2`` over a directory our ``FileStore`` wrote. Its two
  imports that reach into the server are replaced by stand-ins: ``sglang.srt.environ.envs``
  (every setting unset: no metadata cache, no storage-dir override) and the disk evictor
  ``LRUFileEvictor`` (inert; ``batch_exists_v2`` never calls it). ``torch`` is the real one.
* ``sglang/srt/mem_cache/utils.py``: only ``storage_namespace_seed`` is taken out of it (by
  its source, with ``ast``) and executed; the rest of that file imports the server.
* ``sglang/srt/mem_cache/cpp_utils/hash_binding.cpp``: the page-hash extension, compiled
  with g++, pybind11 and OpenSSL into ``.cache/sglang/build/`` (once per source hash).

Stand-ins are added to ``sys.modules`` only where no module of that name exists yet, and are
marked as stand-ins, so this coexists with tests/upstream_sglang.py (SGLang 0.5.15.post1) in
one process, whichever loads first.
"""

from __future__ import annotations

import ast
import functools
import glob
import hashlib
import importlib.util
import os
import subprocess
import sys
import sysconfig
import types
import zipfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.5.23"
WHEEL_ENV = "MAMBARADIX_SGLANG_0523_WHEEL"
_MEM = "sglang/srt/mem_cache"


def find_wheel() -> Path:
    env = os.environ.get(WHEEL_ENV)
    pattern = str(REPO_ROOT / ".cache" / "sglang" / f"sglang-{VERSION}-*.whl")
    for path in [Path(env)] if env else [Path(p) for p in sorted(glob.glob(pattern))]:
        if path.is_file():
            return path
    raise RuntimeError(
        f"SGLang {VERSION} wheel not found ({env or pattern}); fetch it with\n"
        f"    .venv/bin/python -m pip download sglang=={VERSION} --no-deps -d .cache/sglang\n"
        f"(scripts/setup.sh does this), or set {WHEEL_ENV}."
    )


def read_member(member: str) -> bytes:
    with zipfile.ZipFile(find_wheel()) as zf:
        return zf.read(member)


# --------------------------------------------------------------------------- HiCacheFile


class _Unset:
    """Stand-in for one ``envs.X``: every setting unset."""

    def get(self) -> None:
        return None


class _Envs:
    def __getattr__(self, name: str) -> _Unset:
        return _Unset()


class _InertEvictor:
    """Stand-in for ``LRUFileEvictor`` (eviction not configured: it never evicts)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def touch(self, *args: Any) -> None:
        pass


def _stub(name: str, **attrs: Any) -> None:
    if name in sys.modules:
        for key, value in attrs.items():
            if not hasattr(sys.modules[name], key):
                setattr(sys.modules[name], key, value)
        return
    mod = types.ModuleType(name, "Stand-in built by tests/upstream_hicache.py")
    mod.__path__ = []  # type: ignore[attr-defined]
    mod.__mambaradix_stub__ = True  # type: ignore[attr-defined]  # upstream_sglang.py checks
    mod.__dict__.update(attrs)
    sys.modules[name] = mod


_storage: types.ModuleType | None = None


def hicache_storage() -> types.ModuleType:
    """SGLang 0.5.23's ``hicache_storage`` module, executed from the wheel."""
    global _storage
    if _storage is not None:
        return _storage
    source = read_member(f"{_MEM}/hicache_storage.py")
    for pkg in ("sglang", "sglang.srt", "sglang.srt.mem_cache", "sglang.srt.mem_cache.storage",
                "sglang.srt.mem_cache.storage.file"):
        _stub(pkg)
    _stub("sglang.srt.environ", envs=_Envs())
    _stub("sglang.srt.mem_cache.storage.file.lru_file_evictor", LRUFileEvictor=_InertEvictor)
    name = "_sglang_0523_hicache_storage"
    mod = types.ModuleType(name)
    mod.__file__ = f"{find_wheel()}!/{_MEM}/hicache_storage.py"
    sys.modules[name] = mod
    exec(compile(source, mod.__file__, "exec"), mod.__dict__)
    _storage = mod
    return mod


def hicache_file(root: str, model: str, tp_rank: int = 0, tp_size: int = 1) -> Any:
    """An upstream ``HiCacheFile`` over `root` (non-MLA, no PP/CP, metadata cache off)."""
    hs = hicache_storage()
    config = hs.HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=False,
        model_name=model, extra_config={"file_storage_path": root},
    )
    return hs.HiCacheFile(config)


# --------------------------------------------------------------------------- hashing


@functools.cache
def storage_namespace_seed() -> Any:
    """``storage_namespace_seed`` from the wheel's ``mem_cache/utils.py``, run alone."""
    source = read_member(f"{_MEM}/utils.py").decode()
    tree = ast.parse(source)
    fn = next(n for n in tree.body
              if isinstance(n, ast.FunctionDef) and n.name == "storage_namespace_seed")
    module = ast.Module(body=[fn], type_ignores=[])
    scope: dict[str, Any] = {"hashlib": hashlib, "Optional": Any}
    exec(compile(module, f"{find_wheel()}!/{_MEM}/utils.py", "exec"), scope)
    return scope["storage_namespace_seed"]


@functools.cache
def native_hash() -> Any:
    """SGLang's ``hicache_hash_cpp`` extension, built from the wheel's C++ source."""
    source = read_member(f"{_MEM}/cpp_utils/hash_binding.cpp")
    tag = hashlib.sha256(source).hexdigest()[:16]
    build = REPO_ROOT / ".cache" / "sglang" / "build" / f"hicache_hash_{tag}"
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    target = build / f"hicache_hash_cpp{suffix}"
    if not target.is_file():
        build.mkdir(parents=True, exist_ok=True)
        cpp = build / "hash_binding.cpp"
        cpp.write_bytes(source)
        import pybind11

        tmp = build / f"tmp{os.getpid()}{suffix}"
        cmd = ["g++", "-O2", "-shared", "-fPIC", "-std=c++17", "-w",
               f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}",
               "-DTORCH_EXTENSION_NAME=hicache_hash_cpp", str(cpp), "-o", str(tmp), "-lcrypto"]
        subprocess.run(cmd, check=True, timeout=300)
        os.replace(tmp, target)
    spec = importlib.util.spec_from_file_location("hicache_hash_cpp", target)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def upstream_page_hashes(tokens: list[int], page_size: int, prior: str | None) -> list[str]:
    """SGLang's ``get_hash_str(tokens, prior, page_size)`` through the compiled extension."""
    from array import array

    raw = array("q", tokens)
    digest = bytes.fromhex(prior) if prior else None
    result: list[str] = native_hash().get_hash(raw, len(tokens), 1, False, digest, page_size)
    return result
