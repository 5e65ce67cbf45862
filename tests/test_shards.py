"""Sweeps beyond one machine (`replay/shards.py`, `replay/cells.py`, the CLI's
`--shard`, `--instances`, `--router`, `--executor` and `mambaradix merge`): shards
merged equal a serial run; merge refuses what does not make one sweep; bad input is
one line on stderr and exit code 2, before any work."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from mambaradix.cli import main
from mambaradix.geometry.profile import get_profile
from mambaradix.replay.cells import build_cells
from mambaradix.replay.cluster import ClusterSpec
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.shards import Shard, ShardError, merge, trace_hash
from mambaradix.replay.sweep import sweep
from mambaradix.replay.workloads import multi_turn

WALL_CLOCK = frozenset({"replay_s", "requests_per_s"})
PROFILE = get_profile("nemotron-h-8b")


def strip(data: dict[str, Any]) -> dict[str, Any]:
    """What must be equal between runs: everything but wall-clock times."""
    return {
        "trace": data["trace"],
        "model": data["model"],
        "bound": data["bound"],
        "results": [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in data["results"]],
    }


def test_shard_parse_and_interleaved_selection() -> None:
    assert Shard.parse("2/3") == Shard(2, 3)
    # Cells 0..7 in order; shard i of 3 takes positions i-1, i-1+3, ...
    cells = list(range(8))
    assert [Shard(i, 3).select(cells) for i in (1, 2, 3)] == [[0, 3, 6], [1, 4, 7], [2, 5]]
    assert sorted(sum((Shard(i, 3).select(cells) for i in (1, 2, 3)), [])) == cells
    # ² and ³ are digits to isdigit() that int() refuses
    for bad in ("3/2", "0/2", "1/0", "a/2", "1/2/3", "2", "-1/2", "²/3", "1/³"):
        with pytest.raises(ValueError, match="--shard must be i/N"):
            Shard.parse(bad)


def test_cells_come_in_one_order() -> None:
    base = ServingConfig(memory_gb=1.0)
    cells = build_cells(["p", "q"], [1.0, 2.0], base, [0.3, 0.5], ["r1", "r2"], ClusterSpec(2))
    # state fraction, then memory, then router, then policy.
    assert [c.key for c in cells[:5]] == [
        ("p", 1.0, 0.3, "r1"),
        ("q", 1.0, 0.3, "r1"),
        ("p", 1.0, 0.3, "r2"),
        ("q", 1.0, 0.3, "r2"),
        ("p", 2.0, 0.3, "r1"),
    ]
    assert len(cells) == 16 and cells[-1].key == ("q", 2.0, 0.5, "r2")
    with pytest.raises(ValueError):
        build_cells(["p"], [1.0], base, [0.3], ["r1"], None)


def test_trace_hash_follows_the_contents() -> None:
    a, b = multi_turn(sessions=3, seed=1), multi_turn(sessions=3, seed=1)
    assert trace_hash(a) == trace_hash(b)  # two separate loads of the same contents
    b.name = "renamed"
    assert trace_hash(a) == trace_hash(b)  # the name is not content
    b.requests[-1].output_units[0] += 1
    assert trace_hash(a) != trace_hash(b)
    assert trace_hash(a) != trace_hash(multi_turn(sessions=3, seed=2))


def run_sweep(trace: Any, shard: Shard | None = None, cluster: bool = False) -> dict[str, Any]:
    """The sweep's JSON, as a shard file holds it (what `merge` reads)."""
    kw: dict[str, Any] = {"routers": ["round-robin", "hybrid"], "cluster": ClusterSpec(2)}
    return sweep(
        trace,
        PROFILE,
        ["sglang", "mambaradix"],
        [0.5, 1.0],
        ServingConfig(memory_gb=0.5),
        workers=1,
        progress=False,
        shard=shard,
        **(kw if cluster else {}),
    ).to_json()


