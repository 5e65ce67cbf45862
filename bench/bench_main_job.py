"""The main job's time: `mambaradix replay` with its defaults (the bundled Mooncake trace,
every default policy at 20, 40, 80 and 160 GB on nemotron-h-8b; what `scripts/main.sh`
runs), whole and by part.

    .venv/bin/python bench/bench_main_job.py                      # the job: wall and CPU
    .venv/bin/python bench/bench_main_job.py --baseline OLD/src   # against another checkout
    .venv/bin/python bench/bench_main_job.py --parts              # where the time goes

The job runs as a fresh process, as `scripts/main.sh` runs it (`--no-progress`, the plot
to a temporary file); its CPU time is that of the process and its workers
(`RUSAGE_CHILDREN`). On a machine shared with other jobs, CPU time moves less than wall
time. With `--baseline`, a source tree of another checkout (e.g. one made by
`git worktree add /tmp/base <commit>`; with its compiled core built, if this one has
one) runs the same command, the two alternating, and their tables must be identical.

`--parts` runs the pieces in this process, one after another, and reports each one's CPU
time: imports, loading the trace, the bound, every cell (one policy at one memory point)
and the plot. `--layers` runs the cells under cProfile instead and splits each one's time
by the layer its functions live in (run it with MAMBARADIX_PURE=1 to see the tree's own
functions; cProfile's overhead inflates the layers that make many small calls).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"


def run_job(src: Path, extra: list[str]) -> tuple[float, float, str]:
    """(wall s, CPU s of the process and its workers, the table) of one run of the job."""
    env = dict(os.environ, PYTHONPATH=str(src))
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "mambaradix.cli", "replay", "--no-progress"]
        cmd += ["--plot", str(Path(tmp) / "plot.png"), *extra]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    table = "\n".join(x for x in out.splitlines() if not x.startswith(("(", "plot:")))
    return wall, cpu, table


def build_of(src: Path) -> str:
    code = "import mambaradix; print(mambaradix.BUILD)"
    env = dict(os.environ, PYTHONPATH=str(src))
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def compare(baseline: Path | None, repeats: int, extra: list[str]) -> int:
    sides = {"this": SRC} if baseline is None else {"baseline": baseline, "this": SRC}
    builds = {name: build_of(src) for name, src in sides.items()}
    print("builds: " + ", ".join(f"{n} {b}" for n, b in builds.items()))
    if len(set(builds.values())) > 1:
        print("the two sides load different builds of the core: not comparable")
        return 1
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    tables: dict[str, str] = {}
    for rep in range(repeats):
        for name, src in sides.items():
            wall, cpu, table = run_job(src, extra)
            times[name].append((wall, cpu))
            tables.setdefault(name, table)
            if table != tables[name]:
                print(f"{name}: the table changed between repeats")
                return 1
            load = os.getloadavg()[0]
            print(
                f"run {rep + 1} {name:8}  wall {wall:6.1f} s  CPU {cpu:6.1f} s  (load {load:.1f})"
            )
    for name, runs in times.items():
        walls, cpus = sorted(w for w, _ in runs), sorted(c for _, c in runs)
        print(f"{name:8}  wall least {walls[0]:6.1f} s  CPU least {cpus[0]:6.1f} s")
    if baseline is not None:
        same = tables["baseline"] == tables["this"]
        print(f"tables identical: {same}")
        b, t = times["baseline"], times["this"]
        print(
            f"baseline / this: wall {min(w for w, _ in b) / min(w for w, _ in t):.2f}x, "
            f"CPU {min(c for _, c in b) / min(c for _, c in t):.2f}x (least of each)"
        )
        return 0 if same else 1
    return 0


def parts(
    memories: list[float], policies: list[str] | None, limit: int | None, as_json: Path | None
) -> int:
    """Each piece of the job in this process, CPU seconds each."""
    clock = time.process_time
    t = clock()
    sys.path.insert(0, str(SRC))
    from mambaradix import BUILD
    from mambaradix.geometry.profile import load_profile
    from mambaradix.policies import DEFAULT_RUN
    from mambaradix.replay.bound import bound_token_hit_rate
    from mambaradix.replay.run import replay_checked
    from mambaradix.replay.serving import ServingConfig
    from mambaradix.replay.sweep import plot
    from mambaradix.replay.workloads import load

    out: dict[str, float] = {"imports": clock() - t}
    t = clock()
    trace = load("mooncake")
    out["load trace"] = clock() - t
    trace.requests = trace.requests[:limit]
    t = clock()
    bound = bound_token_hit_rate(trace)
    out["bound"] = clock() - t
    profile = load_profile("nemotron-h-8b")
    cells: dict[str, float] = {}
    rows = []
    for m in memories:
        for p in policies or DEFAULT_RUN:
            t = clock()
            rows.append(replay_checked(trace, profile, p, ServingConfig(memory_gb=m)))
            cells[f"{p} at {m:g} GB"] = clock() - t
            print(f"  {p:22} {m:5g} GB  {cells[f'{p} at {m:g} GB']:6.2f} s", flush=True)
    out["cells"] = sum(cells.values())
    results = [dict(r, state_fraction=r["config"]["state_fraction"]) for r in rows]
    data = {
        "trace": {"name": trace.name},
        "model": {"name": profile.name},
        "bound": {"token_hit_rate": bound},
        "results": results,
    }
    with tempfile.TemporaryDirectory() as tmp:
        t = clock()
        plot(data, str(Path(tmp) / "plot.png"))
        out["plot"] = clock() - t
    print(f"core: {BUILD}")
    for name, s in out.items():
        print(f"{name:12} {s:7.2f} s CPU")
    by_policy: dict[str, float] = {}
    for key, s in cells.items():
        name = key.split(" at ")[0]
        by_policy[name] = by_policy.get(name, 0.0) + s
    for name, s in sorted(by_policy.items(), key=lambda x: -x[1]):
        print(f"  {name:22} {s:7.2f} s CPU ({s / out['cells']:.0%} of the cells)")
    if as_json is not None:
        as_json.write_text(json.dumps({"build": BUILD, "parts": out, "cells": cells}, indent=1))
    return 0


LAYERS = (  # the first prefix of a function's module path decides its layer
    ("core/", "tree (core)"),
    ("pools/", "pools"),
    ("replay/memory", "pools"),
    ("scheduler/", "scheduler"),
    ("lifecycle/", "lifecycle"),
    ("policies/", "the policy's own"),
    ("replay/vllm_", "the policy's own"),
    ("replay/", "replay model"),
)


def layers(memories: list[float], policies: list[str], limit: int | None) -> int:
    """Each cell's time under cProfile, by layer (functions' own time; builtins count as
    other)."""
    import cProfile
    import pstats

    sys.path.insert(0, str(SRC))
    from mambaradix import BUILD
    from mambaradix.geometry.profile import load_profile
    from mambaradix.replay.run import replay_checked
    from mambaradix.replay.serving import ServingConfig
    from mambaradix.replay.workloads import load

    trace = load("mooncake")
    trace.requests = trace.requests[:limit]
    profile = load_profile("nemotron-h-8b")
    names = [name for _, name in LAYERS] + ["other"]
    print(f"core: {BUILD}; share of each cell's time under cProfile")
    print(f"{'cell':28} " + " ".join(f"{n[:16]:>16}" for n in dict.fromkeys(names)))
    for m in memories:
        for p in policies:
            prof = cProfile.Profile()
            prof.runcall(replay_checked, trace, profile, p, ServingConfig(memory_gb=m))
            share = dict.fromkeys(names, 0.0)
            for (file, _, _), (_, _, own, _, _) in pstats.Stats(prof).stats.items():  # type: ignore[attr-defined]
                path = file.replace("\\", "/").split("mambaradix/")[-1]
                where = next((n for pre, n in LAYERS if path.startswith(pre)), "other")
                share[where] += own if "mambaradix/" in file else 0.0
                share["other"] += 0.0 if "mambaradix/" in file else own
            total = sum(share.values())
            cells = " ".join(f"{share[n] / total:>16.0%}" for n in dict.fromkeys(names))
            print(f"{p + ' at ' + format(m, 'g') + ' GB':28} {cells}", flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", type=Path, default=None, help="another checkout's src/")
    p.add_argument("--repeats", type=int, default=1, help="runs of each side (default 1)")
    p.add_argument("--parts", action="store_true", help="the pieces, in this process")
    p.add_argument("--layers", action="store_true", help="each cell's time by layer")
    p.add_argument("--memory", default=None, help="GB points (default: the job's)")
    p.add_argument("--policy", default=None, help="policies (default: the job's)")
    p.add_argument("--limit", type=int, default=None, help="only the first N requests")
    p.add_argument("--json", type=Path, default=None, help="--parts: write the numbers here")
    args = p.parse_args()
    if args.layers:
        mems = [float(x) for x in (args.memory or "80").split(",")]
        pols = (args.policy or "sglang,vllm,vllm-0.20-all,mambaradix").split(",")
        return layers(mems, pols, args.limit)
    if args.parts:
        mems = [float(x) for x in (args.memory or "20,40,80,160").split(",")]
        pols = args.policy.split(",") if args.policy else None
        return parts(mems, pols, args.limit, args.json)
    extra = [] if args.memory is None else ["--memory", args.memory]
    extra += [] if args.policy is None else ["--policy", args.policy]
    extra += [] if args.limit is None else ["--limit", str(args.limit)]
    return compare(args.baseline, args.repeats, extra)


if __name__ == "__main__":
    sys.exit(main())
