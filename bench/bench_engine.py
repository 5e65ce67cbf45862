"""The reference engine (`mambaradix.engine`) with and without the prefix cache, on CPU.

    .venv/bin/python bench/bench_engine.py                   # both models, ~1-2 min on 2 cores
    .venv/bin/python bench/bench_engine.py --models nemotron-h-tiny --hidden 256 --threads 2

Two multi-turn workloads, each served twice with the same seeded random weights:
  synthetic  --sessions sessions sharing one --system-token system prompt, --turns turns each
             (first user turn 64-128 tokens, later ones 16-64); every turn's prompt is the
             previous prompt + the engine's own answer + the new user tokens
  mt-bench   the first --sessions MT-Bench conversations (2 turns; Mistral token ids mod
             the model's vocabulary; needs the `text` extra, skipped without it)
Columns: requests/s over the whole run, mean and median TTFT (from a round's submission to
the request's first token; all sessions' turn t are submitted together), prefill tokens
computed, hit rate, the hit rate `mambaradix replay` predicts for the same requests and pool
sizes, and whether greedy outputs match with and without the cache.
Decode runs every running request in one forward per step (`--single-decode`: one forward per
request, as the engine did before). `--device cuda --dtype bfloat16` runs on a GPU.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from mambaradix.compare import compare_cache, engine_sessions


def synthetic_sessions(
    n: int, turns: int, system_tokens: int, vocab: int, seed: int
) -> list[list[list[int]]]:
    rng = random.Random(seed)
    system = [rng.randrange(vocab) for _ in range(system_tokens)]
    out = []
    for _ in range(n):
        s = []
        for t in range(turns):
            k = rng.randrange(64, 129) if t == 0 else rng.randrange(16, 65)
            user = [rng.randrange(vocab) for _ in range(k)]
            s.append(system + user if t == 0 else user)
        out.append(s)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="nemotron-h-tiny,qwen3-next-tiny")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=256)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--chunk-size", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=None, help="override the preset hidden size")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--single-decode", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="write every row here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    vocab = 1024
    workloads = {
        "synthetic": synthetic_sessions(
            args.sessions, args.turns, args.system_tokens, vocab, args.seed
        )
    }
    try:
        workloads["mt-bench"] = engine_sessions("mt-bench", vocab, args.sessions)
    except ImportError as e:
        print(f"(mt-bench skipped: {e})")
    overrides = {"hidden_size": args.hidden} if args.hidden else None
    head = (
        f"{'model':17}{'workload':11}{'cache':>6}{'req':>5}{'req/s':>8}{'TTFT mean':>11}"
        f"{'TTFT p50':>10}{'prefill':>9}{'hit':>7}{'replay':>8}{'same':>6}"
    )
    print(head)
    print("-" * len(head))
    start = time.perf_counter()
    rows: list[dict[str, object]] = []
    for model in args.models.split(","):
        for name, sessions in workloads.items():
            kw = {
                "chunk_size": args.chunk_size,
                "device": args.device,
                "dtype": getattr(torch, args.dtype),
                "batch_decode": not args.single_decode,
            }
            if overrides:
                kw["model_overrides"] = overrides  # type: ignore[assignment]
            data = compare_cache(sessions, args.max_new_tokens, model=model, seed=args.seed, **kw)
            for label in ("cache", "no cache"):
                d = data[label]
                rows.append({"model": model, "workload": name, "cache": label, **d})
                print(
                    f"{model:17}{name:11}{'on' if label == 'cache' else 'off':>6}"
                    f"{data['requests']:>5}{d['requests_per_s']:>8.1f}"
                    f"{d['mean_ttft_s'] * 1e3:>9.1f}ms{d['p50_ttft_s'] * 1e3:>8.1f}ms"
                    f"{d['computed_prefill_tokens']:>9.0f}{d['hit_rate']:>7.1%}"
                    f"{data['replay']['token_hit_rate'] if label == 'cache' else 0.0:>8.1%}"
                    f"{'yes' if data['identical'] else 'NO':>6}"
                )
    print(f"\n({time.perf_counter() - start:.1f} s, {args.threads} threads)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"threads": args.threads, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
