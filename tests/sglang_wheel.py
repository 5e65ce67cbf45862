"""Load chosen modules of an SGLang release from its wheel, under a package name of their own.

Nothing from SGLang is copied into this repository. ``WheelPackage`` opens the wheel (a
dev/test-only download in ``.cache/sglang/``), extracts the files asked for into
``.cache/sglang/src/<wheel>/`` and imports them as the real modules, under the package name
``<prefix>`` instead of ``sglang`` (``sglang_v0_5_23.srt.mem_cache...``): the ``sglang`` of
their import statements is rewritten to that name (a copy of each file next to the extracted
one, ``.cache/sglang/src/<wheel>-as-<prefix>-N/``, checked with ``ast`` to leave no import of
``sglang``; every line stays where it is in the wheel's file). So two releases load side by
side in one process: ``upstream_sglang`` keeps ``sglang`` for 0.5.15.post1.

Every other module of the package a loaded file imports is a stand-in:

* ``overrides[name]``: the attributes given (GPU/server machinery that the tree and allocator
  logic reads: configuration, device probes, decorators), the rest placeholders as below;
* otherwise an empty module whose every attribute is a placeholder class: a type annotation,
  a base class or an ``isinstance`` target works, calling it raises ``NotImplementedError``
  naming it, so no stubbed code path can run silently.

``pick(member, wanted, ns)`` compiles single classes / functions out of a wheel file that cannot
be imported as a whole (as ``upstream_lifecycle`` does).
"""

from __future__ import annotations

import ast
import glob
import importlib.abc
import importlib.machinery
import marshal
import os
import re
import sys
import types
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
WHEEL_ENV = "MAMBARADIX_SGLANG_{}_WHEEL"


def find_wheel(version: str) -> Path:
    """``$MAMBARADIX_SGLANG_<VER>_WHEEL`` (dots as underscores), else
    ``.cache/sglang/sglang-<version>-*.whl``."""
    env_name = WHEEL_ENV.format(version.replace(".", "_").upper())
    env = os.environ.get(env_name)
    pattern = str(REPO_ROOT / ".cache" / "sglang" / f"sglang-{version}-*.whl")
    candidates = [Path(env)] if env else [Path(p) for p in sorted(glob.glob(pattern))]
    for path in candidates:
        if path.is_file():
            return path
    raise RuntimeError(
        f"SGLang {version} wheel not found (looked for {env or pattern}). The upstream "
        f"comparison needs it; fetch it from the repository root with\n"
        f"    .venv/bin/python -m pip download sglang=={version} --no-deps -d .cache/sglang\n"
        f"or set {env_name} to the wheel's path."
    )


