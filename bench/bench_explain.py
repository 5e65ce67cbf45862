"""What `explain` costs over the replay it explains, per policy, side by side in one run.

    .venv/bin/python bench/bench_explain.py                      # synthetic-agent at 1 GB
    .venv/bin/python bench/bench_explain.py --trace mooncake --limit 1000 --memory 20
    .venv/bin/python bench/bench_explain.py --host-gb 4    # with a host tier

For each policy: the median over `--repeats` of one `replay()` and of one `explain()` of
the same point (the ideal structure computed once, outside the timing, as the CLI does),
CPU seconds of this process (`time.process_time`, so that other load on the machine
counts less), and their ratio. The replay itself carries no hook when not explained
(`ServingModel.on_submit` is None; no listener, no wrapper): see docs/explain.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

from mambaradix.geometry.profile import get_profile
from mambaradix.policies import SINGLE_RUN
from mambaradix.replay.explain import explain, ideal
from mambaradix.replay.run import replay
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.workloads import load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="synthetic-agent")
    ap.add_argument("--model", default="nemotron-h-8b")
    ap.add_argument("--memory", type=float, default=1.0)
    ap.add_argument("--host-gb", type=float, default=0.0, help="a host tier (replay.tiered)")
    ap.add_argument("--store-gb", type=float, default=0.0, help="a store tier")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--policies", default=",".join(SINGLE_RUN))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    trace = load(args.trace)
    trace.requests = trace.requests[: args.limit]
    profile = get_profile(args.model)
    cfg = ServingConfig(args.memory, host_gb=args.host_gb, store_gb=args.store_gb)
    start = time.process_time()
    structure = ideal(trace)
    print(
        f"trace {trace.name} ({len(trace)} requests), model {profile.name}, {args.memory:g} GB"
        f"{tiers(cfg)}; "
        f"the ideal structure: {time.process_time() - start:.2f} s once"
    )
    print(f"{'policy':<20} {'replay s':>9} {'explain s':>10} {'ratio':>6}")
    for policy in args.policies.split(","):
        r, e = [], []
        for _ in range(args.repeats):
            t = time.process_time()
            replay(trace, profile, policy, cfg)
            r.append(time.process_time() - t)
            t = time.process_time()
            explain(trace, profile, policy, cfg, structure=structure)
            e.append(time.process_time() - t)
        rm, em = statistics.median(r), statistics.median(e)
        print(f"{policy:<20} {rm:>9.2f} {em:>10.2f} {em / rm:>6.2f}")


def tiers(cfg: ServingConfig) -> str:
    sizes = (("host", cfg.host_gb), ("store", cfg.store_gb))
    return "".join(f" + {name} {gb:g} GB" for name, gb in sizes if gb)


if __name__ == "__main__":
    main()
