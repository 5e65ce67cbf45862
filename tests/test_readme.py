"""The README is tested: its Python blocks run as written, every command of its
code blocks is listed in its "Every command of this README" table, and each
runs (in the reduced form that table states) with the exit code it should;
the index server runs in the background while the `curl` commands ask it.
The times the README states are checked by `bench/readme_timings.py`, not here."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import readme  # noqa: E402

TEXT = readme.read()
ROWS = readme.command_rows(TEXT)
SLOW = (
    "engine",
    "bench/bench_",
    "replay_table",
    "evaluate.py",
    "--sequential",
    "swe-agent",
    "scripts/main.sh",
    "--instances",
    "--executor",
    "gpu_check",
)


def env() -> dict[str, str]:
    src = str(readme.REPO / "src")
    return {**os.environ, "PYTHONPATH": src, "MPLBACKEND": "Agg", "PYTHON": sys.executable}


def cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def test_readme_python_blocks_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)
    assert blocks, "the README has no Python example"
    for block in blocks:
        exec(compile(block, str(readme.README), "exec"), {})


def test_every_command_is_in_the_table() -> None:
    in_blocks = readme.bash_commands(TEXT)
    assert len(in_blocks) == len(set(in_blocks)), "a command appears twice"
    assert [r.command for r in ROWS] == in_blocks  # the table lists them in README order
    # The one command the test cannot run is the test suite itself.
    assert [r.command for r in ROWS if readme.how_tested(r).words is None] == [
        "bash scripts/test.sh"
    ]


def write_my_trace(cwd: Path) -> None:
    from mambaradix.replay.workloads import multi_turn, save_jsonl

    save_jsonl(multi_turn(sessions=16, seed=0), cwd / "my_trace.jsonl")


def params() -> list[object]:
    out = []
    for row in ROWS:
        tested = readme.how_tested(row)
        if tested.words is None or tested.role not in ("command", "gpu"):
            continue
        # Each is a subprocess that works for seconds (the slow tier runs them all), but
        # for a refusal of bad input, which exits at once (the default tier runs those).
        slow = any(s in row.command for s in SLOW) or tested.exit_code == 0
        marks = [pytest.mark.slow] if slow else []
        out.append(pytest.param(row, tested, marks=marks, id=row.command[:70]))
    return out


@pytest.mark.parametrize(("row", "tested"), params())
def test_readme_command(row: readme.Row, tested: readme.Tested, tmp_path: Path) -> None:
    assert tested.words is not None
    if "my_trace.jsonl" in row.command:
        write_my_trace(tmp_path)
    done = run(tested.words, tmp_path)
    gpu_here = tested.role == "gpu" and cuda()  # then the GPU check runs for real
    assert done.returncode == (0 if gpu_here else tested.exit_code), done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    if tested.stderr_has is not None and not gpu_here:
        assert tested.stderr_has in done.stderr
    if "replay" in tested.words and "--json" in tested.words:
        assert (tmp_path / tested.words[tested.words.index("--json") + 1]).is_file()


def run(words: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = readme.to_argv(words)
    return subprocess.run(argv, cwd=cwd, env=env(), capture_output=True, text=True, timeout=900)


WALL_CLOCK = ("replay_s", "requests_per_s")


def results(path: Path) -> list[dict[str, object]]:
    rows = json.loads(path.read_text())["results"]
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in rows]


@pytest.mark.slow
def test_readme_shards_and_their_merge(tmp_path: Path) -> None:
    (shard,) = [r for r in ROWS if readme.how_tested(r).role == "shard"]
    (merge,) = [r for r in ROWS if readme.how_tested(r).role == "merge"]
    words = readme.how_tested(shard).words or []
    assert "1/3" in words and "s1.json" in words
    for i in (1, 2, 3):
        each = [w.replace("1/3", f"{i}/3").replace("s1.json", f"s{i}.json") for w in words]
        done = run(each, tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
    done = run(readme.how_tested(merge).words or [], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    at = words.index("--shard")
    serial = [*words[:at], *words[at + 2 :]]
    serial[serial.index("s1.json")] = "serial.json"
    assert run(serial, tmp_path).returncode == 0
    assert results(tmp_path / "all.json") == results(tmp_path / "serial.json")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def on_port(words: list[str], port: int) -> list[str]:
    """The command on `port` instead of the README's 8090."""
    out = [w.replace("localhost:8090", f"localhost:{port}") for w in words]
    if "--port" in out:
        out[out.index("--port") + 1] = str(port)
    return out


@pytest.mark.slow  # an index process, ZMQ publishers and HTTP clients
def test_readme_index_server_and_its_clients(tmp_path: Path) -> None:
    (server,) = [r for r in ROWS if readme.how_tested(r).role == "server"]
    clients = [r for r in ROWS if readme.how_tested(r).role == "client"]
    assert [c.command.split()[2].split("/")[-1] for c in clients] == ["query", "workers", "dump"]
    words = readme.how_tested(server).words
    assert words is not None and "--duration" in words  # it stops by itself, whatever happens
    port = free_port()
    proc = subprocess.Popen(
        readme.to_argv(on_port(words, port)),
        cwd=tmp_path,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip().endswith(f"listening on http://127.0.0.1:{port}")
        answers = []
        for row in clients:
            argv = on_port(readme.how_tested(row).words or [], port)
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            assert done.returncode == 0, done.stderr
            answers.append(json.loads(done.stdout))
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    assert code == 130  # stopped by Ctrl-C, as every command says it
    # What the README shows under the query: nothing is cached on either worker yet.
    nothing = {"longest_matched": 0, "gpu": 0, "usable": 0, "tail_recompute": 0}
    assert answers[0]["block_size"] == 16
    assert {k: answers[0]["instances"][k] for k in ("1", "2")} == {"1": nothing, "2": nothing}
