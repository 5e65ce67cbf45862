"""Every time the README and the docs state, checked within a factor of 2 on this machine.

    .venv/bin/python bench/readme_timings.py             # everything (about 37 min; run it idle)
    .venv/bin/python bench/readme_timings.py --dry-run   # read and cross-check the claims only
    .venv/bin/python bench/readme_timings.py --only engine,replay_table

Checks (a stated range a-b holds for a measurement in [a/2, 2b]):
  1. "Every command" (docs/commands.md): each full command's wall time against column 3
     (`bash scripts/main.sh`: the replay it ends with; `bash scripts/test.sh`: ruff, mypy and
     pytest as it runs them; both without the set-up; this script: its own total at the end);
  2. the replay headings: slowest and fastest run's requests/s and the sweep's seconds, from
     the JSON of the `bench/replay_table.py` run of check 1;
  3. the engine table: req/s and mean TTFT, from the `bench/bench_engine.py` run of check 1;
  4. the core table: median µs per op and side, from the `bench/bench_vs_sglang.py` run;
  5. the indexer's speed paragraph: events/s, blocks/s and query µs, from the
     `bench/bench_indexer.py` run.
Not timed: the index server and its `curl` clients (the server runs until stopped), the
merge of shards (it needs all of them), the GPU check, the commands the test suite runs
(`pytest` files, the docs build) and the rows whose time is "not measured".
Commands run with this Python and the repository's `src` first on the path, in a temporary
directory (outputs land there). Exit status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import readme  # noqa: E402
from readme import Claim, Row  # noqa: E402

OUTPUTS = {  # the extra options that make a benchmark leave the data checks 2-4 read
    "bench/replay_table.py": ["--out", "{tmp}/replay_table"],
    "bench/bench_engine.py": ["--json", "{tmp}/engine.json"],
    "bench/bench_vs_sglang.py": ["--json", "{tmp}/core.json"],
    "bench/bench_indexer.py": ["--json", "{tmp}/indexer.json"],
}
SUITE = [
    ["ruff", "check", "src", "tests", "bench"],
    ["mypy"],
    ["-m", "pytest", "-q"],
    ["-m", "pytest", "-q", "-m", "slow"],
]


class Report:
    def __init__(self) -> None:
        self.failed = 0

    def check(self, what: str, claim: Claim, measured: float) -> None:
        ok = claim.holds(measured)
        self.failed += not ok
        ratio = measured / ((claim.lo + claim.hi) / 2) if claim.hi else float("inf")
        print(
            f"{'ok ' if ok else 'BAD'} {what:<70} stated {claim!s:>12}  "
            f"measured {measured:>10.4g}  ({ratio:.2f}x)",
            flush=True,
        )


def env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": f"{readme.REPO / 'src'}{os.pathsep}{path}"}


def timed(argv: list[str], cwd: Path, expect: int = 0) -> float:
    """Wall time of a command that must exit with `expect`."""
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env(), capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != expect:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}")
    return took


def run_row(row: Row, tmp: Path) -> float | None:
    """Wall time of one table row's full command; None if it is not timed here."""
    py = sys.executable
    if row.command == "bash scripts/test.sh":
        tools = Path(py).parent
        argvs = [[str(tools / "ruff"), *SUITE[0][1:]], [str(tools / "mypy")]]
        argvs += [[py, *a] for a in SUITE[2:]]
        return sum(timed(a, readme.REPO) for a in argvs)
    if "readme_timings.py" in row.command:
        return None  # checked against this script's own total at the end
    tested = readme.how_tested(row)
    if tested.role not in ("command", "shard"):
        return None  # a server, its clients, the merge of shards, the GPU check
    if row.command.startswith("bash "):
        words = script_command(row.command.split()[1])
    else:
        words = [w for w in shlex.split(row.command) if w != "/usr/bin/time"]
    argv = readme.to_argv(words, py)
    for script, extra in OUTPUTS.items():
        if script in row.command:
            argv += [x.format(tmp=tmp) for x in extra]
    return timed(argv, tmp, tested.exit_code)


def script_command(script: str) -> list[str]:
    """The command a set-up script ends with (its last line, without "$@")."""
    last = (readme.REPO / script).read_text().strip().splitlines()[-1]
    return [w for w in shlex.split(last) if w != "$@"]


