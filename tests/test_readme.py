"""The README and the docs are tested: their Python blocks run as written, every command of
their code blocks is listed in `docs/commands.md` ("Every command") under its document, and
each runs (in the reduced form that table states) with the exit code it should; the index
server runs in the background while the `curl` commands ask it. The README's tables are
copies of the docs' (so a number is stated once), and its links lead somewhere.
The times they state are checked by `bench/readme_timings.py`, not here; the site is built
by `tests/test_docs.py`."""

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
from test_cli_interrupt import as_from_a_terminal  # noqa: E402

DOCS = readme.documents()
TABLES = readme.command_tables()
ROWS = readme.command_rows()
SLOW = (
    "engine",
    "bench/bench_",
    "bench/tuning_pairs",
    "replay_table",
    "evaluate.py",
    "--sequential",
    "swe-agent",
    "scripts/main.sh",
    "--instances",
    "--executor",
    "my_model/",
    "chitchat",
    "sglang-0.5.15.post1",
    "bench/sglang_0523_rules",
    "bench/vllm_differential",
    "--trace mooncake",
    "gpu_check",
)
SLOW_COMMANDS = (".venv/bin/mambaradix replay --memory 20",)  # the full trace's queues
# What a command looks like, to catch one left in a block that is not ```bash.
SHELLS = ("sh", "shell", "console", "zsh", "shell-session", "bash-session")
COMMAND_LIKE = re.compile(r"^\s*(\$ |\.venv/bin/|bash |python|pip |curl |/usr/bin/time )")


def env() -> dict[str, str]:
    src = str(readme.REPO / "src")
    return {**os.environ, "PYTHONPATH": src, "MPLBACKEND": "Agg", "PYTHON": sys.executable}


def cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def python_blocks() -> list[object]:
    out = []
    for doc, text in DOCS.items():
        blocks = [body for lang, body in readme.fences(text) if lang == "python"]
        for i, block in enumerate(blocks):
            marks = [pytest.mark.slow] if "mambaradix.engine" in block else []
            out.append(pytest.param(doc, block, marks=marks, id=f"{doc}:{i + 1}"))
    return out


def test_the_readme_has_a_python_example() -> None:
    assert any(lang == "python" for lang, _ in readme.fences(DOCS["README.md"]))


@pytest.mark.parametrize(("doc", "block"), python_blocks())
def test_python_blocks_run(doc: str, block: str) -> None:
    exec(compile(block, str(readme.REPO / doc), "exec"), {})


def test_every_command_is_in_the_table() -> None:
    for doc, text in DOCS.items():
        in_blocks = readme.bash_commands(text)
        assert len(in_blocks) == len(set(in_blocks)), f"{doc}: a command appears twice"
        # the table lists them under the document, in its order
        listed = [r.command for r in TABLES.get(doc, [])]
        assert listed == in_blocks, f"{doc}: the table lists {listed}, its blocks {in_blocks}"
    assert set(TABLES) <= set(DOCS), f"sections for missing documents: {set(TABLES) - set(DOCS)}"
    for doc, rows in TABLES.items():
        for row in rows:  # a command found in several documents is tested one way
            first = next(r for r in ROWS if r.command == row.command)
            assert (row.test, row.time) == (first.test, first.time), (doc, row.command)
    # The one command the test cannot run is the test suite itself; the others it does
    # not run here run in the suite (pytest files, the docs build).
    tested = {r.command: readme.how_tested(r) for r in ROWS}
    unrun = [c for c, how in tested.items() if how.words is None and how.role != "suite"]
    assert unrun == ["bash scripts/test.sh"]


def test_commands_run_by_the_suite_name_its_files() -> None:
    suite = [r for r in ROWS if readme.how_tested(r).role == "suite"]
    assert suite, "no command is marked as run by the test suite"
    for row in suite:
        named = re.findall(r"tests/\w+\.py", row.command + " " + row.test)
        assert named, f"{row.command}: names no test file"
        for path in named:
            assert (readme.REPO / path).is_file(), f"{row.command}: {path} does not exist"


def test_no_command_hides_outside_a_bash_block() -> None:
    for doc, text in DOCS.items():
        for lang, body in readme.fences(text):
            assert lang not in SHELLS, f"{doc}: a ```{lang} block: write commands in ```bash"
            if lang not in ("bash", "python"):
                found = [line for line in body.splitlines() if COMMAND_LIKE.match(line)]
                assert not found, f"{doc}: commands in a ```{lang} block: {found}"


def test_the_readme_tables_are_the_docs_tables() -> None:
    """A number is stated once: each table of the README is a table of a docs page."""
    docs_text = "\n".join(text for doc, text in DOCS.items() if doc != "README.md")
    tables = re.findall(r"(?:^\|.*\|\n)+", DOCS["README.md"], flags=re.M)
    results = [t for t in tables if "|---|" in t and not t.startswith("| path |")]
    assert len(results) == 2, "the README has one results and one performance table"
    for table in results:
        assert table in docs_text, f"not in the docs:\n{table}"


def slug(heading: str) -> str:
    """Python-Markdown's default heading id (what mkdocs links to)."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"[-\s]+", "-", text).strip("-")


def test_the_readme_links_lead_somewhere() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#([^)]+))?\)", DOCS["README.md"])
    assert links
    for target, anchor in links:
        if target.startswith("http"):
            continue
        assert (readme.REPO / target).is_file(), f"README links to missing {target}"
        if anchor:
            headings = re.findall(r"^#+ (.*)$", DOCS[target], flags=re.M)
            assert anchor in {slug(h) for h in headings}, f"README links to {target}#{anchor}"


def test_the_readme_is_short() -> None:
    assert len(DOCS["README.md"].splitlines()) <= 350


def write_my_trace(cwd: Path) -> None:
    from mambaradix.replay.workloads import multi_turn, save_jsonl

    save_jsonl(multi_turn(sessions=16, seed=0), cwd / "my_trace.jsonl")


def copy_my_model(cwd: Path) -> None:
    """`my_model/`: a model's own config.json (Nemotron-Nano-9B-v2's, from transformers)."""
    config = readme.REPO / "tests" / "data" / "hf_configs" / "Nemotron-Nano-9B-v2" / "config.json"
    (cwd / "my_model").mkdir()
    (cwd / "my_model" / "config.json").write_bytes(config.read_bytes())


def params() -> list[object]:
    out = []
    for row in ROWS:
        tested = readme.how_tested(row)
        if tested.words is None or tested.role not in ("command", "gpu"):
            continue
        # Each is a subprocess that works for seconds (the slow tier runs them all), but
        # for a refusal of bad input, which exits at once (the default tier runs those).
        slow = (
            any(s in row.command for s in SLOW)
            or row.command in SLOW_COMMANDS
            or tested.exit_code == 0
        )
        marks = [pytest.mark.slow] if slow else []
        out.append(pytest.param(row, tested, marks=marks, id=row.command[:90]))
    return out


@pytest.mark.parametrize(("row", "tested"), params())
def test_readme_command(row: readme.Row, tested: readme.Tested, tmp_path: Path) -> None:
    assert tested.words is not None
    if "my_trace.jsonl" in row.command:
        write_my_trace(tmp_path)
    if "my_model/" in row.command:
        copy_my_model(tmp_path)
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
        preexec_fn=as_from_a_terminal,  # SIGINT not ignored, however the suite started
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
