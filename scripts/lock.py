"""Write constraints.txt: the exact version of everything mambaradix and its extras pull
in, read from the environment this runs in (the one the tests passed in).

    .venv/bin/python scripts/lock.py            # writes constraints.txt
    .venv/bin/python scripts/lock.py --check    # exit 1 if constraints.txt differs

pyproject.toml declares ranges (what a user's environment may hold); this file pins the
versions CI tests: `pip install -c constraints.txt -e ".[...]"` (scripts/setup.sh).
A local version label is dropped (torch 2.13.0+cpu is written torch==2.13.0, which pip
matches to the CPU build where one lies on disk, as on these machines).
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "mambaradix"
OPTIONAL = {"mooncake"}  # extras set-up may fail to install (it says so): not pinned
HEADER = """\
# Exact versions CI tests (scripts/lock.py writes this from the tested environment).
# pyproject.toml holds the ranges; scripts/setup.sh installs with:
#   pip install -c constraints.txt -e ".[EXTRAS]"
"""


def closure(project: str, extras: tuple[str, ...]) -> dict[str, str]:
    """name -> installed version of every distribution `project[extras]` needs."""
    found: dict[str, str] = {}
    todo = [(project, set(extras))]
    while todo:
        name, wanted = todo.pop()
        for text in requires(name):
            req = Requirement(text)
            envs = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker and not any(req.marker.evaluate(env) for env in envs):
                continue
            key = canonicalize_name(req.name)
            if key == project:
                continue
            new = key not in found
            if new:
                found[key] = metadata.version(req.name)
            if new or req.extras:
                todo.append((req.name, set(req.extras)))
    return found


def requires(name: str) -> list[str]:
    """The requirement lines of `name`: this checkout's pyproject.toml for the project
    (an installed copy may be older), the installed metadata for the rest."""
    if name != PROJECT:
        return metadata.distribution(name).requires or []
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra, reqs in project["optional-dependencies"].items():
        lines += [f"{r}; extra == '{extra}'" for r in reqs]
    return lines


def extras() -> tuple[str, ...]:
    """Every extra of pyproject.toml but the optional ones."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return tuple(e for e in project["optional-dependencies"] if e not in OPTIONAL)


def render(pins: dict[str, str]) -> str:
    lines = [f"{name}=={version.split('+')[0]}" for name, version in sorted(pins.items())]
    return HEADER + "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="compare, do not write")
    args = ap.parse_args()
    text = render(closure(PROJECT, extras()))
    path = ROOT / "constraints.txt"
    if args.check:
        if path.read_text() != text:
            print(f"{path} differs from this environment; run scripts/lock.py", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"{path}: {text.count(chr(10)) - HEADER.count(chr(10))} pins")
    return 0


if __name__ == "__main__":
    sys.exit(main())
