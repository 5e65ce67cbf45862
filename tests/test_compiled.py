"""The compiled build and its pure-Python reference (mambaradix/_build.py, docs/build.md).

The compiled build must decide exactly as the pure one: tests/core_builds.py drives both
cores through one seeded sequence, comparing every result, error, node id and tree,
tests/pool_builds.py does the same for the pools' free list and KV owner map, and
tests/serving_builds.py runs the main job's cells (every default policy, the first
requests of the Mooncake trace) on each build, whose results must be equal. When the
compiled build is absent those tests skip, unless MAMBARADIX_REQUIRE_COMPILED=1 (as
scripts/test.sh sets), where its absence fails."""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import mambaradix
from mambaradix import _build

TESTS = Path(__file__).resolve().parent
PACKAGE_ROOT = Path(mambaradix.__file__).resolve().parents[1]  # src/, or site-packages
REQUIRE_ENV = "MAMBARADIX_REQUIRE_COMPILED"
CORE_NAMES = ("keys", "node", "lru", "ownership", "unified", "tree")  # the tree's hot modules
SRC = Path(_build.__file__).resolve().parents[1]


def run_python(code: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """`python *code` in a fresh process that imports this checkout's mambaradix."""
    full = {k: v for k, v in os.environ.items() if k != _build.PURE_ENV}
    full["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT), str(TESTS)])
    full.update(env)
    return subprocess.run(
        [sys.executable, *code], env=full, capture_output=True, text=True, timeout=600
    )


def build_of_files(files: list[str]) -> str:
    """What the module files say, independently of the package's own report."""
    if all(f.endswith(".py") for f in files):
        return "pure"
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    if all(f.endswith(suffixes) and Path(f).parent.name == "_compiled" for f in files):
        return "compiled"
    return "mixed"


REPORT = """
import sys, mambaradix
from mambaradix.cli import main
files = [sys.modules['mambaradix.core.' + n].__file__ for n in sys.argv[1:]]
print(mambaradix.BUILD, *files)
main(['--version'])
"""


def test_the_hot_modules_are_the_ones_compiled() -> None:
    """The core's hot modules, and beside them only modules of the package, each once."""
    compiled = set(_build.COMPILED)
    assert len(compiled) == len(_build.COMPILED)
    assert {f"mambaradix.core.{n}" for n in CORE_NAMES} <= compiled
    for name in compiled:
        assert name.startswith("mambaradix.")
        assert (SRC.joinpath(*name.split(".")).with_suffix(".py")).is_file(), name


def test_report_matches_the_module_files() -> None:
    files = [sys.modules[f"mambaradix.core.{n}"].__file__ or "" for n in CORE_NAMES]
    assert build_of_files(files) == mambaradix.BUILD
    want = "pure" if os.environ.get(_build.PURE_ENV, "") not in ("", "0") else None
    if want or _build.compiled_files() is None:
        assert mambaradix.BUILD == "pure"


@pytest.mark.parametrize("pure", ["1", ""])
def test_pure_env_forces_the_pure_core(pure: str) -> None:
    out = run_python(["-c", REPORT, *CORE_NAMES], MAMBARADIX_PURE=pure)
    assert out.returncode == 0, out.stderr
    report, *files = out.stdout.splitlines()[0].split()
    assert report == build_of_files(files)
    built = _build.compiled_files() is not None
    assert report == ("compiled" if built and not pure else "pure")
    assert out.stdout.splitlines()[1] == f"mambaradix {mambaradix.__version__} ({report} core)"


def test_a_build_from_other_source_is_not_loaded(tmp_path: Path) -> None:
    """The finder takes a compiled file only if its name carries the SHA-256 of today's
    source (an edited .py must never run as its old compiled self), for every module."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for name in _build.COMPILED:
        parts = name.split(".")[1:]  # mambaradix.pools.kv -> pools__kv_<digest>
        source = SRC.joinpath("mambaradix", *parts).with_suffix(".py")
        hashed = hashlib.sha256(source.read_bytes())
        for pxd in compiled_pxds():  # every .pxd too, in COMPILED's order
            hashed.update(b"\0" + pxd.name.encode() + b"\0" + pxd.read_bytes())
        digest = hashed.hexdigest()[:16]
        (tmp_path / f"{'__'.join(parts)}_{digest}{suffix}").write_bytes(b"")
    found = _build.compiled_files(tmp_path)
    assert found is not None and sorted(found) == sorted(_build.COMPILED)
    assert len(set(found.values())) == len(found)
    for name in (_build.COMPILED[0], _build.COMPILED[-1]):  # one stale module: none loads
        stem = "__".join(name.split(".")[1:]) + "_"
        stale = next(tmp_path.glob(f"{stem}*"))
        stale.rename(tmp_path / f"{stem}{'0' * 16}{suffix}")
        assert _build.compiled_files(tmp_path) is None
        stale.with_name(f"{stem}{'0' * 16}{suffix}").rename(stale)
        assert _build.compiled_files(tmp_path) is not None


def test_the_compiled_only_paths_run_in_the_compiled_build_only() -> None:
    """keys.py, tree.py and the pools' _freelist.py and ownership.py take their in-place paths
    (memcmp, one allocation, C loops over buffers) exactly when
    compiled: the guarded `import cython` must neither fail there nor succeed in pure Python."""
    from mambaradix.core import keys, tree
    from mambaradix.pools import _freelist, ownership

    compiled = mambaradix.BUILD == "compiled"
    assert keys.COMPILED is compiled and tree.COMPILED is compiled
    assert _freelist.COMPILED is compiled and ownership.COMPILED is compiled


def compiled_pxds() -> list[Path]:
    """The `.pxd` beside each module of `_build.COMPILED`, in its order (the order a tag
    hashes them in), found here from the module names."""
    beside = (SRC.joinpath(*name.split(".")).with_suffix(".pxd") for name in _build.COMPILED)
    return [pxd for pxd in beside if pxd.is_file()]


def test_an_edited_pxd_makes_every_module_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `.pxd` gives C types to its module and to the modules that cimport it: editing one
    must make the whole build stale, as editing a `.py` does (its own file)."""
    pxds = _build.declarations()
    assert pxds == compiled_pxds()
    assert {p.stem for p in pxds} >= {"node", "lru", "tree", "_freelist", "ownership"}
    copy = tmp_path / "mambaradix"
    for folder in ("core", "pools"):
        shutil.copytree(SRC / "mambaradix" / folder, copy / folder)
    today = {name: _build.compiled_stem(name) for name in _build.COMPILED}
    monkeypatch.setattr(_build, "PACKAGE", copy)
    assert {name: _build.compiled_stem(name) for name in _build.COMPILED} == today
    for edited in (copy / "core" / "lru.pxd", copy / "pools" / "ownership.pxd"):
        before = {name: _build.compiled_stem(name) for name in _build.COMPILED}
        edited.write_text(edited.read_text() + "\n# edited\n")
        after = {name: _build.compiled_stem(name) for name in _build.COMPILED}
        assert all(after[name] != before[name] for name in _build.COMPILED)
    source = copy / "core" / "keys.py"
    source.write_text(source.read_text() + "\n# edited\n")
    again = {name: _build.compiled_stem(name) for name in _build.COMPILED}
    assert [name for name in _build.COMPILED if again[name] != after[name]] == [
        "mambaradix.core.keys"
    ]


def require_compiled() -> None:
    """Skip without a compiled build, or fail when one is required."""
    if _build.compiled_files() is not None:
        return
    if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
        pytest.fail(f"{REQUIRE_ENV} is set but the compiled core is not built (docs/build.md)")
    pytest.skip("no compiled core built from this source (pip install -e .; docs/build.md)")


def test_compiled_core_required_where_asked() -> None:
    require_compiled()
    if os.environ.get(_build.PURE_ENV, "") in ("", "0"):
        assert mambaradix.BUILD == "compiled"


def test_compiled_and_pure_decide_alike() -> None:
    require_compiled()
    out = run_python([str(TESTS / "core_builds.py"), "2", "300"])
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("same:") == 12  # 3 modes x 2 page sizes x 2 seeds


def test_compiled_and_pure_pools_alike() -> None:
    require_compiled()
    out = run_python([str(TESTS / "pool_builds.py"), "3", "600"])  # about a second
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("same:") == 6  # 3 seeds x (token, paged)


def serve_on_both(requests: int, memories: str) -> None:
    """The main job's cells on the first `requests` requests at `memories` (GB) on each
    build, in a process of its own: every result equal, every compiled module used."""
    args = [str(TESTS / "serving_builds.py"), str(requests), memories]
    with ThreadPoolExecutor(len(BUILDS)) as pool:  # the two processes side by side
        started = {b: pool.submit(run_python, args, MAMBARADIX_PURE=p) for b, p in BUILDS}
        runs = {build: run.result() for build, run in started.items()}
    for build, out in runs.items():
        assert out.returncode == 0, out.stderr[-3000:]
        report, files, *unused = out.stdout.splitlines()[0].split()
        assert (report, files, unused) == (build, build, [])
    assert runs["compiled"].stdout.splitlines()[1] == runs["pure"].stdout.splitlines()[1]


BUILDS = (("compiled", "0"), ("pure", "1"))


def test_compiled_and_pure_serve_alike() -> None:
    require_compiled()
    # 200 requests: at 20 GB every policy evicts states and KV (about 2M tokens each)
    serve_on_both(200, "20,80")


@pytest.mark.slow
def test_compiled_and_pure_decide_alike_long() -> None:
    require_compiled()
    out = run_python([str(TESTS / "core_builds.py"), "4", "3000"])  # about 20 s
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("same:") == 24
