"""Ctrl-C during a sweep, for real: the CLI in a subprocess of its own session
gets SIGINT once its sweep has started; it must exit 130 within 2 s, print no
traceback, leave no process of its session running and write no file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def session_processes(sid: int) -> list[int]:
    """Pids of live processes whose session id is `sid` (from /proc)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # it ended while we looked
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state ppid pgrp session ...
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def wait_for(predicate: object, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(
    ("workers", "to_group"),
    [("2", True), ("2", False), ("1", True)],
    ids=["2 workers, Ctrl-C to the group", "2 workers, SIGINT to the parent", "in-process"],
)
def test_ctrl_c_stops_a_sweep(tmp_path: Path, workers: str, to_group: bool) -> None:
    out = tmp_path / "out"
    out.mkdir()
    err_path = tmp_path / "stderr.txt"
    cmd = [sys.executable, "-m", "mambaradix.cli", "replay", "--workers", workers]
    cmd += ["--json", str(out / "r.json"), "--plot", str(out / "r.png")]
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,  # its own session and process group, like a shell job
            env={**os.environ, "PYTHONPATH": str(SRC)},
        )
    try:
        # The sweep has started when its progress bar is drawn (and, with
        # workers, when the worker processes exist).
        assert wait_for(lambda: "replay:" in err_path.read_text(), 60), err_path.read_text()
        n = int(workers)
        assert wait_for(lambda: len(session_processes(proc.pid)) == n + (n > 1), 30)
        time.sleep(0.5)
        sent = time.monotonic()
        if to_group:
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        else:
            proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stderr = err_path.read_text()
    print(f"Ctrl-C to exit: {took:.2f} s")  # shown with -s
    assert code == 130, stderr
    assert took < 2.0, f"exit took {took:.2f} s"
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert stderr.rstrip().endswith("mambaradix replay: interrupted; nothing written")
    assert session_processes(proc.pid) == []  # no worker left running
    assert list(out.iterdir()) == []  # no plot, no JSON, no temporary file


def _interrupt(*_: object, **__: object) -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("argv", "target", "says"),
    [
        # Ctrl-C while the parser is built (the subcommands' modules import numpy, torch...)
        (["engine"], "mambaradix.cli.engine.add", "mambaradix: interrupted"),
        # Ctrl-C while `mambaradix index` imports zmq or binds, before its own handler is set
        (
            ["index", "--workers", "1=tcp://127.0.0.1:5999", "--port", "0"],
            "IndexServer",
            "mambaradix index: interrupted",
        ),
    ],
    ids=["while parsing", "index before it listens"],
)
def test_ctrl_c_before_the_command_runs(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    target: str,
    says: str,
) -> None:
    from mambaradix.cli import main

    if target == "IndexServer":
        import mambaradix.index.server

        monkeypatch.setattr(mambaradix.index.server.IndexServer, "__init__", _interrupt)
    else:
        monkeypatch.setattr(target, _interrupt)
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert err.strip() == says