def check_replay_headings(text: str, tmp: Path, report: Report) -> None:
    data = json.loads((tmp / "replay_table.json").read_text())
    for name, (slow, fast, sweep) in readme.replay_headings(text).items():
        rates = [r["requests_per_s"] for r in data[name]["results"]]
        report.check(f"replay {name}: slowest run, requests/s", slow, min(rates))
        report.check(f"replay {name}: fastest run, requests/s", fast, max(rates))
        report.check(f"replay {name}: sweep, s", sweep, data[name]["sweep_s"])


def check_engine(text: str, tmp: Path, report: Report) -> None:
    rows = json.loads((tmp / "engine.json").read_text())["rows"]
    for (model, workload), claims in readme.engine_table(text).items():
        got = {r["cache"]: r for r in rows if (r["model"], r["workload"]) == (model, workload)}
        for side, label in (("cache", "on"), ("no cache", "off")):
            report.check(
                f"engine {model} {workload}: req/s {label}",
                claims[f"req/s {label}"],
                got[side]["requests_per_s"],
            )
            report.check(
                f"engine {model} {workload}: mean TTFT {label}, s",
                claims[f"TTFT {label} (s)"],
                got[side]["mean_ttft_s"],
            )


def check_core(text: str, tmp: Path, report: Report) -> None:
    per_type = json.loads((tmp / "core.json").read_text())["per_type"]
    for op, claims in readme.core_table(text).items():
        for side, claim in claims.items():
            report.check(f"core {op}: {side} median, µs", claim, per_type[op][side]["median_us"])


def check_indexer(text: str, tmp: Path, report: Report) -> None:
    data = json.loads((tmp / "indexer.json").read_text())
    claims = readme.indexer_claims(text)
    # the README's "SGLang's format" is one event per block: SGLang 0.5.15.post1's
    vllm = sorted([data["feed_vllm-0.33.0"]["blocks_per_s"], data["apply"]["blocks_per_s"]])
    measured = {
        "apply_1block events/s": data["apply_1block"]["events_per_s"],
        "feed_sglang events/s": data["feed_sglang-0.5.15.post1"]["events_per_s"],
        "query µs": data["query_16k_us"]["full_match"],
    }
    for what, value in measured.items():
        report.check(f"indexer {what}", claims[what], value)
    lo, hi = claims["vllm blocks/s"]
    report.check("indexer vllm blocks/s, through the wire", Claim(lo, lo), vllm[0])
    report.check("indexer vllm blocks/s, in-process", Claim(hi, hi), vllm[1])


def dry_run(text: str, rows: list[Row]) -> int:
    """Cross-check the README and the docs without running anything."""
    listed = {r.command for r in rows}
    in_blocks = {c for doc in readme.documents().values() for c in readme.bash_commands(doc)}
    assert listed == in_blocks, f"table vs code blocks: {listed ^ in_blocks}"
    for r in rows:
        print(f"{str(readme.stated_seconds(r.time) or '-'):>10} s  {r.command}")
    parts = {
        "replay headings": readme.replay_headings(text),
        "engine table": readme.engine_table(text),
        "core table": readme.core_table(text),
        "indexer paragraph": readme.indexer_claims(text),
    }
    for what, found in parts.items():
        assert found, f"no {what} found in the README or the docs"
        print(f"{what}: {len(found)} rows")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="read and cross-check only")
    ap.add_argument("--only", default=None, help="comma-separated parts of commands to run")
    args = ap.parse_args(argv)
    text, start = readme.read(), time.perf_counter()
    rows = readme.command_rows(text)
    if args.dry_run:
        return dry_run(text, rows)
    only = args.only.split(",") if args.only else None
    report = Report()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for row in rows:
            claim = readme.stated_seconds(row.time)
            if claim is None or (only and not any(o in row.command for o in only)):
                continue
            took = run_row(row, tmp)
            if took is not None:
                report.check(row.command, claim, took)
        for script, check in (
            ("replay_table", check_replay_headings),
            ("bench_engine", check_engine),
            ("bench_vs_sglang", check_core),
            ("bench_indexer", check_indexer),
        ):
            if not only or any(o in script for o in only):
                check(text, tmp, report)
    if only is None:
        total = next(r for r in rows if "readme_timings.py" in r.command)
        report.check(
            total.command,
            readme.stated_seconds(total.time) or Claim(0, 0),
            time.perf_counter() - start,
        )
    print(f"\n{report.failed} of the checks failed" if report.failed else "\nall times hold")
    return 1 if report.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
