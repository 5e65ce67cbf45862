"""The optional compiled build (docs/build.md); everything else is in pyproject.toml.

Cython compiles the hot modules (`mambaradix._build.COMPILED`: the core's, the pools' free
list and owner map), typed by the `.pxd` beside a module where there is one (pure-Python
mode), each into `mambaradix/_compiled/<stem>_<source tag>` (`_build.compiled_stem`).
Optional: without Cython, without a C compiler, or with MAMBARADIX_NO_COMPILE=1, the
install succeeds with the pure-Python modules, and `mambaradix.BUILD` says "pure".
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
SRC = Path("src")


def load_build_module() -> ModuleType:
    """src/mambaradix/_build.py by path: importing the package would need its dependencies."""
    path = ROOT / SRC / "mambaradix" / "_build.py"
    spec = importlib.util.spec_from_file_location("_mambaradix_build", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class OptionalBuildExt(build_ext):
    """Cythonizes the modules, then compiles them in parallel; any failure leaves the pure
    core in place (a partial build is never loaded, see mambaradix/_build.py)."""

    def run(self) -> None:
        if self.editable_mode or self.inplace:  # the copy into src/ needs the folder
            # (here: setuptools' run() turns `inplace` off while it builds)
            os.makedirs(SRC / "mambaradix" / "_compiled", exist_ok=True)
        try:
            super().run()
        except Exception as e:  # no compiler, no Python headers: the pure core serves
            warn(f"compiled core not built ({type(e).__name__}: {e}); the pure-Python modules run")

    def build_extensions(self) -> None:
        try:
            from Cython.Build import cythonize
        except ImportError:
            warn("Cython is not installed; the pure-Python modules run")
            return
        c_dir = os.path.join(self.build_temp, "cython")
        for ext in self.extensions:  # one thread: Cython itself is not run in parallel
            name = module_name(ext.sources[0])  # the module keeps its name
            (c_ext,) = cythonize(
                [Extension(name, ext.sources)],
                build_dir=c_dir,
                # annotations are not C types here: a float passed as an `int` must reach
                # the code's own check, exactly as in the pure module
                compiler_directives={"language_level": 3, "annotation_typing": False},
                include_path=[str(ROOT / SRC)],  # the .pxd files cimport each other
                quiet=True,
            )
            ext.sources = list(c_ext.sources)
        self.parallel = self.parallel or os.cpu_count() or 1  # gcc runs, one per core
        super().build_extensions()

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:
            warn(f"{ext.name} not built ({type(e).__name__}: {e}); the pure-Python modules run")


def module_name(source: str) -> str:
    """`src/mambaradix/pools/kv.py` -> `mambaradix.pools.kv`."""
    return ".".join(Path(source).relative_to(SRC).with_suffix("").parts)


def warn(text: str) -> None:
    print(f"mambaradix setup: {text}", file=sys.stderr)


def extensions() -> list[Extension]:
    if os.environ.get("MAMBARADIX_NO_COMPILE", "") not in ("", "0"):
        return []
    build = load_build_module()
    return [
        Extension(
            f"mambaradix._compiled.{build.compiled_stem(name)}",
            [str(build.source_of(name).relative_to(ROOT))],
            # no debug info: half the compile time; no fused multiply-add: C arithmetic on
            # floats rounds as the interpreter's does
            extra_compile_args=["-O2", "-g0", "-ffp-contract=off"],
        )
        for name in build.COMPILED
    ]


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
