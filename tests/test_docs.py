"""The documentation site builds with `mkdocs build --strict` (every page in the nav exists,
every link and anchor between pages resolves, nothing warns), from the very command the
README states, with the network shut off: no plugin may fetch anything at build time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import readme  # noqa: E402

# Runs mkdocs with every way out to the network refused (the argv follows).
OFFLINE = """
import socket, sys

def refuse(*args, **kwargs):
    raise OSError("the docs build tried to reach the network")

socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse
from mkdocs.__main__ import cli
sys.exit(cli(sys.argv[1:]))
"""


def build_command() -> list[str]:
    (row,) = [r for r in readme.command_rows() if r.command.startswith(".venv/bin/mkdocs build")]
    assert "tests/test_docs.py" in row.test  # the table says this test runs it
    words = readme.to_argv(row.command.split())
    assert words[:3] == [sys.executable, "-m", "mkdocs"]
    return words[3:]


def test_the_site_builds_strictly_and_offline(tmp_path: Path) -> None:
    site = tmp_path / "site"
    args = [*build_command(), "--config-file", str(readme.REPO / "mkdocs.yml")]
    done = subprocess.run(
        [sys.executable, "-c", OFFLINE, *args, "--site-dir", str(site)],
        cwd=tmp_path,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    for page in ["index.html", "design/index.html", "reference/replay/index.html"]:
        assert (site / page).is_file(), page
    assert (site / "search" / "search_index.json").is_file()  # built locally


def test_the_offline_guard_would_catch_a_fetch(tmp_path: Path) -> None:
    """The guard above is real: a plain connection attempt under it fails."""
    probe = OFFLINE.split("from mkdocs")[0] + "socket.create_connection(('127.0.0.1', 9))\n"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode != 0 and "tried to reach the network" in done.stderr
