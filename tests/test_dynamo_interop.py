"""NVIDIA Dynamo's standalone indexer (ai-dynamo-runtime 1.6.1) against ours, on one stream.

`tests/dynamo_driver.py` runs inside a network namespace made here (`unshare -n`, needs
root; Dynamo binds HTTP on 0.0.0.0, so nothing leaves the namespace), with Dynamo from
`.venv-dynamo` (`scripts/setup-dynamo.sh`; its pydantic pin keeps it out of `.venv`).
Without the namespace, the venv or the wheel this test fails, saying why: it is the
evidence behind the README's over-credit numbers, not an optional extra.

The stream: A (32 tokens, a state), A+B+C (80 tokens, a state); the prompt A+B+D (80
tokens) shares 64 tokens of KV with the tree but has a state only at 32; then A's state
is evicted while its KV stays. Expected, worked out from the tree by hand:
usable 32 then 0, KV overlap 64 throughout. Dynamo credits 64 both times: it drops the
"mamba" group (dynamo DEP #12169 is open), so its answer is the KV overlap alone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # NVIDIA Dynamo's indexer in its own venv and process

ROOT = Path(__file__).resolve().parents[1]
DYNAMO_PYTHON = ROOT / ".venv-dynamo" / "bin" / "python"
DRIVER = ROOT / "tests" / "dynamo_driver.py"


def run_in_namespace() -> dict:  # type: ignore[type-arg]
    if not DYNAMO_PYTHON.exists():
        pytest.fail(f"{DYNAMO_PYTHON} is missing: run scripts/setup-dynamo.sh")
    version = subprocess.run(
        [
            str(DYNAMO_PYTHON),
            "-c",
            "import importlib.metadata as m; print(m.version('ai-dynamo-runtime'))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if version.stdout.strip() != "1.6.1":
        pytest.fail(
            f"ai-dynamo-runtime 1.6.1 is not in .venv-dynamo: {version.stdout}{version.stderr}"
        )
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            pytest.fail(f"`{tool}` is missing: the test needs a private network namespace")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    )
    script = 'ip link set lo up && exec "$0" "$1" "$2"'
    cmd = ["unshare", "-n", "sh", "-c", script, sys.executable, str(DRIVER), str(DYNAMO_PYTHON)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    if done.returncode != 0:
        pytest.fail(
            f"the interop run failed (rc {done.returncode}; unshare -n needs root):\n"
            + done.stderr[-3000:]
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_dynamo_credits_kv_past_the_state_and_we_credit_the_usable_prefix() -> None:
    result = run_in_namespace()
    before, after = result["before"], result["after"]
    # The tree itself (the ground truth): a state at 32, KV to 64; then no state at all.
    assert before["tree"] == {"prefix_len": 32, "kv_hit_len": 64}
    assert after["tree"] == {"prefix_len": 0, "kv_hit_len": 64}
    # Dynamo 1.6.1: 64 credited when 32 are usable, and still 64 when none are.
    assert before["dynamo"] == {"1": 64, "2": 64}
    assert after["dynamo"] == {"1": 64, "2": 64}
    # Ours, from the vLLM-format stream (worker 1): exact; from SGLang's KV-only stream
    # (worker 2): the same overlap, and no state it could prove.
    assert before["ours"]["1"] == {"longest_matched": 64, "usable": 32, "tail_recompute": 32}
    assert after["ours"]["1"] == {"longest_matched": 64, "usable": 0, "tail_recompute": 64}
    for stage in (before, after):
        assert stage["ours"]["2"] == {"longest_matched": 64, "usable": 0, "tail_recompute": 64}
