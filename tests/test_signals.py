"""Every signal that ends a replay ends its workers too (replay/forked.py,
cli/signals.py), checked on real processes: a program in a session of its own runs
cells that never end on 2 forked workers; once they run it gets a signal, and no
process of its session may remain.

* SIGINT, SIGTERM or SIGHUP to the whole group (a terminal's Ctrl-C, a closed
  terminal, `kill -- -PGID`) or to the parent alone (`kill PID`): the parent exits
  130, 143 or 129, having killed its workers.
* SIGKILL to the parent alone (nothing of it runs): the kernel ends the workers.

Without the parent-death signal and the handlers, SIGTERM and SIGHUP left both
workers computing as orphans. The CLI's own exit paths are in test_cli_interrupt.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from test_cli_interrupt import as_from_a_terminal, session_processes, wait_for

SRC = Path(__file__).resolve().parents[1] / "src"

PROGRAM = textwrap.dedent(
    """
    import sys, time
    from mambaradix.cli.signals import as_interrupts, exit_code
    from mambaradix.replay.forked import run_forked

    def forever(i):
        while True:
            time.sleep(0.02)

    with as_interrupts():
        try:
            run_forked(forever, [0, 1], 2, lambda: None)
        except KeyboardInterrupt as e:
            print("cleaned up", flush=True)
            sys.exit(exit_code(e))
    """
)

CASES = {  # id: (signal, to the whole group, expected exit code: None = killed)
    "Ctrl-C to the group": (signal.SIGINT, True, 130),
    "SIGINT to the parent": (signal.SIGINT, False, 130),
    "SIGTERM to the group": (signal.SIGTERM, True, 143),
    "SIGTERM to the parent": (signal.SIGTERM, False, 143),
    "SIGHUP to the group": (signal.SIGHUP, True, 129),
    "SIGHUP to the parent": (signal.SIGHUP, False, 129),
    "SIGKILL to the parent": (signal.SIGKILL, False, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_no_worker_outlives_its_parent(case: str) -> None:
    sig, to_group, code = CASES[case]
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own session: every process it starts is found
        preexec_fn=as_from_a_terminal,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    try:
        assert wait_for(lambda: len(session_processes(proc.pid)) == 3, 20)
        if to_group:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=20)
        assert wait_for(lambda: session_processes(proc.pid) == [], 5), "orphans remain"
    finally:
        if session_processes(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if code is None:
        assert proc.returncode == -signal.SIGKILL
    else:
        assert (proc.returncode, out) == (code, "cleaned up\n"), err
        assert "Traceback" not in err


def test_a_signal_the_caller_ignores_stays_ignored() -> None:
    """`nohup` ignores SIGHUP: inside `as_interrupts` it stays ignored."""
    from mambaradix.cli.signals import as_interrupts

    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with as_interrupts():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, old)


def test_orphans_are_what_the_parent_death_signal_prevents() -> None:
    """The check above can fail: a forked child without the parent-death signal
    (plain multiprocessing) outlives a parent killed with SIGKILL."""
    program = textwrap.dedent(
        """
        import multiprocessing as mp, time
        p = mp.get_context("fork").Process(target=time.sleep, args=(30,), daemon=True)
        p.start()
        time.sleep(30)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", program], start_new_session=True, preexec_fn=as_from_a_terminal
    )
    try:
        assert wait_for(lambda: len(session_processes(proc.pid)) == 2, 20)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        time.sleep(0.3)
        assert len(session_processes(proc.pid)) == 1  # the orphan
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
