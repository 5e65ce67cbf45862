"""A throwaway redis-server for tests: loopback, a free port, a temp dir, no persistence.

Debian's ``redis-server`` (scripts/setup.sh installs it). A missing binary fails the test
with the install command: it never skips, so CI cannot pass without it.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

START_WAIT_S = 10.0
STOP_WAIT_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def redis_server(tmp_dir: Path, *extra: str) -> Iterator[int]:
    """Start redis-server on 127.0.0.1:<free port>, yield the port, stop it."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server not found: apt-get install -y redis-server "
                    "(scripts/setup.sh does this)")
    port = free_port()
    tmp_dir.mkdir(parents=True, exist_ok=True)
    cmd = [binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(tmp_dir),
           "--save", "", "--appendonly", "no", "--daemonize", "no", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        _wait_ready(port, proc)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_WAIT_S)


def _wait_ready(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode} on port {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2) as s:
            s.sendall(b"PING\r\n")
            if s.recv(16).startswith(b"+PONG"):
                return
        time.sleep(0.02)
    raise RuntimeError(f"redis-server on port {port} not ready after {START_WAIT_S} s")
