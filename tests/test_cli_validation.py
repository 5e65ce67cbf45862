"""Every command refuses bad input before any work: exit code 2, exactly one
line on stderr naming the option, nothing written, no traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mambaradix.cli import main

TINY = {"session_id": 0, "turn_id": 0, "ts": 0.0, "input_tokens": [1, 2, 3], "output_tokens": [4]}


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory (the default plot goes to out/ inside it)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.jsonl").write_text(json.dumps(TINY) + "\n")
    (tmp_path / "a_file").write_text("x")
    return tmp_path


def refused(cwd: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the command; assert exit 2, one stderr line, nothing written; return the line."""
    before = sorted(p.name for p in cwd.rglob("*"))
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and lines[0].startswith(f"mambaradix {argv[0]}: error: ")
    assert sorted(p.name for p in cwd.rglob("*")) == before  # nothing written
    return lines[0]


REPLAY_NUMBERS = [
    ("--memory", "0", "must be > 0"),
    ("--memory", "-5", "must be > 0"),
    ("--memory", "nan", "finite"),
    ("--memory", "inf", "finite"),
    ("--memory", "ten", "expected a number"),
    ("--memory", "10,,20", "separated by commas"),
    ("--memory", "10,10", "10.0 given more than once"),
    ("--state-fraction", "0", "must be > 0 and < 1"),
    ("--state-fraction", "1", "must be > 0 and < 1"),
    ("--state-fraction", "nan", "finite"),
    ("--prefill-tflops", "0", "must be > 0"),
    ("--prefill-tflops", "-1", "must be > 0"),
    ("--prefill-tflops", "nan", "finite"),
    ("--prefill-tflops", "inf", "finite"),
    ("--tpot-ms", "-1", "must be >= 0"),
    ("--tpot-ms", "nan", "finite"),
    ("--chunk-tokens", "0", "must be >= 1"),
    ("--chunk-tokens", "1.5", "whole number"),
    ("--rate", "0", "must be > 0"),
    ("--rate", "-2", "must be > 0"),
    ("--rate", "inf", "finite"),
    ("--limit", "0", "must be >= 1"),
    ("--limit", "-3", "must be >= 1"),
    ("--limit", "2.5", "whole number"),
    ("--limit", "1e3", "whole number"),
    ("--workers", "0", "must be >= 1"),
    ("--workers", "1.0", "whole number"),
    ("--page-size", "0", "must be >= 1"),
    ("--page-size", "1.5", "whole number"),
    ("--track-interval", "0", "must be >= 1"),
    ("--policy", "sglang,sglang", "sglang given more than once"),
    ("--policy", "sglang,,vllm", "separated by commas"),
]


