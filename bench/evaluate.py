"""The replay evaluation: its output is the README's results section.

    .venv/bin/python bench/evaluate.py                     # the evaluation (12 min, 2 idle cores)
    .venv/bin/python bench/evaluate.py --material tuning   # the same protocol on tuning material

Every policy (and every ablation of ours) at every point of:

* the bundled real traces (mooncake, swe-agent, chitchat, mt-bench) and
* the synthetic generators (multi-turn, shared-prefix, agent) at seeds 0-4,

in both disciplines: `serving` (the concurrent serving model, Nemotron-H-8B)
and `sequential` (Marconi's discipline, one request at a time, one shared byte
budget, the marconi-7b profile), at 3-4 memory sizes each (`MEMORY`). To
finish in 15 minutes on 2 cores, Mooncake is its first 6,000 of 12,031
requests (`--limit 0` for all).

Verdicts. Our policy against each other policy at a point: the margin is the
difference of token hit rates; the spread is the sample standard deviation of
the paired per-part differences: per seed for a synthetic generator, per
fold for a real trace (its sessions dealt into 5 folds by order of first
appearance; one replay, each fold's hit rate). A win where the margin exceeds
the spread, a loss where it is below minus the spread, a tie otherwise.

Policies: the deployable ones as users run them today (`sglang`,
`sglang-extra-buffer`: SGLang 0.5.23; `vllm`: vLLM 0.33.0's defaults;
`marconi`), `marconi-oracle` (Marconi's best alpha in hindsight, a bound, not
deployable) and ours. Older releases' rows (`sglang-0.5.15.post1*`,
`vllm-0.20-all`) are not run; `--policies` names them.

`--material tuning` swaps in material the evaluation never sees: the
synthetic generators at seeds 100-104 and `chitchat-heldout` (chitchat
conversations 300-599; the evaluation's chitchat is conversations 0-299),
plus the classes where our policy was weakest on unseen traces (`TIGHT`):
`synthetic-shared-doc` (8 shared documents of 8k-16k tokens) and
`synthetic-agent` below the evaluation's smallest memory, both also with
Qwen3-Next-80B-A3B's state (`serving-qwen3-next`), and `synthetic-two-turn`
(80 two-turn chats of short prompts: in the sequential discipline the
backlog puts many newer first turns between a chat's two turns). Our policy's
constants were set on that material only (`mambaradix/policies/constants.py`).

`--only`, `--disciplines` and `--memory` run a part of the points (every row at each).

Writes OUT.md (the tables) and OUT.json (every result); prints the tables.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mambaradix.cli.signals import as_interrupts, exit_code, said
from mambaradix.geometry.profile import get_profile
from mambaradix.policies import ABLATIONS, ORACLE
from mambaradix.policies.constants import RANK_SAMPLE
from mambaradix.replay.bound import bound_token_hit_rate
from mambaradix.replay.forked import run_forked
from mambaradix.replay.run import oracle_pick, oracle_runs, replay
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.trace import Trace
from mambaradix.replay.workloads import agent_loop, load, multi_turn, shared_prefix

OURS = "mambaradix"
POLICIES = [
    "sglang",
    "sglang-extra-buffer",
    "vllm",
    "marconi",
    ORACLE,
    OURS,
]
DEPLOYABLE = [p for p in POLICIES if p not in (ORACLE, OURS)]
"""The policies a user can run (`marconi-oracle` picks its alpha in hindsight)."""
DISCIPLINES = {  # name: (model profile, sequential)
    "serving": ("nemotron-h-8b", False),
    "sequential": ("marconi-7b", True),
    "serving-qwen3-next": ("qwen3-next-80b-a3b", False),  # the tuning material's only
}
MEMORY: dict[
    str, dict[str, list[float]]
] = {  # GB per discipline: from pressure to (near) the plateau
    "mooncake": {"serving": [20, 40, 80, 160], "sequential": [20, 40, 80, 160]},
    "swe-agent": {"serving": [1, 2, 5, 10], "sequential": [1, 2, 3, 5]},
    "chitchat": {"serving": [1, 2, 5, 10], "sequential": [1, 2, 5, 10]},
    "mt-bench": {"serving": [1, 2, 5], "sequential": [1, 2, 5]},
    "synthetic": {"serving": [1, 2, 5], "sequential": [0.5, 1, 2]},
}
TIGHT: dict[str, dict[str, list[float]]] = {
    # The tuning material's own points, where issue 16 found our policy weakest on unseen
    # traces: shared documents with a Qwen3-Next-sized state, agents at and below the
    # evaluation's smallest memory. The evaluation has none of them. The smallest sizes are
    # the least that serves every request with every policy (`replay.fit.check_memory`:
    # SGLang's extra_buffer needs 4 states, 0.87 GB of split pools with Nemotron-H-8B).
    "synthetic-shared-doc": {
        "serving": [1, 2, 5],
        # 0.5 and 1 GB serve no request with marconi-7b, and `replay` refuses such a point;
        # 1.25 GB serves every one (1.17-1.22 GB, by policy)
        "sequential": [1.25, 2, 5],
        "serving-qwen3-next": [0.75, 1, 2, 5],
    },
    "synthetic-agent": {
        "serving": [1, 2, 5],
        "sequential": [0.4, 0.5, 1, 2],  # 0.25 GB serves no request of seed 100 at all
        "serving-qwen3-next": [0.75, 1, 2, 5],
    },
}


def shared_documents(seed: int) -> Trace:
    """Single-turn questions on 8 shared documents of 8k-16k tokens (a skewed pick):
    `shared_prefix` with document-sized prefixes."""
    trace = shared_prefix(requests=200, tenants=8, system_tokens=(8192, 16384), seed=seed)
    trace.name = "synthetic-shared-doc"
    return trace


def two_turn_chats(seed: int) -> Trace:
    """Two-turn chats without a shared system prompt, prompts and answers of 32-256 tokens
    (the generator's defaults), 80 sessions: `multi_turn` where a conversation holds few
    tokens beside its state, and the sequential discipline's backlog puts many newer first
    turns between a conversation's two turns."""
    trace = multi_turn(
        sessions=80, turns=(2, 2), shared_system=False, system_tokens=(0, 0), seed=seed
    )
    trace.name = "synthetic-two-turn"
    return trace


GENERATORS = {
    "synthetic-multi-turn": multi_turn,
    "synthetic-shared-prefix": shared_prefix,
    "synthetic-agent": agent_loop,
}
TUNING_GENERATORS = {
    "synthetic-shared-doc": shared_documents,
    "synthetic-two-turn": two_turn_chats,
}
SEEDS = {"evaluation": list(range(5)), "tuning": list(range(100, 105))}
REAL = {
    "evaluation": ["mooncake", "swe-agent", "chitchat", "mt-bench"],
    "tuning": ["chitchat-heldout"],
}
FOLDS = 5
MOONCAKE_LIMIT = 6000  # of 12,031 requests, to finish in 15 minutes on 2 cores
HELDOUT = (300, 600)  # chitchat conversations of the tuning material

_TRACES: dict[str, Trace] = {}  # loaded before the workers fork
_POINTS: dict[str, dict[str, list[float]]] = {}  # workload: {discipline: GB}, with them


@dataclass(frozen=True)
class Job:
    trace: str  # key in _TRACES
    discipline: str
    memory: float
    run: str  # a policy, an ablation, or one alpha of the oracle


def load_chitchat_heldout() -> Trace:
    """Chitchat conversations 300-599, loaded as `load("chitchat")` loads 0-299."""
    from mambaradix.replay.workloads import load_chitchat
    from mambaradix.replay.workloads.sources import _chitchat_path

    with open(_chitchat_path(), encoding="utf-8") as f:
        data = json.load(f)
    part = dict(list(data.items())[HELDOUT[0] : HELDOUT[1]])
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as tmp:
        json.dump(part, tmp)
    try:
        trace = load_chitchat(n=len(part), path=tmp.name)
    finally:
        os.unlink(tmp.name)
    trace.name = "chitchat-heldout"
    return trace


def load_material(
    material: str, limit: int | None, seeds: int = 0, only: list[str] | None = None
) -> dict[str, list[str]]:
    """Fill _TRACES and _POINTS; return each workload's trace keys (one, or one per seed;
    the first `seeds` seeds only if given), of the workloads in `only` if given (the others
    are not loaded: Mooncake and chitchat take seconds)."""
    groups: dict[str, list[str]] = {}
    for name in REAL[material]:
        if only is not None and name not in only:
            continue
        trace = load_chitchat_heldout() if name == "chitchat-heldout" else load(name)
        if limit and name == "mooncake":
            trace.requests = trace.requests[:limit]
        _TRACES[name] = trace
        groups[name] = [name]
    generators: dict[str, Any] = dict(GENERATORS)
    if material == "tuning":
        generators.update(TUNING_GENERATORS)
    for name, gen in generators.items():
        if only is not None and name not in only:
            continue
        groups[name] = []
        for seed in SEEDS[material][: seeds or None]:
            key = f"{name}#{seed}"
            _TRACES[key] = gen(seed=seed)
            groups[name].append(key)
    for name in groups:
        base = MEMORY["synthetic" if name.startswith("synthetic") else name.split("-held")[0]]
        tight = TIGHT.get(name) if material == "tuning" else None
        _POINTS[name] = {d: [float(m) for m in ms] for d, ms in (tight or base).items()}
    return groups


def disciplines(workload: str) -> list[str]:
    return list(_POINTS[workload])


def memories(workload: str, discipline: str) -> list[float]:
    return _POINTS[workload][discipline]


NO_TUNING = "marconi/without-tuning"
"""Marconi at alpha 0 (its start, LRU on nodes with at most one child): the
oracle's first run, shown as the ablation of Marconi's tuner."""


def runs_of(row: str, discipline: str, memory: float) -> list[str]:
    """The runs a row's cell is made of. An ablation that cannot change a
    decision at this point is the policy itself (not run twice): the free
    pass exists only with split pools (ours runs on one byte budget: only its
    without-shared-budget row has them, and it keeps the pass), sampling only
    with more than RANK_SAMPLE states, the tier split only with a lower tier."""
    if row == ORACLE:
        return list(oracle_runs())
    if row == NO_TUNING:
        return ["marconi@0"]
    if row == "mambaradix/without-free-pass":  # ours runs on one budget everywhere
        return [OURS]
    if row == "mambaradix/without-shared-budget" and discipline == "sequential":
        return [OURS]
    if row == "mambaradix/without-tier-split":  # the evaluation has no host or store tier
        return [OURS]
    if row == "mambaradix/without-sampling" and state_slots(discipline, memory) <= RANK_SAMPLE:
        return [OURS]
    return [row]


def state_slots(discipline: str, memory: float) -> int:
    """The most states our policy's memory holds (one byte budget, as ours runs:
    all of it in states)."""
    model, _ = DISCIPLINES[discipline]
    share = 1.0
    return int(memory * 1e9 * share) // get_profile(model).state_bytes


def run_job(job: Job) -> tuple[Job, dict[str, Any]]:
    model, sequential = DISCIPLINES[job.discipline]
    cfg = ServingConfig(memory_gb=job.memory, sequential=sequential)
    trace = _TRACES[job.trace]
    r = replay(trace, get_profile(model), job.run, cfg, per_request=True)
    keep = ("policy", "token_hit_rate", "alpha", "replay_s", "states_evicted", "dropped")
    out = {k: r[k] for k in keep if k in r}
    out["folds"] = fold_rates(trace, r["request_hits"])
    return job, out


def fold_rates(trace: Trace, hits: list[int]) -> list[float]:
    """Token hit rate per fold of sessions (dealt in order of first appearance)."""
    fold_of: dict[object, int] = {}
    num, den = [0] * FOLDS, [0] * FOLDS
    for r, h in zip(trace.requests, hits, strict=True):
        f = fold_of.setdefault(r.session_id, len(fold_of) % FOLDS)
        num[f] += h
        den[f] += r.input_tokens
    return [n / d if d else 0.0 for n, d in zip(num, den, strict=True)]


def cost(job: Job) -> float:
    """A rough relative cost, to start the longest jobs first."""
    weight = 3 if job.run == "marconi" or job.run.startswith(OURS) else 1
    return len(_TRACES[job.trace]) * weight


class Progress:
    """One line on stderr every `every` seconds (and at the end): runs done, elapsed,
    and an estimate of what is left from the rate so far."""

    def __init__(self, total: int, every: float = 10.0) -> None:
        self.total, self.every, self.done = total, every, 0
        self.start = self.shown = time.monotonic()

    def __call__(self) -> None:
        self.done += 1
        now = time.monotonic()
        if now - self.shown < self.every and self.done < self.total:
            return
        self.shown = now
        spent = now - self.start
        left = spent / self.done * (self.total - self.done)
        print(
            f"  {self.done}/{self.total} runs, {spent:.0f} s, about {left:.0f} s left",
            file=sys.stderr,
            flush=True,
        )


def run_all(jobs: list[Job], workers: int) -> list[tuple[Job, dict[str, Any]]]:
    """Every job, longest first, on `workers` forked processes (replay/forked.py: they
    end with this process, whatever ends it)."""
    jobs = sorted(jobs, key=cost, reverse=True)
    progress = Progress(len(jobs))
    if workers <= 1:
        done = []
        for job in jobs:
            done.append(run_job(job))
            progress()
        return done
    return run_forked(run_job, jobs, workers, progress)


# ------------------------------------------------------------------ results


def collect(
    groups: dict[str, list[str]], rows: list[str], done: list[tuple[Job, dict[str, Any]]]
) -> dict[str, Any]:
    """results[workload][discipline][memory][row] = {'rate', 'parts', 'spread', ...}."""
    by_key = {(j.trace, j.discipline, j.memory, j.run): r for j, r in done}
    out: dict[str, Any] = {}
    for workload, keys in groups.items():
        for disc in disciplines(workload):
            for mem in memories(workload, disc):
                cells = out.setdefault(workload, {}).setdefault(disc, {}).setdefault(mem, {})
                for row in rows:
                    per_trace = []
                    for k in keys:
                        runs = [by_key[(k, disc, mem, run)] for run in runs_of(row, disc, mem)]
                        best = oracle_pick([r["token_hit_rate"] for r in runs])
                        per_trace.append(runs[best] if row == ORACLE else runs[0])
                    cells[row] = _cell(per_trace, synthetic=len(keys) > 1)
    return out


def _cell(per_trace: list[dict[str, Any]], synthetic: bool) -> dict[str, Any]:
    rates = [r["token_hit_rate"] for r in per_trace]
    parts = rates if synthetic else per_trace[0]["folds"]
    cell: dict[str, Any] = {
        "rate": statistics.fmean(rates),
        "parts": parts,
        "spread": statistics.stdev(rates) if synthetic else 0.0,
    }
    alphas = [r["alpha"] for r in per_trace if "alpha" in r]
    if alphas:
        cell["alpha"] = alphas
    return cell


def verdict(ours: dict[str, Any], theirs: dict[str, Any]) -> tuple[str, float, float]:
    margin = ours["rate"] - theirs["rate"]
    diffs = [a - b for a, b in zip(ours["parts"], theirs["parts"], strict=True)]
    spread = statistics.stdev(diffs)
    if margin > spread:
        return "win", margin, spread
    if margin < -spread:
        return "loss", margin, spread
    return "tie", margin, spread


def point_verdict(cells: dict[str, Any], others: list[str]) -> tuple[str, list[str]]:
    """Against every other policy at one point: 'loss' if any loss, else 'win'
    if a win against the best other, else 'tie'; and who beats us."""
    losses = [p for p in others if verdict(cells[OURS], cells[p])[0] == "loss"]
    if losses:
        return "loss", losses
    best = max(others, key=lambda p: cells[p]["rate"])
    return verdict(cells[OURS], cells[best])[0], []


def fmt(cell: dict[str, Any], synthetic: bool, bold: bool) -> str:
    text = f"{cell['rate']:.1%}"
    if synthetic:
        text += f" ± {cell['spread']:.1%}"
    return f"**{text}**" if bold else text


def tallies(
    results: dict[str, Any], others: list[str] | None = None
) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """Our verdicts over every point of `results` (workload, discipline, memory): against
    `others` at once (`point_verdict`), and against each of them alone. `others`: every
    policy but ours unless given."""
    if others is None:
        others = [p for p in POLICIES if p != OURS]
    tally = {"win": 0, "tie": 0, "loss": 0}
    against = {p: {"win": 0, "tie": 0, "loss": 0} for p in others}
    for by_disc in results.values():
        for cells_at in by_disc.values():
            for cells in cells_at.values():
                tally[point_verdict(cells, others)[0]] += 1
                for p in others:
                    against[p][verdict(cells[OURS], cells[p])[0]] += 1
    return tally, against


def table(cells_at: dict[float, Any], rows: list[str], head: str, synth: bool) -> str:
    """One workload in one discipline (policies, our verdict, ablations)."""
    others = [p for p in POLICIES if p != OURS]
    mems = list(cells_at)
    lines = [head, "", "| policy | " + " | ".join(f"{m:g} GB" for m in mems) + " |"]
    lines.append("|---|" + "---|" * len(mems))
    marks = []
    for m in mems:
        v, beaten_by = point_verdict(cells_at[m], others)
        marks.append(v + (f" ({', '.join(beaten_by)})" if beaten_by else ""))
    for row in rows:
        cells = []
        for m in mems:
            best = max(cells_at[m][q]["rate"] for q in POLICIES)
            cell = cells_at[m][row]
            cells.append(fmt(cell, synth, row in POLICIES and cell["rate"] >= best - 1e-12))
        name = row if row in POLICIES else f"*{row}*"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        if row == POLICIES[-1]:
            lines.append(f"| *{OURS} vs all* | " + " | ".join(marks) + " |")
    return "\n".join(lines)


def markdown(
    results: dict[str, Any],
    groups: dict[str, list[str]],
    rows: list[str],
    bounds: dict[str, float],
) -> tuple[str, dict[str, int], dict[str, dict[str, int]]]:
    """The tables of `results`, one per workload and discipline, and `tallies` over them."""
    parts: list[str] = []
    for workload, keys in groups.items():
        synth = len(keys) > 1
        for disc in disciplines(workload):
            model = DISCIPLINES[disc][0]
            head = f"**{workload}**, {disc} ({model}); bound {bounds[workload]:.1%}"
            if synth:
                head += f"; mean ± sd over seeds {_seed_range(keys)}"
            else:
                head += f"; {len(_TRACES[keys[0]]):,} requests"
            parts.append(table(results[workload][disc], rows, head, synth))
    tally, against = tallies(results)
    return "\n\n".join(parts), tally, against


TARGETS = [("swe-agent", "sequential"), ("chitchat", "sequential")]  # at or above the oracle


def summary(
    tally: dict[str, int],
    against: dict[str, dict[str, int]],
    results: dict[str, Any],
    how: str,
) -> str:
    """The verdict counts; `how`: how the results were run (in the first line's brackets)."""
    total = sum(tally.values())
    lines = [
        f"{OURS} against every other policy at once, per point: {tally['win']} wins, "
        f"{tally['tie']} ties, {tally['loss']} losses of {total} points ({how}).",
        "",
        f"| {OURS} against | wins | ties | losses |",
        "|---|---|---|---|",
    ]
    for p, t in against.items():
        lines.append(f"| {p} | {t['win']} | {t['tie']} | {t['loss']} |")
    lines += ["", deployable_summary(results)]
    for workload, disc in TARGETS:
        if disc not in results.get(workload, {}):
            continue
        cells = results[workload][disc]
        marks = []
        for m, c in cells.items():
            v, margin, spread = verdict(c[OURS], c[ORACLE])
            marks.append(
                f"{m:g} GB {c[OURS]['rate']:.1%} vs {c[ORACLE]['rate']:.1%} "
                f"({v}, margin {margin:+.1%}, spread {spread:.1%})"
            )
        lines.append("")
        lines.append(f"Target, {workload} {disc}, {OURS} vs {ORACLE}: " + "; ".join(marks) + ".")
    return "\n".join(lines)


def deployable_summary(results: dict[str, Any]) -> str:
    """Our verdict against every deployable policy at once, per point, and each point
    where one of them beats us or ties us from above (margin < 0), with its numbers."""
    tally, _ = tallies(results, DEPLOYABLE)
    below: list[str] = []
    for workload, by_disc in results.items():
        for disc, cells_at in by_disc.items():
            for m, cells in cells_at.items():
                for p in DEPLOYABLE:
                    pv, margin, spread = verdict(cells[OURS], cells[p])
                    if margin < 0:
                        below.append(
                            f"{workload} {disc} {m:g} GB: {pv} to {p}, "
                            f"{cells[OURS]['rate']:.1%} vs {cells[p]['rate']:.1%} "
                            f"(margin {margin:+.1%}, spread {spread:.1%})"
                        )
    total = sum(tally.values())
    text = (
        f"Against the deployable policies ({', '.join(DEPLOYABLE)}) at once, per point: "
        f"{tally['win']} wins, {tally['tie']} ties, {tally['loss']} losses of {total} points."
    )
    if below:
        text += " Below one of them (a loss or a tie under it):\n\n" + "\n".join(
            f"* {b}" for b in below
        )
    return text


def merged(paths: list[str]) -> dict[str, Any]:
    """The results of several parts' JSON files (`--out`), point by point; a point in a
    later file replaces the same point of an earlier one (a part re-run)."""
    results: dict[str, Any] = {}
    for path in paths:
        for workload, by_disc in json.loads(Path(path).read_text())["results"].items():
            for disc, cells_at in by_disc.items():
                at = results.setdefault(workload, {}).setdefault(disc, {})
                at.update({float(m): cells for m, cells in cells_at.items()})
    return results


def merged_summary(results: dict[str, Any]) -> str:
    """`summary`'s verdict counts over merged parts (no runs or seconds: the parts have
    theirs)."""
    return summary(*tallies(results), results, "merged parts")


def _seed_range(keys: list[str]) -> str:
    seeds = [int(k.split("#")[1]) for k in keys]
    return f"{min(seeds)}-{max(seeds)}"


def memory_points(ap: argparse.ArgumentParser, text: str | None) -> set[float] | None:
    """`--memory`'s points (None: all), or the parser's error."""
    if text is None:
        return None
    try:
        points = {float(m) for m in text.split(",")}
    except ValueError:
        ap.error(f"--memory: comma-separated GB, e.g. 1,5; got {text!r}")
    return points


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--material", choices=sorted(SEEDS), default="evaluation")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=None, help="default out/evaluation or out/tuning")
    ap.add_argument(
        "--limit", type=int, default=MOONCAKE_LIMIT, help="first N Mooncake requests (0: all)"
    )
    ap.add_argument("--only", default=None, help="comma-separated workloads (default: all)")
    ap.add_argument("--policies", default=None, help="comma-separated rows (default: all)")
    ap.add_argument("--seeds", type=int, default=0, help="first N seeds per generator (0: all)")
    ap.add_argument(
        "--disciplines", default=None, help="comma-separated disciplines (default: all)"
    )
    ap.add_argument(
        "--memory",
        default=None,
        help="comma-separated GB: only these of each workload's points (default: all)",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="print the verdicts over these parts' "
        "JSON files (later files replace the same points of earlier ones); run nothing",
    )
    args = ap.parse_args()
    if args.merge:
        print(merged_summary(merged(args.merge)))
        return
    keep = args.disciplines.split(",") if args.disciplines else list(DISCIPLINES)
    if unknown := [d for d in keep if d not in DISCIPLINES]:
        ap.error(
            f"--disciplines: unknown {', '.join(unknown)}; choose from {', '.join(DISCIPLINES)}"
        )
    wanted = memory_points(ap, args.memory)
    start = time.perf_counter()
    only = args.only.split(",") if args.only else None
    known = [*REAL[args.material], *GENERATORS]
    known += list(TUNING_GENERATORS) if args.material == "tuning" else []
    if only is not None and (unknown := [w for w in only if w not in known]):
        ap.error(f"--only: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    groups = load_material(args.material, args.limit, args.seeds, only)
    for w in groups:
        at = {d: ms for d, ms in _POINTS[w].items() if d in keep}
        at = {d: [m for m in ms if wanted is None or m in wanted] for d, ms in at.items()}
        _POINTS[w] = {d: ms for d, ms in at.items() if ms}
    groups = {w: ks for w, ks in groups.items() if _POINTS[w]}
    if not groups:
        ap.error("--only, --disciplines, --memory: together they choose no point of the material")
    ablations = [NO_TUNING, *ABLATIONS]
    rows = args.policies.split(",") if args.policies else POLICIES + ablations
    rows = list(dict.fromkeys(POLICIES + rows))
    jobs = [
        Job(k, d, m, run)
        for w, keys in groups.items()
        for k in keys
        for d in disciplines(w)
        for m in memories(w, d)
        for run in dict.fromkeys(run for row in rows for run in runs_of(row, d, m))
    ]
    print(f"{len(jobs)} runs on {args.workers} workers", file=sys.stderr, flush=True)
    done = run_all(jobs, args.workers)
    results = collect(groups, rows, done)
    bounds = {
        w: statistics.fmean(bound_token_hit_rate(_TRACES[k]) for k in keys)
        for w, keys in groups.items()
    }
    seconds = time.perf_counter() - start
    text, tally, against = markdown(results, groups, rows, bounds)
    how = f"{len(jobs)} runs in {seconds:.0f} s with {args.workers} workers"
    text = summary(tally, against, results, how) + "\n\n" + text
    out = Path(args.out or f"out/{args.material}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text + "\n")
    dump = {
        "material": args.material,
        "seconds": seconds,
        "tally": tally,
        "against": against,
        "results": results,
    }
    out.with_suffix(".json").write_text(json.dumps(dump, indent=1, default=_json))
    print(text)


def _json(x: object) -> object:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    raise TypeError(type(x).__name__)


def interruptible() -> int:
    """main(), ended by Ctrl-C, SIGTERM or SIGHUP with its workers (exit 130/143/129)."""
    with as_interrupts():
        try:
            main()
        except KeyboardInterrupt as e:
            print(f"\nevaluate: {said(e)}; nothing written", file=sys.stderr)
            return exit_code(e)
    return 0


if __name__ == "__main__":
    sys.exit(interruptible())