@pytest.mark.parametrize(
    "cluster", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["single", "cluster"]
)
def test_shards_merged_equal_a_serial_run(cluster: bool) -> None:
    trace = multi_turn(sessions=5, seed=4)
    serial = run_sweep(trace, cluster=cluster)
    parts = [(f"s{i}", run_sweep(trace, Shard(i, 3), cluster)) for i in (3, 1, 2)]  # any order
    merged = merge(parts)
    assert strip(merged) == strip(serial)
    assert merged["merged_shards"] == 3 and len(merged["results"]) == (8 if cluster else 4)
    # Through JSON, as files travel, too.
    assert strip(merge([(n, json.loads(json.dumps(d))) for n, d in parts])) == strip(serial)


def shard_files(trace: Any, n: int = 2) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"s{i}.json", json.loads(json.dumps(run_sweep(trace, Shard(i, n)))))
        for i in range(1, n + 1)
    ]


def test_merge_refuses_what_is_not_one_sweep() -> None:
    trace = multi_turn(sessions=3, seed=4)
    parts = shard_files(trace, 2)

    def refused(bad: list[tuple[str, dict[str, Any]]], match: str) -> None:
        with pytest.raises(ShardError, match=match):
            merge(bad)

    refused(parts[:1], r"shard 2/2 missing")
    refused([parts[0], parts[0], parts[1]], r"shard 1/2 given twice")
    other = shard_files(multi_turn(sessions=3, seed=5), 2)
    refused([parts[0], other[1]], r"differ in trace hash")
    old = json.loads(json.dumps(parts[1]))
    old[1]["mambaradix_version"] = "0.0.1"
    refused([parts[0], old], r"differ in mambaradix version")
    dup = json.loads(json.dumps(parts[1]))
    dup[1]["results"].append(parts[0][1]["results"][0])
    refused([parts[0], dup], r"appears twice")
    lost = json.loads(json.dumps(parts[1]))
    lost[1]["results"].pop()
    refused([parts[0], lost], r"1 cell\(s\) missing")
    refused([("plain.json", {"results": []})], r"plain.json is not a shard file")
    refused([], r"no shard files")


def test_merge_refuses_a_damaged_shard_file() -> None:
    # A shard file edited or cut by hand is refused with a ShardError naming it,
    # whichever field it breaks (never a TypeError or KeyError from deep inside).
    parts = shard_files(multi_turn(sessions=3, seed=4), 2)

    def damaged(edit: Any) -> None:
        first = json.loads(json.dumps(parts[0][1]))
        edit(first)
        with pytest.raises(ShardError, match=r"^s1\.json is not a shard file"):
            merge([("s1.json", first), parts[1]])

    damaged(lambda d: d.update(shard=5))
    damaged(lambda d: d.update(shard={"index": 1.0, "count": 2.0}))
    damaged(lambda d: d.update(shard={"index": True, "count": 2}))
    damaged(lambda d: d.update(cells=7))
    damaged(lambda d: d["cells"].append(["sglang", 1.0]))
    damaged(lambda d: d.update(results=5))
    damaged(lambda d: d["results"].append(3))
    damaged(lambda d: d["results"][0].pop("policy"))
    damaged(lambda d: d["results"][0].update(memory_gb="x"))
    damaged(lambda d: d["results"][0].update(config=None))
    damaged(lambda d: d.pop("trace"))


# -------------------------------------------------------------------- CLI

RECORDS = [
    {
        "session_id": s,
        "turn_id": t,
        "ts": 10.0 * (2 * t + s),
        "input_tokens": list(range(100 * s, 100 * s + 40 + 20 * t)),
        "output_tokens": list(range(9000, 9008)),
    }
    for s in range(3)
    for t in range(2)
]


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path


def cli(*args: str) -> int:
    return main([*args])


