"""The README's results table: every bundled workload x policy x memory point,
with the bound, and each workload's replay throughput.

    .venv/bin/python bench/replay_table.py [--model nemotron-h-8b] [--out out/replay_table]

Writes OUT.md (markdown tables) and OUT.json (everything, with each workload's `sweep_s`),
prints the tables.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mambaradix.geometry.profile import get_profile
from mambaradix.policies import DEFAULT_RUN
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.sweep import sweep
from mambaradix.replay.workloads import load

MEMORY = {  # GB points where each workload is under pressure and where it is not
    "mooncake": [20, 40, 80, 160],
    "swe-agent": [1, 2, 5, 10],
    "chitchat": [1, 2, 5, 10],
    "mt-bench": [1, 2, 5],
    "synthetic-multi-turn": [1, 2, 5, 10],
    "synthetic-shared-prefix": [1, 2, 5, 10],
    "synthetic-agent": [1, 2, 5, 10],
}


def markdown(data: dict, seconds: float) -> str:
    policies = list(dict.fromkeys(r["policy"] for r in data["results"]))
    mems = sorted({r["memory_gb"] for r in data["results"]})
    t = data["trace"]
    rate = [r["requests_per_s"] for r in data["results"]]
    lines = [
        f"**{t['name']}** ({t['requests']:,} requests, {t['prompt_tokens']:,} prompt tokens; "
        f"bound {data['bound']['token_hit_rate']:.1%}; replay {min(rate):,.0f}-{max(rate):,.0f} "
        f"requests/s per run, sweep {seconds:.0f} s)",
        "",
        "| policy | " + " | ".join(f"{m:g} GB" for m in mems) + " |",
        "|---|" + "---|" * len(mems),
    ]
    for p in policies:
        cells = []
        for m in mems:
            r = next(x for x in data["results"] if x["policy"] == p and x["memory_gb"] == m)
            best = max(x["token_hit_rate"] for x in data["results"] if x["memory_gb"] == m)
            cell = f"{r['token_hit_rate']:.1%}"
            cells.append(f"**{cell}**" if r["token_hit_rate"] >= best - 1e-12 else cell)
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="nemotron-h-8b")
    ap.add_argument("--out", default="out/replay_table")
    ap.add_argument("--traces", default=",".join(MEMORY))
    args = ap.parse_args()
    profile = get_profile(args.model)
    everything, parts = {}, []
    for name in args.traces.split(","):
        start = time.perf_counter()
        trace = load(name)
        data = sweep(
            trace,
            profile,
            DEFAULT_RUN,  # marconi-oracle (a run per alpha) is in bench/evaluate.py
            [float(m) for m in MEMORY[name]],
            ServingConfig(memory_gb=1.0),
            progress=False,
        ).to_json()
        seconds = time.perf_counter() - start
        data["sweep_s"] = seconds  # loading, bound and sweep: the heading's "sweep N s"
        everything[name] = data
        parts.append(markdown(data, seconds))
        print(parts[-1] + "\n", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n\n".join(parts) + "\n")
    out.with_suffix(".json").write_text(json.dumps(everything, indent=1))


if __name__ == "__main__":
    main()
