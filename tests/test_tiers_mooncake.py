"""MooncakeStore against a real Mooncake master, in a private network namespace.

Mooncake's transfer engine binds to the first non-loopback interface, so the test makes a
namespace (``ip netns``, needs root as CI has) holding a veth pair and runs
tests/mooncake_driver.py inside it: master, store checks, SIGKILLed writers. Skips only when
the optional extra (``mambaradix[mooncake]``) is not installed; any other failure fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ADDR = "10.233.0.1"
DRIVER = Path(__file__).with_name("mooncake_driver.py")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, timeout=30, capture_output=True)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mooncake") is None,
                    reason="optional extra mambaradix[mooncake] not installed")
def test_mooncake_store_in_a_network_namespace():
    netns = f"mrx-mc-{uuid.uuid4().hex[:8]}"
    _ip("netns", "add", netns)
    try:
        _ip("-n", netns, "link", "set", "lo", "up")
        _ip("-n", netns, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
        _ip("-n", netns, "addr", "add", f"{ADDR}/24", "dev", "v0")
        _ip("-n", netns, "link", "set", "v0", "up")
        _ip("-n", netns, "link", "set", "v1", "up")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "GLOG_minloglevel": "2"}
        out = subprocess.run(
            ["ip", "netns", "exec", netns, sys.executable, str(DRIVER), ADDR, "8"],
            capture_output=True, text=True, timeout=300, env=env,
        )
    finally:
        _ip("netns", "del", netns)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["too_big_code"] < 0
    assert report["torn_reads"]["reads"] > 0 and report["torn_reads"]["removed"] == 0
    assert report["crash"]["rounds"] == 8 and report["crash"]["acks"] >= 8
    assert "unreachable" in report["unreachable"]
    stats = report["stats"]
    assert stats["corrupt"] == 1 and stats["put_rejected"] == 1 + report["full_refused"]
    print(json.dumps(report))
