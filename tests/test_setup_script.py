"""scripts/setup.sh skips the install when the venv was set up from the same inputs.

Each test runs the real script and the real `scripts/setup_fingerprint.py` in a copy of
the files they read, with a stand-in venv interpreter, `apt-get` and wheel fetcher that
only log their calls: what the script would install is read from the log.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mambaradix import _build

ROOT = Path(__file__).resolve().parent.parent
COPIED = (
    "pyproject.toml",
    "constraints.txt",
    "setup.py",
    "scripts/setup.sh",
    "scripts/setup_fingerprint.py",
    "src/mambaradix/_build.py",
)

LOGGER = '#!/bin/sh\necho "{name} $*" >> "$SETUP_LOG"\nexit ${{FAIL_{name}:-0}}\n'


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    for name in COPIED:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    for folder in {Path("src", *name.split(".")[:-1]) for name in _build.COMPILED}:
        shutil.copytree(  # the compiled modules' folders (core, pools): their tags
            ROOT / folder,
            tmp_path / folder,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    stubs = {"scripts/fetch-event-wheels.sh": "wheels", ".venv/bin/python": "python"}
    stubs["bin/apt-get"] = "apt"  # were a system package missing here
    for path, name in stubs.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(LOGGER.format(name=name))
        (tmp_path / path).chmod(0o755)
    return tmp_path


def run_setup(repo: Path, **env: str) -> tuple[int, list[str]]:
    """(exit status, the stand-ins' calls) of one run of the script."""
    log = repo / "calls.log"
    log.write_text("")
    path = f"{repo / 'bin'}{os.pathsep}{os.environ['PATH']}"
    full = {k: v for k, v in os.environ.items() if k != "MAMBARADIX_NO_COMPILE"}
    full.update(SETUP_LOG=str(log), PATH=path, **env)
    done = subprocess.run(["bash", "scripts/setup.sh"], cwd=repo, env=full, capture_output=True)
    return done.returncode, log.read_text().splitlines()


def pip_calls(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith("python -m pip install")]


def test_a_second_set_up_installs_nothing(repo: Path) -> None:
    status, calls = run_setup(repo)
    assert status == 0
    assert len(pip_calls(calls)) == 4  # pip itself, the package, its requirements, mooncake
    assert (repo / ".venv/setup-done").is_file()
    status, calls = run_setup(repo)
    assert status == 0
    assert calls == ["wheels "]  # the wheels are still checked (a no-op when fetched)


@pytest.mark.parametrize(
    "edited",
    [
        "constraints.txt",
        "pyproject.toml",
        "src/mambaradix/core/tree.py",
        "src/mambaradix/core/tree.pxd",
        "src/mambaradix/pools/ownership.py",
        "scripts/setup.sh",
    ],
)
def test_an_edited_input_sets_up_again(repo: Path, edited: str) -> None:
    assert run_setup(repo)[0] == 0
    with (repo / edited).open("a") as f:
        f.write("\n# edited\n")
    status, calls = run_setup(repo)
    assert status == 0
    assert len(pip_calls(calls)) == 4


def test_another_build_choice_sets_up_again(repo: Path) -> None:
    assert run_setup(repo)[0] == 0
    status, calls = run_setup(repo, MAMBARADIX_NO_COMPILE="1")
    assert len(pip_calls(calls)) == 4
    assert run_setup(repo, MAMBARADIX_NO_COMPILE="1")[1] == ["wheels "]


def test_a_failed_set_up_leaves_no_mark(repo: Path) -> None:
    assert run_setup(repo)[0] == 0
    (repo / "constraints.txt").write_text("edited\n")
    status, calls = run_setup(repo, FAIL_python="1")
    assert status != 0
    assert not (repo / ".venv/setup-done").exists()
    status, calls = run_setup(repo)  # and the next run installs again
    assert status == 0 and len(pip_calls(calls)) == 4
