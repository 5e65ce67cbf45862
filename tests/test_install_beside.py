"""The package installs into an environment that already has vLLM or SGLang: pip's
resolver, in dry-run mode (nothing is installed; a real vLLM install pulls a CUDA torch),
resolves this checkout with every extra together with `sglang==0.5.23`, then with
`vllm==0.33.0`, from the wheels' published metadata. The same question with the exact pins
the extras had before (torch==2.13.0, transformers==5.24.0) has no answer: the check can
fail. It asks PyPI for the metadata of a few hundred packages: 5-15 minutes, so it is in
neither tier; `pytest -m resolver` (scripts/check-install-beside.sh) runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.resolver

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ".[torch,text,replay,engine,events,dask]"
PEERS = {  # what each pins that our old extras pinned otherwise
    "sglang==0.5.23": {"torch": "2.14.1", "transformers": "5.19.0", "sentencepiece": "0.2.1"},
    "vllm==0.33.0": {"torch": "2.14.0"},
}


def resolve(*requirements: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
    argv += ["--quiet", "--report", "-", *requirements]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1200)


@pytest.mark.parametrize("peer", list(PEERS))
def test_resolves_beside(peer: str) -> None:
    done = resolve(EXTRAS, peer)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    got = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
    name, version = peer.split("==")
    assert got[name] == version
    assert "mambaradix" in got
    for dep, pinned in PEERS[peer].items():
        assert got[dep] == pinned  # the peer's pin, inside our range


def test_the_old_exact_pins_did_not() -> None:
    done = resolve("torch==2.13.0", "transformers==5.24.0", "sglang==0.5.23")
    assert done.returncode != 0
    assert "conflict" in done.stderr.lower() or "ResolutionImpossible" in done.stderr
