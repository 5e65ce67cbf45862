"""Does the prefix cache change the answers in bfloat16? The engine with the cache on and off,
with `deterministic` off and on (every prefill on one grid of `--chunk` positions).

    .venv/bin/python bench/bench_determinism.py                       # CPU, ~2 min on 2 cores
    .venv/bin/python bench/bench_determinism.py --device cuda --models nemotron-h-base

Workloads (the engine's own answers go into each next prompt, so one early difference
changes every later prompt of its session):
  synthetic  --sessions sessions x 3 turns sharing a --system-token prompt (first turn + 8-64
             own tokens, later turns 8-40)
  mt-bench   the first --sessions MT-Bench conversations (needs the `text` extra)
Columns: greedy tokens equal with the cache on and off (position by position); first-token
logits bitwise equal, of the requests whose prompt is the same in both runs (a later turn's
prompt holds the earlier answers); requests whose every logit is bitwise equal; the hit rate.
`decode` says how decode ran: batched (one forward per step) or single (one forward per
sequence). Models: the tiny presets, or `<family>-small` / `<family>-base` from
bench_engine_speed.py's sizes.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import torch

from bench_engine_speed import SIZES
from mambaradix.engine import Engine, Result, build_model
from mambaradix.engine.workload import run_conversations


def synthetic(n: int, system_tokens: int, vocab: int, seed: int) -> list[list[list[int]]]:
    rng = random.Random(seed)
    system = [rng.randrange(vocab) for _ in range(system_tokens)]
    return [
        [
            (system if t == 0 else [])
            + [rng.randrange(vocab) for _ in range(rng.randrange(8, 65 if t == 0 else 41))]
            for t in range(3)
        ]
        for _ in range(n)
    ]


def build(name: str, dtype: torch.dtype, device: str) -> Any:
    family, _, size = name.rpartition("-")
    return build_model(f"{family}-tiny", seed=0, dtype=dtype, overrides=SIZES[family][size]).to(
        device
    )


def serve(
    net: Any, sessions: Any, args: argparse.Namespace, **kw: Any
) -> list[tuple[list[int], Result]]:
    """(prompt, result) of every request."""
    eng = Engine(
        model="bench",
        net=net,
        device=args.device,
        dtype=args.torch_dtype,
        chunk_size=args.chunk,
        kv_tokens=args.kv_tokens,
        state_slots=64,
        **kw,
    )
    run = run_conversations(eng, sessions, args.new)
    eng.check()
    return [
        (p, r)
        for prompts, results in zip(run.prompts, run.results, strict=True)
        for p, r in zip(prompts, results, strict=True)
    ]


def compare(
    on_runs: list[tuple[list[int], Result]], off_runs: list[tuple[list[int], Result]]
) -> dict[str, float]:
    on, off = [r for _, r in on_runs], [r for _, r in off_runs]
    pairs = list(zip(on, off, strict=True))
    same_prompt = [(a, b) for (p, a), (q, b) in zip(on_runs, off_runs, strict=True) if p == q]
    return {
        "tokens": sum(
            x == y for a, b in pairs for x, y in zip(a.output_ids, b.output_ids, strict=True)
        ),
        "total": sum(len(a.output_ids) for a in on),
        "first": sum(torch.equal(a.logits[0], b.logits[0]) for a, b in same_prompt),
        "same_prompt": len(same_prompt),
        "all": sum(
            len(a.logits) == len(b.logits)
            and all(torch.equal(x, y) for x, y in zip(a.logits, b.logits, strict=True))
            for a, b in pairs
        ),
        "requests": len(pairs),
        "hit": sum(a.cached_tokens for a in on) / sum(a.prompt_tokens for a in on),
    }


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="nemotron-h-tiny,qwen3-next-tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--system", type=int, default=200)
    ap.add_argument("--new", type=int, default=24)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--kv-tokens", type=int, default=65536)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--single", action="store_true", help="also one-sequence decode")
    args = ap.parse_args()
    args.torch_dtype = getattr(torch, args.dtype)
    return args


def main() -> None:
    args = parse()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    head = f"{'model':18}{'workload':11}{'determ.':>8}{'decode':>9}{'same tokens':>19}"
    print(head + f"{'first bitwise':>15}{'all bitwise':>13}{'hit':>7}")
    for name in args.models.split(","):
        net = build(name, args.torch_dtype, args.device)
        vocab = int(net.config.vocab_size)
        workloads = {"synthetic": synthetic(args.sessions, args.system, vocab, 0)}
        try:
            from mambaradix.compare import engine_sessions

            workloads["mt-bench"] = engine_sessions("mt-bench", vocab, args.sessions)
        except ImportError as e:
            print(f"(mt-bench skipped: {e})")
        modes = [(False, True), (True, True)] + ([(True, False)] if args.single else [])
        for wname, sessions in workloads.items():
            for det, batched in modes:
                kw = {"deterministic": det, "batch_decode": batched}
                c = compare(
                    serve(net, sessions, args, prefix_cache=True, **kw),
                    serve(net, sessions, args, prefix_cache=False, **kw),
                )
                same = f"{c['tokens']}/{c['total']} ({c['tokens'] / c['total']:.1%})"
                print(
                    f"{name:18}{wname:11}{'on' if det else 'off':>8}"
                    f"{'batched' if batched else 'single':>9}{same:>19}"
                    f"{c['first']:>9}/{c['same_prompt']:<5}{c['all']:>7}/{c['requests']:<5}"
                    f"{c['hit']:>7.1%}"
                )
    print(f"\n({time.perf_counter() - start:.0f} s, {args.dtype}, {args.device})")


if __name__ == "__main__":
    main()
