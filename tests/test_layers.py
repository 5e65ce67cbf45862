"""Dependencies run one way: core <- pools <- lifecycle <- policies <- scheduler <-
replay, engine <- cli (the engine never imports the replay, nor the replay the
engine). Every import in the source is read (function-level and TYPE_CHECKING ones
too), so a cycle cannot hide in a deferred import. The policy layer also talks to
the tree only through its seam (`policies.seam.PolicyTree`)."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from pathlib import Path

from mambaradix.core.tree import MambaRadixCache
from mambaradix.policies.seam import PolicyTree

SRC = Path(__file__).resolve().parents[1] / "src" / "mambaradix"
ABOVE_POLICIES = {"scheduler", "replay", "engine", "cli"}
FORBIDDEN = {
    "core": {"pools", "lifecycle", "policies", *ABOVE_POLICIES},
    "pools": {"lifecycle", "policies", *ABOVE_POLICIES},
    "lifecycle": {"policies", *ABOVE_POLICIES},
    "policies": ABOVE_POLICIES,
    "scheduler": {"replay", "engine", "cli"},
    "engine": {"replay", "cli"},
    "replay": {"engine", "cli"},
}


def imported_packages(package: str) -> dict[str, set[str]]:
    """Each module of `package` -> the mambaradix packages it imports."""
    out: dict[str, set[str]] = {}
    for path in sorted((SRC / package).rglob("*.py")):
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            found |= {n.split(".")[1] for n in names if n.startswith("mambaradix.")}
        out[str(path.relative_to(SRC))] = found
    return out


def test_every_layer_imports_only_below_it() -> None:
    wrong = [
        (module, sorted(found & FORBIDDEN[package]))
        for package in FORBIDDEN
        for module, found in imported_packages(package).items()
        if found & FORBIDDEN[package]
    ]
    assert wrong == []


def test_the_policy_layer_loads_nothing_above_it() -> None:
    """Importing the policies (their registry included) loads no module of the
    scheduler, the replay, the engine or the CLI."""
    code = (
        "import sys, mambaradix.policies\n"
        "print(sorted(m for m in sys.modules if m.split('.')[:2][-1] in "
        f"{sorted(ABOVE_POLICIES)!r} and m.startswith('mambaradix.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


def test_the_tree_has_every_method_of_the_seam() -> None:
    members = [n for n in vars(PolicyTree) if not n.startswith("_")]
    assert members  # the seam lists methods
    for name in members:
        ours = inspect.signature(getattr(MambaRadixCache, name))
        seam = inspect.signature(getattr(PolicyTree, name))
        assert list(ours.parameters) == list(seam.parameters), name


def test_no_policy_reaches_into_the_tree_or_the_manager() -> None:
    """No private attribute of a tree, node, context, request, cache manager or request
    table is read in the policy layer (only `self._...` and the policies' own helpers),
    nor a node's LRU links (`node.kv.lock`: the public `kv_lock`, `state_lock` instead)."""
    private = re.compile(
        r"\b(tree|node|ctx|req|cache|rows|parent|child|n|m)\._[a-z]|\.(st|kv)\.(lock|stamp)\b"
    )
    hits = [
        f"{path.name}:{i}: {line.strip()}"
        for path in sorted((SRC / "policies").glob("*.py"))
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if private.search(line)
    ]
    assert hits == []
