"""What a new user trips over in the CLI, each checked in-process on a 3-request trace:
the plot without matplotlib (`--no-plot`, and a hint before any work), options that do
nothing, outputs that would overwrite an input, `-` for stdout, `--version`, "did you
mean", and the defaults and choices in `--help`."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from mambaradix import __version__
from mambaradix._build import loaded_build
from mambaradix.cli import main
from test_replay_cli import RECORDS

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--policy", "sglang", "--memory", "1", "--workers", "1", "--no-progress"]


@pytest.fixture
def trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # the default plot would go to ./out
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path


def no_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the sweep started")

    monkeypatch.setattr("mambaradix.replay.sweep.sweep", refuse)


def without_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError


# ------------------------------------------------------------------ the plot


def test_no_plot_runs_without_matplotlib(
    trace: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    without_matplotlib(monkeypatch)
    out = trace.parent / "r.json"
    assert main(["replay", "--trace", str(trace), *TINY, "--no-plot", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["results"][0]["policy"] == "sglang"
    assert not (trace.parent / "out").exists()  # no plot anywhere
    assert "plot:" not in capsys.readouterr().out


@pytest.mark.parametrize("plot", [[], ["--plot", "p.png"], ["--plot", "-"]])
def test_missing_matplotlib_is_said_before_the_sweep(
    trace: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    plot: list[str],
) -> None:
    without_matplotlib(monkeypatch)
    no_sweep(monkeypatch)
    assert main(["replay", "--trace", str(trace), *TINY, *plot]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mambaradix replay: error: the plot needs matplotlib")
    assert "pip install 'mambaradix[replay]'" in err and "--no-plot" in err
    assert "\n" not in err


def test_plot_and_no_plot_contradict(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--trace", str(trace), *TINY, "--plot", "p.png", "--no-plot"]) == 2
    assert "--plot and --no-plot contradict each other" in capsys.readouterr().err


# --------------------------------------------------------- options that do nothing


def test_page_size_on_a_block_trace_is_warned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = tmp_path / "blocks.jsonl"  # Mooncake's format: 512-token blocks
    row = {"input_length": 1000, "output_length": 5, "hash_ids": [1, 2]}
    blocks.write_text("".join(json.dumps(row | {"timestamp": t}) + "\n" for t in (0, 1000)))
    argv = ["replay", "--trace", str(blocks), *TINY, "--page-size", "16", "--no-plot"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert (
        "warning: --page-size 16 has no effect on blocks: its 512-token blocks are "
        "whole pages already" in err
    )


def test_page_size_on_a_token_trace_is_not_warned(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["replay", "--trace", str(trace), *TINY, "--no-plot", "--page-size", "16"]
    argv[argv.index("sglang")] = "sglang-extra-buffer"
    assert main(argv) == 0
    assert "warning" not in capsys.readouterr().err


def test_workers_with_an_executor_is_warned(
    trace: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("mambaradix.cli.replay.load_trace", lambda *a: _stop())
    argv = ["replay", "--trace", str(trace), *TINY, "--no-plot", "--executor", "dask://h:1"]
    with pytest.raises(KeyboardInterrupt):
        main([*argv, "--debug"])
    assert "warning: --workers 1 has no effect with --executor" in capsys.readouterr().err


def _stop() -> None:
    raise KeyboardInterrupt


# ------------------------------------------------- outputs: never an input; - is stdout


def test_replay_json_to_stdout(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--trace", str(trace), *TINY, "--no-plot", "--json", "-"]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)  # stdout holds the JSON alone
    assert data["results"][0]["policy"] == "sglang"
    assert "tok hit" in err  # the table went to stderr
    assert not Path("-").exists()


def test_replay_plot_to_stdout(trace: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    assert main(["replay", "--trace", str(trace), *TINY, "--plot", "-"]) == 0
    out, err = capsysbinary.readouterr()
    assert out.startswith(b"\x89PNG\r\n\x1a\n")  # the PNG signature
    assert b"tok hit" in err
    assert not Path("-").exists()


def test_replay_both_to_stdout_refused(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["replay", "--trace", str(trace), *TINY, "--plot", "-", "--json", "-"]
    assert main(argv) == 2
    assert "--json - and --plot - both ask for stdout" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_replay_never_writes_onto_its_trace(
    trace: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    before = trace.read_text()
    target = trace.with_suffix(".png") if flag == "--plot" else trace
    if flag == "--plot":
        target.symlink_to(trace)  # a link to the trace is the trace
    assert main(["replay", "--trace", str(trace), *TINY, flag, str(target)]) == 2
    assert "the run would overwrite it" in capsys.readouterr().err
    assert trace.read_text() == before


def shards(trace: Path) -> list[str]:
    names = []
    for i in (1, 2):
        name = str(trace.parent / f"s{i}.json")
        argv = ["replay", "--trace", str(trace), *TINY, "--shard", f"{i}/2", "--json", name]
        argv[argv.index("1")] = "1,2"  # two memory points: a cell each
        assert main(argv) == 0
        names.append(name)
    return names


@pytest.mark.parametrize("spelling", ["same", "dot", "link"])
def test_merge_never_writes_onto_a_shard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spelling: str
) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text("shard a")  # refused before anything is read: any content will do
    b.write_text("shard b")
    (tmp_path / "d").mkdir()
    out = {"same": str(b), "dot": f"{tmp_path}/d/../b.json", "link": str(tmp_path / "l.json")}
    if spelling == "link":
        (tmp_path / "l.json").symlink_to(b)
    assert main(["merge", str(a), str(b), "--json", out[spelling]]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"mambaradix merge: error: --json {out[spelling]} is the shard file {b}: the run "
        "would overwrite it"
    )
    assert (a.read_text(), b.read_text()) == ("shard a", "shard b")


def test_merge_json_to_stdout(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parts = shards(trace)
    capsys.readouterr()
    assert main(["merge", *parts, "--json", str(trace.parent / "m.json")]) == 0
    capsys.readouterr()
    assert main(["merge", *parts, "--json", "-"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == json.loads((trace.parent / "m.json").read_text())
    assert "tok hit" in err and not Path("-").exists()


# ------------------------------------------------------------- --version, did you mean


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    pyproject = (ROOT / "pyproject.toml").read_text()
    declared = re.search(r'^version = "([^"]+)"', pyproject, re.M)
    assert declared is not None
    # the build is the one the core's module files are (tests/test_compiled.py checks it)
    build = loaded_build()
    assert build in ("compiled", "pure")
    assert capsys.readouterr().out == f"mambaradix {declared.group(1)} ({build} core)\n"
    assert __version__ == declared.group(1)


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["relpay"], "did you mean 'replay'?"),
        (["engine", "--strategy", "extra-buffer"], "did you mean 'extra_buffer'?"),
        (["replay", "--policy", "mambardix"], "did you mean 'mambaradix'?"),
        (["replay", "--model", "nemotron-h8b"], "did you mean 'nemotron-h-8b'?"),
        (["replay", "--trace", "moncake"], "did you mean 'mooncake'?"),
    ],
)
def test_did_you_mean(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    hint: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    no_sweep(monkeypatch)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(hint) and "\n" not in err


def test_no_guess_for_a_name_far_from_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["replay", "--policy", "zzzz"]) == 2
    assert "did you mean" not in capsys.readouterr().err


# ------------------------------------------------------------------------ --help


def help_text(capsys: pytest.CaptureFixture[str], command: str) -> str:
    assert main([command, "--help"]) == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines


def test_replay_help_lists_the_choices_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    from mambaradix.geometry.profile import PROFILES
    from mambaradix.policies import POLICIES
    from mambaradix.replay.workloads import BUNDLED

    text = help_text(capsys, "replay")
    for name in [*PROFILES, *POLICIES, *BUNDLED]:
        assert re.search(rf"[ :,]{re.escape(name)}[ ,)]", text), name
    for default in (
        "(default: mooncake)",
        "(default: nemotron-h-8b)",
        "(default: 20,40,80,160)",
        "(default: 2400)",
        "(default: 20)",
        "(default: 8192)",
        "(default: 1)",
    ):
        assert default in text


@pytest.mark.parametrize(
    ("command", "defaults"),
    [
        ("demo", ["--sessions SESSIONS conversations (default: 24)", "(default: 0)"]),
        ("engine", ["(default: 32)", "--strategy {no_buffer,extra_buffer} SGLang's mamba"]),
        ("index", ["tokens per block (default: 16)", "(default: 2)"]),
    ],
)
def test_other_commands_show_their_defaults(
    capsys: pytest.CaptureFixture[str], command: str, defaults: list[str]
) -> None:
    text = help_text(capsys, command)
    for default in defaults:
        assert default in text
