"""Prints the fingerprint of what `scripts/setup.sh` installs from: the interpreter, the
requirements and their lock, the build (`setup.py`, `MAMBARADIX_NO_COMPILE`) and the source
of every module it compiles (`mambaradix._build`'s tag, `.pxd` files included), and the
set-up scripts. A venv set up from the same fingerprint has nothing to install.

Standard library only (it runs before the venv exists); run from the repository root.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

BUILD = "src/mambaradix/_build.py"  # names what the build compiles, and tags its source
INPUTS = (
    "pyproject.toml",
    "constraints.txt",
    "setup.py",
    "scripts/setup.sh",
    "scripts/setup_fingerprint.py",
    "scripts/fetch-event-wheels.sh",
    BUILD,
)


def fingerprint(root: Path) -> str:
    # by path, as setup.py loads it: importing the package would need its dependencies
    spec = importlib.util.spec_from_file_location("_setup_build", root / BUILD)
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    no_compile = os.environ.get("MAMBARADIX_NO_COMPILE", "")
    digest = hashlib.sha256(f"{sys.version}\0MAMBARADIX_NO_COMPILE={no_compile}".encode())
    for name in INPUTS:
        digest.update(b"\0" + name.encode() + b"\0" + (root / name).read_bytes())
    for module in build.COMPILED:
        tag = build.source_tag(build.source_of(module))
        digest.update(f"\0{module}={tag}".encode())
    return digest.hexdigest()


if __name__ == "__main__":
    print(fingerprint(Path.cwd()))