class Placeholder:
    """Base of every stand-in attribute: usable as a type, never callable."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls = type(self)
        raise NotImplementedError(f"{cls.__module__}.{cls.__qualname__} is a stand-in (stubbed)")


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (Placeholder,), {"__module__": self.__name__})
        setattr(self, name, value)
        return value


class _RenameImports(ast.NodeTransformer):
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def _rename(self, name: str) -> str:
        if name == "sglang" or name.startswith("sglang."):
            return self.prefix + name[len("sglang") :]
        top = name.split(".", 1)[0]
        if top in FOREIGN:
            return f"{self.prefix}._foreign.{name}"
        return name

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.ImportFrom:
        if node.level == 0 and node.module is not None:
            node.module = self._rename(node.module)
        return node

    def visit_Import(self, node: ast.Import) -> ast.Import:
        for alias in node.names:
            # `import sglang.x` then binds the renamed top package: a later use of the
            # name `sglang` fails loudly (none on the paths loaded here).
            alias.name = self._rename(alias.name)
        return node


FOREIGN = ("triton", "sgl_kernel")
"""GPU packages the loaded files import (not installed here): renamed to stand-ins under
``<prefix>._foreign``, so nothing of theirs is visible outside these modules (torch probes
for a real ``triton``)."""
_RENAMED = "-as-{prefix}-2"  # the folder of renamed copies; bump when the renaming changes
_IMPORT = re.compile(
    r"^(\s*(?:from|import)\s+)(sglang|" + "|".join(FOREIGN) + r")(?=[.\s])", re.MULTILINE
)


_PLAIN_FOREIGN = re.compile(r"^(\s*)import (" + "|".join(FOREIGN) + r")[ \t]*$", re.MULTILINE)


def _renamed_text(prefix: str, text: str) -> str:
    # `import triton` keeps binding the name `triton`: `import <prefix>._foreign.triton as triton`
    text = _PLAIN_FOREIGN.sub(lambda m: f"{m.group(1)}import {m.group(2)} as {m.group(2)}", text)
    return _IMPORT.sub(lambda m: _renamed_import(prefix, m), text)


def _renamed_import(prefix: str, match: re.Match[str]) -> str:
    name = match.group(2)
    return match.group(1) + (prefix if name == "sglang" else f"{prefix}._foreign.{name}")


def _check_renamed(tree: ast.Module, member: str) -> None:
    """Every import statement of the rewritten text names the renamed package."""
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for top in ("sglang", *FOREIGN):
            if any(n == top or n.startswith(top + ".") for n in names):
                raise RuntimeError(f"{member}:{node.lineno}: an import was not renamed")


def _code(path: Path) -> Any:
    """The compiled module at ``path``, cached next to it (compiling takes most of a load;
    the files never change: they come from one wheel)."""
    cached = path.with_name(f"{path.name}.{sys.implementation.cache_tag}.code")
    if cached.is_file() and cached.stat().st_mtime >= path.stat().st_mtime:
        return marshal.loads(cached.read_bytes())
    code = compile(path.read_text(), str(path), "exec")
    tmp = cached.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(marshal.dumps(code))
    os.replace(tmp, cached)
    return code


class WheelPackage(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The wheel's ``sglang`` package as ``prefix``: ``real`` modules (dotted names below
    ``sglang``, e.g. ``"srt.environ"``) from the wheel, ``overrides`` as given, the rest
    placeholder modules."""

    def __init__(
        self,
        version: str,
        prefix: str,
        real: set[str],
        overrides: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.version, self.prefix = version, prefix
        self.wheel = find_wheel(version)
        self.root = REPO_ROOT / ".cache" / "sglang" / "src" / self.wheel.stem
        self.members = self._members()
        self.dirs = {m.rsplit("/", 1)[0] for m in self.members if "/" in m}
        self.real = set(real)
        self.overrides = dict(overrides or {})
        self.stubbed: set[str] = set()
        if any(isinstance(f, WheelPackage) and f.prefix == prefix for f in sys.meta_path):
            raise RuntimeError(f"{prefix} is already installed")
        sys.meta_path.insert(0, self)

    # ------------------------------------------------------------------ files

    def _members(self) -> set[str]:
        """The wheel's file names (listed once into ``<root>/MEMBERS``: opening the wheel's
        index takes about a second)."""
        listing = self.root / "MEMBERS"
        if not listing.is_file():
            with zipfile.ZipFile(self.wheel) as zf:
                names = zf.namelist()
            listing.parent.mkdir(parents=True, exist_ok=True)
            tmp = listing.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text("\n".join(names))
            os.replace(tmp, listing)
        return set(listing.read_text().split("\n"))

    def file(self, member: str) -> Path:
        """Extract ``member`` (a path inside the wheel) once; its path on disk."""
        target = self.root / member
        if not target.is_file():
            with zipfile.ZipFile(self.wheel) as zf:
                data = zf.read(member)
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(data)
            os.replace(tmp, target)  # atomic, so concurrent test workers are safe
        return target

    def compile(self, member: str, tree: ast.Module) -> Any:
        """Compile a module body parsed from ``member``, its imports renamed."""
        tree = _RenameImports(self.prefix).visit(tree)
        return compile(ast.fix_missing_locations(tree), str(self.file(member)), "exec")

    def renamed(self, member: str) -> Path:
        """``member`` with its imports renamed, written once next to the extracted files (so
        Python caches its bytecode); the same lines as the wheel's file."""
        target = self.root.parent / (self.root.name + _RENAMED.format(prefix=self.prefix)) / member
        if not target.is_file():
            text = _renamed_text(self.prefix, self.file(member).read_text())
            _check_renamed(ast.parse(text, str(target)), member)
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(text)
            os.replace(tmp, target)
        return target

    def pick(
        self, member: str, wanted: dict[str, tuple[str, ...] | None], ns: dict[str, Any]
    ) -> None:
        """Compile the wanted top-level classes / functions of ``member`` into ``ns``. A class
        keeps only the listed methods, no decorator, and no base not defined in ``ns``."""
        path = self.file(member)
        tree = ast.parse(path.read_text(), str(path))
        body: list[ast.stmt] = [ast.ImportFrom("__future__", [ast.alias("annotations")], 0)]
        found: set[str] = set()
        for node in tree.body:
            if not isinstance(node, ast.ClassDef | ast.FunctionDef) or node.name not in wanted:
                continue
            keep = wanted[node.name]
            if isinstance(node, ast.ClassDef) and keep is not None:
                node.body = [
                    f for f in node.body if isinstance(f, ast.FunctionDef) and f.name in keep
                ]
                names = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                if names != set(keep):
                    raise RuntimeError(f"{member}: {node.name} lacks {set(keep) - names}")
                node.decorator_list = []
                local = set(ns) | set(wanted)
                node.bases = [b for b in node.bases if isinstance(b, ast.Name) and b.id in local]
            found.add(node.name)
            body.append(node)
        if found != set(wanted):
            raise RuntimeError(f"{member}: not found {set(wanted) - found}")
        exec(self.compile(member, ast.Module(body=body, type_ignores=[])), ns)

    # ------------------------------------------------------------- importing

    def _rel(self, fullname: str) -> str | None:
        if fullname == self.prefix:
            return ""
        if fullname.startswith(self.prefix + "."):
            return fullname[len(self.prefix) + 1 :]
        return None

    def _member(self, rel: str) -> tuple[str | None, bool]:
        """(the wheel file of module ``rel`` or None, whether it is a package)."""
        base = "sglang/" + rel.replace(".", "/") if rel else "sglang"
        if f"{base}/__init__.py" in self.members:
            return f"{base}/__init__.py", True
        if f"{base}.py" in self.members:
            return f"{base}.py", False
        return None, base in self.dirs

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        rel = self._rel(fullname)
        if rel is None:
            return None
        member, is_pkg = self._member(rel)
        is_pkg = is_pkg or rel.startswith("_foreign")
        origin = str(self.root / member) if member and rel in self.real else None
        return importlib.machinery.ModuleSpec(fullname, self, origin=origin, is_package=is_pkg)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        rel = self._rel(spec.name)
        assert rel is not None
        if rel in self.real:
            return types.ModuleType(spec.name)
        if rel not in self.overrides:
            self.stubbed.add(rel)
        return _StubModule(spec.name, f"Stand-in for sglang.{rel} (tests/sglang_wheel.py)")

    def exec_module(self, module: types.ModuleType) -> None:
        rel = self._rel(module.__name__)
        assert rel is not None
        if rel in self.overrides:
            module.__dict__.update(self.overrides[rel])
        if rel in self.real:
            member, _ = self._member(rel)
            if member is None:
                raise ModuleNotFoundError(f"sglang.{rel} is not in {self.wheel.name}")
            path = self.renamed(member)
            module.__file__ = str(path)
            exec(_code(path), module.__dict__)

    def module(self, rel: str) -> types.ModuleType:
        """Import ``sglang.<rel>`` of this wheel (``rel`` dotted, e.g. ``"srt.environ"``)."""
        import importlib

        return importlib.import_module(f"{self.prefix}.{rel}" if rel else self.prefix)


def identity_decorator(*args: Any, **kwargs: Any) -> Callable[[Any], Any]:
    """A decorator factory whose decorators change nothing."""

    def decorate(fn: Any) -> Any:
        return fn

    return decorate
