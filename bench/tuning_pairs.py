"""Paired rows on the tuning material only: one generator of `bench/evaluate.py`'s tuning
material at its seeds (100-104, or the first `--seeds`), one discipline, some memories; per
row the mean token hit rate over the seeds and, against the first row, the mean and sample
sd of the per-seed differences. `chitchat-heldout` (conversations 300-599, one trace) is
paired per fold of its sessions, as `evaluate.py` pairs a real trace; its mean is the whole
trace's rate. For a candidate change without its ablation row's full evaluation protocol;
never on the evaluation's seeds or traces.

    .venv/bin/python bench/tuning_pairs.py --generator synthetic-agent \\
        --discipline sequential --memory 0.4,0.5 --rows mambaradix/without-room,mambaradix
"""

from __future__ import annotations

import argparse
import statistics
import sys
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from evaluate import (  # noqa: E402
    DISCIPLINES,
    FOLDS,
    GENERATORS,
    SEEDS,
    TUNING_GENERATORS,
    fold_rates,
    load_chitchat_heldout,
)
from mambaradix.geometry.profile import get_profile  # noqa: E402
from mambaradix.replay.run import replay  # noqa: E402
from mambaradix.replay.serving import ServingConfig  # noqa: E402

ALL = {**GENERATORS, **TUNING_GENERATORS}
HELDOUT = "chitchat-heldout"  # one trace: its parts are folds of sessions, not seeds


Job = tuple[str, str, int, float, str, float]


def run(job: Job) -> list[tuple[tuple[int, float, str], float]]:
    """One replay: its token hit rate per seed, or per fold (keyed -1 - fold) and whole."""
    generator, discipline, seed, memory, row, host_gb = job
    model, sequential = DISCIPLINES[discipline]
    trace = load_chitchat_heldout() if generator == HELDOUT else ALL[generator](seed=seed)
    cfg = ServingConfig(memory_gb=memory, sequential=sequential, host_gb=host_gb)
    r = replay(trace, get_profile(model), row, cfg, per_request=generator == HELDOUT)
    out = [((seed, memory, row), r["token_hit_rate"])]
    if generator == HELDOUT:
        folds = fold_rates(trace, r["request_hits"])
        out += [((-1 - f, memory, row), x) for f, x in enumerate(folds)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--generator", choices=sorted([*ALL, HELDOUT]), required=True)
    ap.add_argument("--discipline", choices=sorted(DISCIPLINES), required=True)
    ap.add_argument("--memory", required=True, help="GB, comma-separated")
    ap.add_argument("--rows", required=True, help="policies or ablations; the first is the base")
    ap.add_argument("--host-gb", type=float, default=0.0, help="a host tier at every memory")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--seeds",
        type=int,
        default=None,
        help=f"only the first N tuning seeds (2 to {len(SEEDS['tuning'])}; default all)",
    )
    args = ap.parse_args()
    memories = [float(m) for m in args.memory.split(",")]
    rows = args.rows.split(",")
    heldout = args.generator == HELDOUT
    seeds = [0] if heldout else SEEDS["tuning"][: args.seeds]
    if args.seeds is not None and heldout:
        ap.error(f"--seeds: {HELDOUT} is one trace, paired by folds; leave --seeds out")
    if args.seeds is not None and not 2 <= args.seeds <= len(SEEDS["tuning"]):
        ap.error(f"--seeds must be 2 to {len(SEEDS['tuning'])} (a sd needs two), got {args.seeds}")
    parts = [-1 - f for f in range(FOLDS)] if heldout else seeds
    point = (args.generator, args.discipline)
    jobs = [(*point, s, m, r, args.host_gb) for m in memories for r in rows for s in seeds]
    with Pool(args.workers) as pool:
        rate = dict(kv for got in pool.map(run, jobs) for kv in got)
    per = f"{FOLDS} folds" if heldout else f"seeds {seeds[0]}-{seeds[-1]}"
    print(f"{args.generator}, {args.discipline}, {per}; paired vs {rows[0]}")
    for m in memories:
        base = [rate[(s, m, rows[0])] for s in parts]
        cells = []
        for r in rows:
            mine = [rate[(s, m, r)] for s in parts]
            whole = [rate[(s, m, r)] for s in seeds]
            cell = f"{r} {100 * statistics.fmean(whole):.1f}%"
            if r != rows[0]:
                d = [100 * (x - y) for x, y in zip(mine, base, strict=True)]
                cell += f" ({statistics.fmean(d):+.1f}, sd {statistics.stdev(d):.1f})"
            cells.append(cell)
        host = f" + {args.host_gb:g} GB host" if args.host_gb else ""
        print(f"{m:g} GB{host}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
