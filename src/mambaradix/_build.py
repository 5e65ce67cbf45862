"""Which build runs: the compiled one (Cython) or the pure-Python one.

The compiled build (docs/build.md) is the hot modules (`COMPILED`, full module names:
today the core's, and the pools' free list and KV owner map) compiled by Cython, typed by
the `.pxd` beside a module where there is one (pure-Python mode), each into
`mambaradix/_compiled/<stem>_<tag>.<ext suffix>`, where `<stem>` is the module's path in
the package (`core__tree`: dots as `__`) and `<tag>` is the SHA-256
(first 16 hex digits) of the `.py` it was compiled from and of the `.pxd` files.
Nothing imports those files by their own names: `CompiledCore`, a meta-path finder that
`mambaradix/__init__.py` installs before the core is first imported, hands each module
of `COMPILED` its compiled file only when every module of `COMPILED` has one whose tag
is that of today's source. So:

* an edited `.py` or `.pxd` (a stale build) loads as pure Python, all of it, never a mix;
* MAMBARADIX_PURE=1 (anything but "" or "0") installs no finder: the pure code runs;
* `mambaradix.BUILD` says which one loaded ("compiled" or "pure").

The pure `.py` files are the reference: the compiled modules are the same source, and
tests/test_compiled.py drives both through one seeded operation sequence.

Standard library only: `setup.py` loads this file by path to name what it compiles.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

PURE_ENV = "MAMBARADIX_PURE"
# Full module names: any module of the package may be listed. The core's hot modules and the
# pools' two array-bound ones, typed by their .pxd files; the rest of the replay's serving
# path (scheduler, lifecycle, policies), compiled as it is, ran no faster (docs/build.md,
# "The serving path").
COMPILED = tuple(
    f"mambaradix.core.{name}" for name in ("keys", "node", "lru", "ownership", "unified", "tree")
) + ("mambaradix.pools._freelist", "mambaradix.pools.ownership")
PACKAGE = Path(__file__).resolve().parent
OUT = PACKAGE / "_compiled"


def source_tag(source: Path) -> str:
    """The tag a compiled module of `source` carries in its file name: the SHA-256 of the
    `.py` and of every `.pxd` beside a module of `COMPILED` (`declarations()`). A `.pxd`
    types what its module compiles to, and the modules that cimport it compile against
    it, so an edited `.pxd` makes every compiled file stale, as an edited `.py` makes its
    own."""
    digest = hashlib.sha256(source.read_bytes())
    for pxd in declarations():
        digest.update(b"\0" + pxd.name.encode() + b"\0" + pxd.read_bytes())
    return digest.hexdigest()[:16]


def declarations() -> list[Path]:
    """The `.pxd` files beside the modules of `COMPILED` (Cython's pure-Python mode: C types
    for the module of the same name), in `COMPILED`'s order."""
    found = (source_of(name).with_suffix(".pxd") for name in COMPILED)
    return [pxd for pxd in found if pxd.is_file()]


def source_of(name: str) -> Path:
    """The `.py` of the module `name` (`mambaradix.pools.kv` -> `<package>/pools/kv.py`)."""
    return PACKAGE.joinpath(*name.split(".")[1:]).with_suffix(".py")


def compiled_stem(name: str) -> str:
    """The file name, less its suffix, of the compiled module `name` built from today's
    source (`mambaradix.core.tree` -> `core__tree_<tag>`)."""
    return "__".join(name.split(".")[1:]) + "_" + source_tag(source_of(name))


def compiled_files(out: Path = OUT) -> dict[str, Path] | None:
    """Module name -> its compiled file for today's source, for every name of `COMPILED`;
    None when any one is missing (not built, or built from other source)."""
    found: dict[str, Path] = {}
    for name in COMPILED:
        stem = compiled_stem(name)
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = out / f"{stem}{suffix}"
            if path.is_file():
                found[name] = path
                break
        else:
            return None
    return found


class CompiledCore:
    """Meta-path finder: each module of `COMPILED` from its compiled file."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        # The module keeps its own name; the file's name only says which source it is.
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(file))
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


def pure_wanted() -> bool:
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def install() -> str:
    """Install the finder if the compiled build is wanted and complete; return the build
    that will load ("compiled" or "pure"). Call before any module of `COMPILED` is first
    imported."""
    # at most one finder, this call's (mambaradix imported again after sys.modules was
    # cleared, by a test or a benchmark loading both builds, brings a new module's class)
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "CompiledCore"]
    files = None if pure_wanted() else compiled_files()
    if files is None:
        return "pure"
    sys.meta_path.insert(0, CompiledCore(files))
    return "compiled"


def loaded_build() -> str:
    """The build the imported modules of `COMPILED` come from, read from their files:
    "compiled", "pure", or "mixed" (never expected: the finder loads all of them or none).
    Call after the core is imported (`import mambaradix` imports it)."""
    kinds = set()
    for name in COMPILED:
        module = sys.modules.get(name)
        if module is not None:
            is_py = str(getattr(module, "__file__", "")).endswith(".py")
            kinds.add("pure" if is_py else "compiled")
    return kinds.pop() if len(kinds) == 1 else "mixed"


__all__ = [
    "COMPILED",
    "CompiledCore",
    "compiled_stem",
    "declarations",
    "install",
    "loaded_build",
    "source_of",
    "source_tag",
]
