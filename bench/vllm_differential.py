"""The `vllm` row against vLLM 0.33.0's own KV cache manager: counts over seeded streams.

    PYTHONPATH=src:tests .venv/bin/python bench/vllm_differential.py            # both kinds
    PYTHONPATH=src:tests .venv/bin/python bench/vllm_differential.py --streams 50

Runs the streams of ``tests/test_vllm_differential.py`` (the slow tier's seeds) and prints,
per retention kind, requests, requests whose hit differs, and streams with a kept state the
tree already held (the one explained class of difference, docs/vllm-baseline.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_vllm_differential import run_stream  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=250, help="streams per kind (40 requests)")
    args = ap.parse_args()
    kinds = {
        "sparse (default)": (100, ("sparse",)),
        "dense / interval": (1000, ("dense", "interval")),
    }
    for label, (first, retentions) in kinds.items():
        start = time.perf_counter()
        requests = differing = streams_dup = streams_differing = 0
        for seed in range(first, first + args.streams):
            n, d, dup = run_stream(seed, retentions[seed % len(retentions)], 40)
            requests, differing = requests + n, differing + d
            streams_dup += dup > 0
            streams_differing += d > 0
        print(
            f"{label}: {requests:,} requests in {args.streams} streams, {differing} differ "
            f"(in {streams_differing} streams); {streams_dup} streams hold a duplicate kept "
            f"state ({time.perf_counter() - start:.0f} s)"
        )


if __name__ == "__main__":
    main()