@pytest.mark.parametrize(("option", "value", "says"), REPLAY_NUMBERS)
def test_replay_numbers(
    cwd: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, says: str
) -> None:
    line = refused(cwd, capsys, "replay", "--trace", "tiny.jsonl", option, value)
    assert f"argument {option}: " in line and says in line


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--policy", "sglang,lru-magic"], "--policy: unknown policy lru-magic; choose from"),
        (["--policy", "sglang-used"], "--policy: policy 'sglang-used' was retired: it modelled"),
        (["--model", "gpt-17"], "--model: unknown model profile 'gpt-17'; known: jamba"),
        (["--trace", "nope.jsonl"], "--trace: 'nope.jsonl' is neither a bundled workload"),
        (["--sequential", "--state-fraction", "0.3"], "--state-fraction has no effect with"),
        (["--plot", "r.foo"], "--plot r.foo: unsupported file extension; name a directory or"),
        (["--plot", "r"], "--plot r: no file extension"),
        (["--plot", "a_file/r.png"], "--plot a_file/r.png: a_file is a file"),
        (["--json", "a_file/deeper/r.json"], "--json a_file/deeper/r.json: a_file is a file"),
        (["--json", "."], "--json . is a directory"),
        (["--json", "same.png", "--plot", "same.png"], "--json and --plot name the same file"),
        (
            ["--page-size", "16", "--policy", "sglang-extra-buffer,sglang"],
            "--policy sglang: no_buffer needs --page-size 1 on a token-level trace, got 16; "
            "extra_buffer policies (sglang-extra-buffer) take any page size",
        ),
        (
            ["--page-size", "16", "--track-interval", "100"],
            "--track-interval 100 must be a multiple of --page-size 16, as SGLang requires",
        ),
        (
            ["--track-interval", "512", "--policy", "sglang,mambaradix"],
            "--track-interval has no effect: none of the policies uses extra_buffer",
        ),
        (["--vllm-retention", "often"], "--vllm-retention must be a number of tokens or 'dense'"),
        (
            ["--vllm-retention", "1000"],
            "--vllm-retention 1000 must be a multiple of vLLM's block (1040 tokens for",
        ),
        (
            ["--vllm-retention", "dense", "--policy", "sglang"],
            "--vllm-retention has no effect: --policy does not run vllm",
        ),
        (
            ["--sequential", "--page-size", "16", "--policy", "sglang-extra-buffer"],
            "--page-size 16 needs the split pools: sequential",
        ),
        (["--instances", "2", "--plot", "r.png"], "--plot has no effect with --instances"),
        (
            ["--instances", "2", "--policy", "marconi,marconi-oracle"],
            "--policy marconi-oracle (a run per alpha) has no --instances form",
        ),
        (["--policy", "marconi@0.5"], "--policy: unknown policy marconi@0.5; choose from"),
    ],
)
def test_replay_choices_and_paths(
    cwd: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    line = refused(cwd, capsys, "replay", "--trace", "tiny.jsonl", "--no-progress", *args)
    assert says in line


def test_replay_unwritable_directory(cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # /proc refuses new files even for root (os.access would say yes to root)
    line = refused(cwd, capsys, "replay", "--trace", "tiny.jsonl", "--json", "/proc/x/r.json")
    assert "--json /proc/x/r.json: cannot create files in /proc" in line


def test_malformed_trace_names_the_line(cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (cwd / "bad.jsonl").write_text(json.dumps(TINY) + "\n" + '{"session_id": 1}\n')
    line = refused(cwd, capsys, "replay", "--trace", "bad.jsonl", "--no-progress")
    assert "--trace: bad.jsonl, line 2: missing field 'input_tokens'" in line


def test_replay_page_must_divide_the_blocks(cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(cwd, capsys, "replay", "--limit", "5", "--page-size", "96", "--no-progress")
    assert line.endswith("--page-size 96 must divide the trace's 512-token blocks")


def test_replay_memory_too_small_for_any_request(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # nemotron-h-8b: a KV unit is 512 tokens x 16,384 B = 8,388,608 B; a state
    # 102,125,568 B. 0.001 GB holds neither. Worked out from the file: a
    # request of P blocks and N = ceil(output_length / 512) output blocks is
    # admitted alone when P + N + 1 stays below the pool: it needs P + N + 2
    # units. The largest of the first 50 is the one with the most.
    from mambaradix.geometry.profile import get_profile
    from mambaradix.replay.workloads._io import data_file, json_lines

    rows = [obj for _, obj in json_lines(data_file("mooncake", "conversation_trace.jsonl.gz"))][:50]
    units = [len(r["hash_ids"]) + max(1, -(-r["output_length"] // 512)) + 2 for r in rows]
    big = max(range(50), key=lambda i: (units[i], -i))
    prof = get_profile("nemotron-h-8b")
    f = 0.9 / 1.9
    kv_bytes = units[big] * 512 * prof.kv_bytes_per_token
    need_gb = max(kv_bytes / (1 - f), 2 * prof.state_bytes / f) / 1e9
    args = ["--limit", "50", "--memory", "0.001", "--policy", "sglang,mambaradix"]
    line = refused(cwd, capsys, "replay", *args, "--no-progress")
    assert "--memory 0.001 GB holds 0 KV units of 512 tokens and 0 states: no request fits" in line
    assert f"the largest, request {big} (session {big}, turn 0: " in line
    assert f"needs a pool of {units[big]} KV units" in line
    gb = float(line.split("use at least ")[1].split(" GB")[0])
    assert need_gb <= gb < need_gb + 0.02


def test_replay_too_few_states_for_extra_buffer(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # marconi-7b at 0.2 GB, default split: int(0.2e9 x 9/19) // 26,804,224 B = 3
    # states; an extra_buffer request that reuses a state holds it, its copy
    # and two track slots.
    from mambaradix.geometry.profile import get_profile

    states = int(0.2e9 * 0.9 / 1.9) // get_profile("marconi-7b").state_bytes
    assert states == 3
    args = ["--model", "marconi-7b", "--memory", "0.2", "--policy", "sglang,sglang-extra-buffer"]
    line = refused(cwd, capsys, "replay", "--trace", "tiny.jsonl", *args)
    assert "holds 1,606 KV tokens and 3 states: policy sglang-extra-buffer (extra_buffer) " in line
    assert "needs 4 states for a request that reuses one" in line


def test_replay_memory_advice_serves_every_policy_of_the_run(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # marconi-7b at 0.03 GB, default split: int(0.03e9 x 9/19) // 26,804,224 B = 0
    # states, too few for sglang (first in the list, 2 states). The advice must be
    # the memory that serves the whole run: sglang-extra-buffer needs 4 states,
    # 4 x 26,804,224 / (9/19) B, so at least 0.23 GB; that much runs.
    from mambaradix.geometry.profile import get_profile

    need = 4 * get_profile("marconi-7b").state_bytes / (0.9 / 1.9) / 1e9
    args = ["--model", "marconi-7b", "--policy", "sglang,sglang-extra-buffer", "--no-progress"]
    line = refused(cwd, capsys, "replay", "--trace", "tiny.jsonl", "--memory", "0.03", *args)
    assert "policy sglang (no_buffer) needs 2 states" in line
    gb = float(line.split("use at least ")[1].split(" GB")[0])
    assert need <= gb < need + 0.02
    assert main(["replay", "--trace", "tiny.jsonl", "--memory", f"{gb:g}", *args]) == 0


def test_replay_state_fraction_so_small_no_memory_serves(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 2 states of 26.8 MB at a state fraction of 1e-305 need 5.4e7 / 1e-305 B,
    # beyond any float: refused as bad input like any other too-small point.
    args = ["--model", "marconi-7b", "--memory", "10", "--state-fraction", "1e-305"]
    line = refused(cwd, capsys, "replay", "--trace", "tiny.jsonl", "--policy", "sglang", *args)
    assert "and 0 states: policy sglang (no_buffer) needs 2 states" in line
    assert "no memory size serves every request (with --state-fraction 1e-305)" in line


def test_replay_json_to_a_fifo_is_refused_and_left_alone(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A device, a FIFO or a socket is not a file the output can be renamed onto:
    # doing so (as root) replaced /dev/null with a regular file.
    fifo = cwd / "pipe.json"
    os.mkfifo(fifo)
    line = refused(cwd, capsys, "replay", "--trace", "tiny.jsonl", "--json", str(fifo))
    assert line.endswith(f"--json {fifo} is not a regular file")
    assert fifo.is_fifo()


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_replay_output_onto_its_own_trace_is_refused(
    cwd: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    # The trace file given as an output (directly or through a link) would be
    # overwritten by the results: refused, and the trace left as it was.
    before = (cwd / "tiny.jsonl").read_bytes()
    link = "trace.json" if flag == "--json" else "trace.png"
    (cwd / link).symlink_to(cwd / "tiny.jsonl")
    line = refused(cwd, capsys, "replay", "--trace", "tiny.jsonl", flag, link)
    assert line.endswith(f"{flag} {link} is the --trace file: the run would overwrite it")
    assert (cwd / "tiny.jsonl").read_bytes() == before


def test_replay_json_through_a_symlink_writes_its_target(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = cwd / "results" / "r.json"
    target.parent.mkdir()
    target.write_text("old")
    (cwd / "link.json").symlink_to(target)
    argv = ["replay", "--trace", "tiny.jsonl", "--memory", "1", "--json", "link.json"]
    assert main([*argv, "--policy", "sglang", "--no-progress"]) == 0
    assert (cwd / "link.json").is_symlink()
    assert json.loads(target.read_text())["trace"]["requests"] == 1


def test_replay_plot_format_whose_program_is_missing(
    cwd: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # matplotlib writes .pgf by running xelatex: with no xelatex on PATH the
    # plot could only fail after the sweep, so it is refused before it.
    monkeypatch.setenv("PATH", str(cwd))
    line = refused(cwd, capsys, "replay", "--trace", "tiny.jsonl", "--plot", "r.pgf")
    assert line.endswith("--plot r.pgf: matplotlib writes .pgf with xelatex, not found on PATH")


def test_replay_page_size_leaves_out_no_buffer_policies(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the default: all but marconi-oracle and the older SGLang release's rows
    from mambaradix.policies import DEFAULT_RUN

    args = ["replay", "--trace", "tiny.jsonl", "--model", "marconi-7b", "--memory", "1"]
    args += ["--page-size", "16", "--workers", "1", "--no-progress", "--json", "r.json"]
    assert main(args) == 0
    err = capsys.readouterr().err.strip().splitlines()
    # vllm keeps running: its tree's page is vLLM's block whatever --page-size says
    no_buffer = [p for p in DEFAULT_RUN if p not in ("sglang-extra-buffer", "vllm")]
    why = "no_buffer needs --page-size 1 on a token-level trace, got 16"
    assert err == [f"warning: --page-size 16: left out {', '.join(no_buffer)} ({why})"]
    data = json.loads((cwd / "r.json").read_text())
    assert [r["policy"] for r in data["results"]] == ["sglang-extra-buffer", "vllm"]
    assert data["policies_left_out"] == dict.fromkeys(no_buffer, why)
    assert data["results"][0]["config"]["page_size"] == 16
    assert data["results"][0]["config"]["track_interval"] == 256


DEMO = [
    (["--sessions", "0"], "argument --sessions: must be >= 1"),
    (["--turns", "-1"], "argument --turns: must be >= 1"),
    (["--kv-tokens", "0"], "argument --kv-tokens: must be >= 1"),
    (["--state-slots", "1"], "argument --state-slots: must be >= 2"),
    (["--chunk", "0"], "argument --chunk: must be >= 1"),
    (["--seed", "-1"], "argument --seed: must be >= 0"),
    (["--sessions", "2.5"], "argument --sessions: expected a whole number"),
    (
        ["--kv-tokens", str(10**14)],
        "--sessions 24, --turns 6, --kv-tokens 100,000,000,000,000 and --state-slots 48 need at",
    ),
    (["--sessions", str(10**9)], "--sessions 1,000,000,000, --turns 6, --kv-tokens 60,000 and"),
]


@pytest.mark.parametrize(("args", "says"), DEMO)
def test_demo_numbers(
    cwd: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    assert says in refused(cwd, capsys, "demo", *args)


def test_demo_shows_progress_over_its_requests(
    cwd: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a demo of many sessions runs for seconds: a bar counts its requests, both
    # behaviours (the bar appears after a second; here it is asked for at once)
    import mambaradix.replay.progress
    from mambaradix.demo import demo_sessions

    monkeypatch.setattr(mambaradix.replay.progress, "DELAY_S", 0.0)
    requests = len(demo_sessions(2, 2, 0))
    assert main(["demo", "--sessions", "2", "--turns", "2"]) == 0
    err = capsys.readouterr().err
    assert f"{2 * requests}/{2 * requests}" in err and "serving" in err
    assert main(["demo", "--sessions", "2", "--turns", "2", "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_demo_kv_pool_too_small(cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mambaradix.demo import demo_sessions

    # Admission wants prompt + answer + 1 strictly below the pool.
    work = demo_sessions(2, 2, 0)
    i = max(range(len(work)), key=lambda k: len(work[k][0]) + len(work[k][1]))
    need = len(work[i][0]) + len(work[i][1]) + 2
    line = refused(cwd, capsys, "demo", "--sessions", "2", "--turns", "2", "--kv-tokens", "100")
    assert f"--kv-tokens 100 is too small: request {i} (" in line
    assert f"needs a pool of {need:,}; use --kv-tokens >= {need:,}" in line
    assert main(["demo", "--sessions", "2", "--turns", "2", "--kv-tokens", str(need)]) == 0
    assert "A tiny tree" in capsys.readouterr().out


ENGINE = [
    (["--sessions", "0"], "argument --sessions: must be >= 1"),
    (["--max-new-tokens", "0"], "argument --max-new-tokens: must be >= 1"),
    (["--kv-tokens", "-1"], "argument --kv-tokens: must be >= 1"),
    (["--state-slots", "1"], "argument --state-slots: must be >= 2"),
    (["--chunk-size", "0"], "argument --chunk-size: must be >= 1"),
    (["--max-running", "0"], "argument --max-running: must be >= 1"),
    (["--threads", "0"], "argument --threads: must be >= 1"),
    # torch would try to start them (MemoryError), or overflow (2**31)
    (["--threads", "100000"], "--threads 100000 is more than the "),
    (["--threads", str(2**31)], "--threads 2147483648 is more than the "),
    (["--seed", "-1"], "argument --seed: must be >= 0"),
    (["--seed", str(2**64)], "argument --seed: must be < 2**64"),  # torch.manual_seed's range
    (["--model", "no-such-model"], "--model: unknown model 'no-such-model'; presets:"),
    (["--workload", "mooncake"], "--workload mooncake is a block-level trace"),
    (["--workload", "nope"], "--workload: 'nope' is neither a bundled workload"),
    (["--page-size", "16"], "--page-size 16 needs --strategy extra_buffer"),
    (["--strategy", "paged"], "argument --strategy: invalid choice: 'paged'"),
    (["--compat", "vllm"], "argument --compat: invalid choice: 'vllm'"),
    (["--track-interval", "64"], "--track-interval has no effect without --strategy extra_buffer"),
    (
        ["--strategy", "extra_buffer", "--state-slots", "3"],
        "--state-slots 3 is too small for extra_buffer: a request that reuses a cached state "
        "holds it, its copy and two track slots (4)",
    ),
    (
        ["--strategy", "extra_buffer", "--page-size", "16", "--kv-tokens", "1000"],
        "--kv-tokens 1000 must be a multiple of --page-size 16",
    ),
    (
        ["--strategy", "extra_buffer", "--page-size", "64", "--chunk-size", "96"],
        "--chunk-size 96 must be a multiple of --page-size 64",
    ),
    (
        ["--strategy", "extra_buffer", "--page-size", "16", "--track-interval", "40"],
        "--track-interval 40 must be a multiple of --page-size 16",
    ),
    # no machine has a 100th GPU: without CUDA "no usable CUDA device", with it "there are N"
    (["--device", "cuda:99"], "--device cuda:99: "),
    (["--device", "tpu"], "--device tpu: "),
    (["--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
    (
        ["--deterministic", "--strategy", "extra_buffer"],
        "--deterministic needs --strategy no_buffer",
    ),
]


@pytest.mark.parametrize(("args", "says"), ENGINE)
def test_engine_inputs(
    cwd: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    assert says in refused(cwd, capsys, "engine", *args)


@pytest.mark.slow  # builds a model
def test_engine_refuses_a_directory_it_cannot_serve(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_api_validation import save_llama

    (cwd / "empty").mkdir()
    line = refused(cwd, capsys, "engine", "--model", "empty", "--no-progress")
    assert line.startswith("mambaradix engine: error: --model empty: model 'empty' cannot be")
    save_llama(cwd / "llama")
    capsys.readouterr()  # transformers' own progress bar, writing it
    # --no-progress hides transformers' bar loading it too: the error is the one line
    line = refused(cwd, capsys, "engine", "--model", "llama", "--no-progress")
    assert "error: --model llama: model must be a hybrid model" in line


def test_engine_checks_its_workload_before_building_the_model(
    cwd: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a local checkpoint can take minutes to load: a workload or a pool that cannot
    # serve is refused first (the vocabulary comes from the model's config)
    import mambaradix.engine.models

    def no_model(*_: object, **__: object) -> None:
        raise AssertionError("the model was built before the input was checked")

    monkeypatch.setattr(mambaradix.engine.models, "build_model", no_model)
    line = refused(cwd, capsys, "engine", "--kv-tokens", "10", "--no-progress")
    assert "--kv-tokens 10 is too small: session" in line
    (cwd / "bad.jsonl").write_text("hello\n")
    line = refused(cwd, capsys, "engine", "--workload", "bad.jsonl", "--no-progress")
    assert "--workload: bad.jsonl, line 1: invalid JSON" in line


def test_engine_refuses_a_mooncake_format_file(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    row = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
    (cwd / "blocks.jsonl").write_text(json.dumps(row) + "\n")
    line = refused(cwd, capsys, "engine", "--workload", "blocks.jsonl")
    assert "--workload blocks.jsonl is a block-level trace" in line


def engine_needs(sessions: int, max_new: int, page: int = 1) -> int:
    """The least KV pool `mambaradix engine` on MT-Bench needs, from the trace:
    turn 1's prompt = turn 0's prompt + the engine's answer (max_new tokens) +
    the user's second message (trace input 1 less trace input 0 and output 0);
    admission wants prompt + max_new + a page strictly below the pool, and the
    pool is whole pages."""
    from mambaradix.replay.workloads import load

    by: dict[object, list[tuple[int, int, int]]] = {}
    for r in load("mt-bench").requests:
        by.setdefault(r.session_id, []).append((r.turn_id, r.input_tokens, r.output_tokens))
    prompt = 0
    for turns in list(by.values())[:sessions]:
        (_, in0, out0), (_, in1, _) = sorted(turns)
        prompt = max(prompt, in0, in0 + max_new + (in1 - in0 - out0))
    return -(-(prompt + max_new + page + 1) // page) * page


def test_engine_kv_too_small_names_the_need(cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    need = engine_needs(8, 32)
    args = ["engine", "--model", "qwen3-next-tiny", "--kv-tokens", "300", "--state-slots", "6"]
    line = refused(cwd, capsys, *args)
    assert "--kv-tokens 300 is too small: session" in line
    assert f"needs a pool of {need:,} tokens" in line and f"use --kv-tokens >= {need:,}" in line


def test_engine_kv_need_counts_an_answer_beyond_the_clip(
    cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # tiny.jsonl: one 3-token prompt. Admission clips 5000 new tokens at 4096
    # (3 + 4096 + 1 < 4200), but the finished sequence holds 3 + 5000 - 1 = 5002.
    args = ["engine", "--workload", "tiny.jsonl", "--max-new-tokens", "5000"]
    line = refused(cwd, capsys, *args, "--kv-tokens", "4200", "--state-slots", "4")
    assert "--kv-tokens 4,200 is too small" in line
    assert "needs a pool of 5,002 tokens" in line and "use --kv-tokens >= 5,002" in line


@pytest.mark.slow  # builds a model
@pytest.mark.parametrize(
    "paging",
    [
        [],
        ["--strategy", "extra_buffer", "--page-size", "16"],
        ["--strategy", "extra_buffer", "--page-size", "16", "--compat", "sglang"],
        ["--strategy", "extra_buffer", "--page-size", "16", "--compat", "sglang-0.5.15.post1"],
    ],
)
def test_engine_runs_at_exactly_the_stated_need(
    cwd: Path, capsys: pytest.CaptureFixture[str], paging: list[str]
) -> None:
    page = int(paging[paging.index("--page-size") + 1]) if paging else 1
    slots = "4" if paging else "2"
    need = engine_needs(2, 4, page)
    base = ["engine", "--sessions", "2", "--max-new-tokens", "4", "--no-progress", *paging]
    base += ["--chunk-size", "64", "--state-slots", slots]
    assert "needs" in refused(cwd, capsys, *base, "--kv-tokens", str(need - page))
    assert main([*base, "--kv-tokens", str(need)]) == 0
    out = capsys.readouterr().out
    assert "outputs identical: yes" in out
    saved = out.split("prefill saved by the cache: ")[1].split(";")[0]
    assert f"predicts {saved} for these requests" in out  # the replay agrees


def test_console_script_one_line_and_exit_2(tmp_path: Path) -> None:
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    bad = subprocess.run(
        [sys.executable, "-m", "mambaradix.cli", "replay", "--rate", "nan"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    assert bad.returncode == 2 and not bad.stdout and not list(tmp_path.iterdir())
    assert (
        bad.stderr
        == "mambaradix replay: error: argument --rate: must be a finite number, got 'nan'\n"
    )


def test_replay_memory_beyond_this_machine(cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 1e9 GB of marconi-7b KV is 7.6e12 tokens: 17 B of bookkeeping each is far
    # beyond any machine; the tiny trace's one request fits in a few MB.
    line = refused(
        cwd,
        capsys,
        "replay",
        "--trace",
        "tiny.jsonl",
        "--model",
        "marconi-7b",
        "--memory",
        "1e9",
        "--workers",
        "1",
        "--no-progress",
    )
    assert "--memory 1e+09 GB makes pools of" in line and "is available" in line


def test_engine_pools_beyond_this_machine(cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(cwd, capsys, "engine", "--kv-tokens", str(10**13), "--no-progress")
    assert "--kv-tokens 10,000,000,000,000, --state-slots 64 and --max-running 8 need about" in line
    # the request table (a row of --kv-tokens + 1 positions, 8 B each, per running request)
    line = refused(cwd, capsys, "engine", "--max-running", str(10**9), "--no-progress")
    assert "--kv-tokens 65,536, --state-slots 64 and --max-running 1,000,000,000 need" in line


def test_debug_shows_the_traceback(cwd: Path) -> None:
    from mambaradix.cli.checks import UsageError

    with pytest.raises(UsageError, match="--json . is a directory"):
        main(["replay", "--debug", "--trace", "tiny.jsonl", "--json", "."])


@pytest.mark.parametrize("workers", ["1", "2"])  # in-process, and in forked workers
def test_an_internal_failure_is_one_line_and_exit_1(
    cwd: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, workers: str
) -> None:
    import mambaradix.replay.cells as cells_module  # where the sweep runs a cell

    def broken(*args: object) -> None:
        raise RuntimeError("the serving model broke\nacross two lines")

    monkeypatch.setattr(cells_module, "replay_checked", broken)
    args = ["replay", "--trace", "tiny.jsonl", "--model", "marconi-7b", "--memory", "1"]
    assert main([*args, "--workers", workers, "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err == (
        "mambaradix replay: failed: RuntimeError: the serving model broke across two lines "
        "(--debug shows where)\n"
    )
    assert not (cwd / "out").exists()
    with pytest.raises(RuntimeError, match="the serving model broke"):
        main([*args, "--workers", workers, "--no-progress", "--debug"])
