"""Ctrl-C during a sweep, for real: the CLI in a subprocess of its own session
gets SIGINT (or SIGTERM, SIGHUP) once its sweep has started; it must exit 130 (143,
129) within seconds (not after the sweep), print no traceback, leave no process of its
session running and write no file. Ctrl-C at any point of every command exits 130 (in-process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def as_from_a_terminal() -> None:
    """Run in the child before exec: SIGINT, SIGTERM and SIGHUP at their defaults, as
    a command typed in a terminal has them. A shell's background job (`cmd &`) ignores
    SIGINT and `nohup` ignores SIGHUP, and an ignored signal stays ignored across exec:
    without this the test would depend on how the suite itself was started."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


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


@pytest.mark.slow  # a replay of the bundled trace in a subprocess: seconds each
@pytest.mark.parametrize(
    ("workers", "to_group", "sig"),
    [
        ("2", True, signal.SIGINT),
        ("2", False, signal.SIGINT),
        ("1", True, signal.SIGINT),
        ("2", False, signal.SIGTERM),
        ("2", True, signal.SIGHUP),
        ("1", False, signal.SIGTERM),
    ],
    ids=[
        "2 workers, Ctrl-C to the group",
        "2 workers, SIGINT to the parent",
        "in-process",
        "2 workers, SIGTERM to the parent",
        "2 workers, SIGHUP to the group",
        "in-process, SIGTERM",
    ],
)
def test_ctrl_c_stops_a_sweep(
    tmp_path: Path, workers: str, to_group: bool, sig: signal.Signals
) -> None:
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
            preexec_fn=as_from_a_terminal,
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
            os.killpg(proc.pid, sig)  # what a terminal's Ctrl-C (or closing it) does
        else:
            proc.send_signal(sig)
        code = proc.wait(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stderr = err_path.read_text()
    print(f"Ctrl-C to exit: {took:.2f} s")  # shown with -s
    assert code == (130 if sig == signal.SIGINT else 128 + sig), stderr
    # The sweep has a minute of work left: stopping well before it shows nothing waited for
    # it (10 s, not less: a loaded CI machine may take seconds to schedule the exit).
    assert took < 10.0, f"exit took {took:.2f} s"
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    how = "" if sig == signal.SIGINT else f" ({sig.name})"
    assert stderr.rstrip().endswith(f"mambaradix replay: interrupted{how}; nothing written")
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


EVERY_COMMAND = {  # id: (argv, what raises Ctrl-C mid-run, what stderr ends with)
    "replay": (
        ["replay", "--trace", "synthetic-agent", "--memory", "5", "--workers", "1", "--no-plot"],
        "mambaradix.replay.sweep.sweep",
        "mambaradix replay: interrupted; nothing written",
    ),
    "demo": (
        ["demo", "--sessions", "2", "--turns", "2", "--no-progress"],
        "mambaradix.demo.report",
        "mambaradix demo: interrupted; nothing written",
    ),
    "engine": (["engine"], "mambaradix.cli.engine.prepare", "mambaradix engine: interrupted"),
    "merge": (["merge", "a.json"], "mambaradix.cli.merge._read_json", "mambaradix merge: inter"),
}


@pytest.mark.parametrize("command", list(EVERY_COMMAND))
def test_ctrl_c_in_every_command_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    from mambaradix.cli import main

    argv, target, says = EVERY_COMMAND[command]
    if command == "engine":
        pytest.importorskip("transformers")
    monkeypatch.setattr(target, _interrupt)
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert err.strip().startswith(says), err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]
)
def test_index_exits_with_the_signal_that_stopped_it(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    sig: signal.Signals,
    code: int,
) -> None:
    """`mambaradix index` serves until a signal: its exit code says which (it was 0)."""
    pytest.importorskip("zmq")
    from mambaradix.cli import main
    from mambaradix.index.subscriber import ZmqSubscriber

    polled = ZmqSubscriber.poll

    def poll(self: ZmqSubscriber, timeout: float) -> object:
        signal.raise_signal(sig)  # once it serves, with its own handlers in place
        return polled(self, timeout)

    monkeypatch.setattr(ZmqSubscriber, "poll", poll)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    argv = ["index", "--workers", "1=tcp://127.0.0.1:5999", "--port", "0", "--duration", "30"]
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.strip() == f"mambaradix index: interrupted ({sig.name}); stopped"
    assert {s: signal.getsignal(s) for s in before} == before  # its handlers are gone again