def test_cli_shards_and_merge_equal_a_serial_cluster_run(tiny: Path, tmp_path: Path) -> None:
    common = ["replay", "--trace", str(tiny), "--memory", "0.5,1", "--policy", "sglang,mambaradix"]
    common += [
        "--instances",
        "2",
        "--router",
        "round-robin,hybrid",
        "--no-progress",
        "--workers",
        "1",
    ]
    assert cli(*common, "--json", str(tmp_path / "serial.json")) == 0
    for i in (1, 2):
        assert cli(*common, "--shard", f"{i}/2", "--json", str(tmp_path / f"s{i}.json")) == 0
    out = tmp_path / "merged.json"
    assert (
        cli("merge", str(tmp_path / "s2.json"), str(tmp_path / "s1.json"), "--json", str(out)) == 0
    )
    serial = json.loads((tmp_path / "serial.json").read_text())
    assert strip(json.loads(out.read_text())) == strip(serial)
    for row in serial["results"]:
        for key in ("instances", "router", "mispredicted_tokens", "load_imbalance"):
            assert key in row
        assert row["instances"] == 2


def test_cli_cluster_table_tells_the_state_fractions_apart(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    args = ["--memory", "1", "--policy", "sglang", "--state-fraction", "0.3,0.6"]
    args += ["--instances", "2", "--router", "hybrid", "--no-progress", "--json", str(out)]
    assert cli("replay", "--trace", str(tiny), *args) == 0
    lines = capsys.readouterr().out.splitlines()
    fractions = [r["state_fraction"] for r in json.loads(out.read_text())["results"]]
    assert fractions == [0.3, 0.6]
    # each row sits under a heading naming its state pool, as in the single-instance table
    rows = [i for i, line in enumerate(lines) if line.split()[1:3] == ["hybrid", "sglang"]]
    assert [lines[i - 1] for i in rows] == [
        "  state pool 30% of memory:",
        "  state pool 60% of memory:",
    ]


def test_cli_cluster_table_columns_line_up(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--memory", "1", "--policy", "sglang-extra-buffer,mambaradix", "--no-progress"]
    assert cli("replay", "--trace", str(tiny), *args, "--instances", "2", "--router", "hybrid") == 0
    head, rule, *rows = capsys.readouterr().out.splitlines()[1:5]
    assert len(rows) == 2 and {len(line) for line in (rule, *rows)} == {len(head)}


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--instances", "0"], "--instances must be a positive number, got 0"),
        (["--instances", "2", "--router", "hybrid,nope"], "unknown router nope"),
        (["--instances", "2", "--router", "hybird"], "did you mean 'hybrid'?"),
        (["--instances", "2", "--router", "hybrid,hybrid"], "--router: hybrid given twice"),
        (["--instances", "2", "--router", ""], "--router must name at least one of"),
        (["--instances", "2", "--router-lag-ms", "-5"], "--router-lag-ms must be a number >= 0"),
        (["--instances", "2", "--router-block", "0"], "--router-block must be a positive number"),
        (["--router", "hybrid"], "--router needs --instances N"),
        (["--instances", "2", "--shared-store"], "--shared-store needs --store-gb"),
        (
            ["--shared-store", "--store-gb", "1", "--host-gb", "1"],
            "--shared-store needs --instances N",
        ),
        (["--shard", "3/2", "--json", "x.json"], "--shard must be i/N with 1 <= i <= N, got 3/2"),
        (["--shard", "1/2"], "--shard needs --json FILE"),
        (["--executor", "http://127.0.0.1:8786"], "--executor must be dask://HOST:PORT"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    out = tmp_path / "never.json"
    json_out = [] if "--json FILE" in message else ["--json", str(out)]
    rc = cli("replay", "--trace", str(tiny), "--no-progress", *args, *json_out)
    assert rc == 2
    assert message in one_error_line(capsys)
    assert not out.exists()


def test_cli_router_block_must_fit_the_trace(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli("replay", "--limit", "5", "--instances", "2", "--router-block", "100", "--no-progress")
    assert rc == 2
    assert "multiple of the trace's 512-token blocks" in one_error_line(capsys)


def test_cli_merge_refuses_a_shard_from_another_trace(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({**r, "ts": r["ts"] + 1}) + "\n" for r in RECORDS))
    for i, path in ((1, tiny), (2, other)):
        rc = cli(
            "replay",
            "--trace",
            str(path),
            "--memory",
            "1",
            "--policy",
            "mambaradix,sglang",
            "--no-progress",
            "--workers",
            "1",
            "--shard",
            f"{i}/2",
            "--json",
            str(tmp_path / f"s{i}.json"),
        )
        assert rc == 0
    capsys.readouterr()
    out = tmp_path / "merged.json"
    assert (
        cli("merge", str(tmp_path / "s1.json"), str(tmp_path / "s2.json"), "--json", str(out)) == 2
    )
    line = one_error_line(capsys)
    assert line.startswith("mambaradix merge: error: ") and "differ in trace hash" in line
    assert not out.exists()
    assert cli("merge", str(tmp_path / "nope.json")) == 2
    assert "cannot read" in one_error_line(capsys)
    (tmp_path / "bad.json").write_text("{not json")
    assert cli("merge", str(tmp_path / "bad.json")) == 2
    assert "is not JSON" in one_error_line(capsys)
    (tmp_path / "s1.json.gz").write_bytes(b"\x1f\x8b\x08")  # compressed, say
    assert cli("merge", str(tmp_path / "s1.json.gz")) == 2
    assert f"{tmp_path / 's1.json.gz'} is not JSON (not UTF-8 text)" in one_error_line(capsys)


@pytest.mark.parametrize("where", ["a_dir", "a_file/x.json", "a_fifo"])
def test_cli_merge_checks_its_json_output_first(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    (tmp_path / "a_dir").mkdir()
    (tmp_path / "a_file").write_text("x")
    os.mkfifo(tmp_path / "a_fifo")
    shards = [str(tmp_path / f"s{i}.json") for i in (1, 2)]
    for i, name in enumerate(shards, 1):
        assert cli("replay", "--trace", str(tiny), "--memory", "0.5", "--policy", "sglang",
                   "--no-progress", "--shard", f"{i}/2", "--json", name) == 0  # fmt: skip
    capsys.readouterr()
    assert cli("merge", *shards, "--json", str(tmp_path / where)) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"mambaradix merge: error: --json {tmp_path / where}")
    assert (tmp_path / "a_fifo").is_fifo() and (tmp_path / "a_file").read_text() == "x"


def test_cli_router_block_must_fit_the_page(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A token trace at --page-size 16: the tree's page is 16 tokens, so a 24-token router
    # block cannot be announced; refused before the sweep (exit 2), not a failed run.
    common = ["replay", "--trace", str(tiny), "--memory", "1", "--page-size", "16"]
    common += ["--policy", "sglang-extra-buffer", "--instances", "2", "--no-progress"]
    assert cli(*common, "--router-block", "24") == 2
    assert one_error_line(capsys) == (
        "mambaradix replay: error: --router-block must be a multiple of the tree's "
        "16-token page (--page-size), got 24"
    )
    assert cli(*common, "--router-block", "32", "--router", "hybrid") == 0


def test_cli_instances_beyond_this_machine_are_refused_up_front(
    tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each instance has its own pools (memory each): 10**8 instances of 1 GB make free
    # lists of tens of terabytes. Refused before any instance is built, naming the
    # option; the same run with 2 instances goes ahead.
    common = ["replay", "--trace", str(tiny), "--memory", "1", "--policy", "sglang"]
    common += ["--router", "round-robin", "--workers", "1", "--no-progress"]
    assert cli(*common, "--instances", str(10**8)) == 2
    line = one_error_line(capsys)
    assert "(100,000,000 --instances, 1 workers)" in line and "bookkeeping needs about" in line
    assert cli(*common, "--instances", "2") == 0
