"""The reference engine's speed: batched vs one-sequence decode, the cache on vs off, and
its overhead against a plain `transformers` forward on the same tokens.

    .venv/bin/python bench/bench_engine_speed.py                        # CPU, small model
    .venv/bin/python bench/bench_engine_speed.py --device cuda --dtype bfloat16 --size base

Models are built from a config (random weights, `--size`: `tiny` the test preset, `small`
for a CPU, `base` for a GPU: 8.5M / 280M parameters Nemotron-H-shaped (default), 14M / 319M
with `--family qwen3-next`).
Three measurements, all on one model in one process:

1. decode: `--batch` sequences of different prompt lengths (about `--prompt` tokens)
   generate `--new` tokens each, decoded in ONE forward per step (batched) or one forward
   per sequence (single). Columns: decode tokens/s (decode tokens / time in decode
   forwards) and the ratio. Target: batched >= 4x single at 8 sequences.
2. serving: `--batch` sessions sharing a `--system`-token prompt (each + 64 own tokens),
   two rounds (the second resends every prompt + its answer + 32 tokens), cache on vs off,
   batched decode: wall time, output tokens/s, mean TTFT, prefill tokens computed.
3. overhead: the engine's scheduler step (admission, allocation, index building, the
   pool-backed forward, sampling) against a plain `transformers` forward with its own
   `DynamicCache` on the same tokens: a prefill of `--prompt` tokens; a second chunk
   (`--prompt` tokens after `--prompt` of context); a decode step of `--batch` sequences
   of equal length. Medians over `--repeats`. Target: <= 1.15x.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from array import array
from collections.abc import Callable
from typing import Any

import torch

from mambaradix.engine import Engine, build_model
from mambaradix.engine.workload import run_conversations
from mambaradix.scheduler import DECODE, PREFILL, Sequence

SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "nemotron-h": {
        "tiny": {},  # the preset itself
        "small": {
            "vocab_size": 8192,
            "hidden_size": 256,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "layers_block_type": ["mamba", "mlp", "mamba", "attention", "mlp"] * 2,
            "mamba_num_heads": 16,
            "mamba_head_dim": 32,
            "n_groups": 2,
            "ssm_state_size": 64,
            "chunk_size": 128,
            "intermediate_size": 1024,
        },
        "base": {
            "vocab_size": 32768,
            "hidden_size": 1024,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 128,
            "layers_block_type": ["mamba", "mlp", "mamba", "mlp", "mamba", "attention", "mlp"] * 4,
            "mamba_num_heads": 32,
            "mamba_head_dim": 64,
            "n_groups": 8,
            "ssm_state_size": 128,
            "chunk_size": 128,
            "intermediate_size": 4096,
        },
    },
    "qwen3-next": {
        "tiny": {},
        "small": {
            "vocab_size": 8192,
            "hidden_size": 256,
            "num_hidden_layers": 8,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "linear_num_key_heads": 4,
            "linear_num_value_heads": 8,
            "linear_key_head_dim": 32,
            "linear_value_head_dim": 32,
            "intermediate_size": 1024,
            "moe_intermediate_size": 256,
            "shared_expert_intermediate_size": 256,
            "num_experts": 4,
            "num_experts_per_tok": 2,
        },
        "base": {
            "vocab_size": 32768,
            "hidden_size": 1024,
            "num_hidden_layers": 16,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 128,
            "linear_num_key_heads": 8,
            "linear_num_value_heads": 16,
            "linear_key_head_dim": 64,
            "linear_value_head_dim": 64,
            "intermediate_size": 2816,
            "moe_intermediate_size": 768,
            "shared_expert_intermediate_size": 768,
            "num_experts": 4,
            "num_experts_per_tok": 2,
        },
    },
}


class Timer:
    """Wall time of calls, with the device synchronised before and after."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def __call__(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        self.sync()
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        return time.perf_counter() - t0, out


def prompts(n: int, length: int, vocab: int, seed: int, jitter: bool) -> list[list[int]]:
    rng = random.Random(seed)
    lens = [
        length + (rng.randrange(-length // 4, length // 4 + 1) if jitter else 0) for _ in range(n)
    ]
    return [[rng.randrange(vocab) for _ in range(k)] for k in lens]


def engine(net: Any, args: argparse.Namespace, **kw: Any) -> Engine:
    base = {
        "model": "bench",
        "net": net,
        "device": args.device,
        "dtype": args.torch_dtype,
        "kv_tokens": args.kv_tokens,
        "state_slots": 4 * args.batch + 8,
        "chunk_size": args.prompt,
        "max_running": args.batch + 1,  # a part-way prefill holds a row of its own
        "keep_logits": False,
    }
    return Engine(**{**base, **kw})


def drive(eng: Engine, seqs: list[Sequence], timer: Timer) -> dict[str, list[float]]:
    """Submit `seqs`, step the scheduler to the end; seconds per step, by kind."""
    steps: dict[str, list[float]] = {PREFILL: [], DECODE: []}
    for seq in seqs:
        eng.scheduler.submit(seq)
    while eng.scheduler.busy:
        dt, kind = timer(eng.scheduler.step)
        steps.setdefault(kind, []).append(dt)
    eng.check()
    return steps


def bench_decode(net: Any, args: argparse.Namespace, timer: Timer) -> dict[str, float]:
    """Decode tokens/s with one forward per step vs one per sequence."""
    ps = prompts(args.batch, args.prompt, args.vocab, args.seed, jitter=True)
    out: dict[str, float] = {}
    for label, batched in (("batched", True), ("single", False)):
        eng = engine(net, args, batch_decode=batched, prefix_cache=False)
        seqs = [Sequence(array("q", p), args.new, id=i) for i, p in enumerate(ps)]
        steps = drive(eng, seqs, timer)
        out[label] = sum(len(s.outputs) - 1 for s in seqs) / sum(steps[DECODE])
        out[label + "_forwards"] = eng.stats()["decode_forwards"]
    out["ratio"] = out["batched"] / out["single"]
    return out


def sessions(args: argparse.Namespace) -> list[list[list[int]]]:
    rng = random.Random(args.seed + 1)
    system = [rng.randrange(args.vocab) for _ in range(args.system)]
    own = [[rng.randrange(args.vocab) for _ in range(n)] for n in (64, 32)]
    return [[system + [(t + s) % args.vocab for t in own[0]], own[1]] for s in range(args.batch)]


def bench_serving(net: Any, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    outputs = {}
    for label, cache in (("on", True), ("off", False)):
        eng = engine(net, args, prefix_cache=cache, chunk_size=args.chunk)
        run = run_conversations(eng, sessions(args), args.new)
        eng.check()
        flat = [r for turns in run.results for r in turns]
        s = eng.stats()
        out[label] = {
            "seconds": run.seconds,
            "tokens_per_s": sum(len(r.output_ids) for r in flat) / run.seconds,
            "mean_ttft_s": statistics.mean(r.ttft_s for r in flat),
            "prefill_tokens": s["computed_prefill_tokens"],
            "hit_rate": s["hit_rate"],
        }
        outputs[label] = run.output_ids()
    same = sum(
        a == b
        for x, y in zip(outputs["on"], outputs["off"], strict=True)
        for p, q in zip(x, y, strict=True)
        for a, b in zip(p, q, strict=True)
    )
    total = sum(len(p) for x in outputs["on"] for p in x)
    out["on"]["same_tokens"] = same / total
    return out


class ForwardTimer:
    """Wraps an engine's `PoolAdapter.forward` to time it."""

    def __init__(self, eng: Engine, timer: Timer) -> None:
        self.inner, self.timer, self.seconds = eng.adapter.forward, timer, []
        eng.adapter.forward = self  # type: ignore[method-assign]

    def __call__(self, *args: Any) -> torch.Tensor:
        dt, out = self.timer(lambda: self.inner(*args))
        self.seconds.append(dt)
        return out  # type: ignore[no-any-return]


@torch.no_grad()
def plain_step(net: Any, ids: list[list[int]], start: int, cache: Any) -> list[int]:
    """A plain transformers forward on its own DynamicCache + greedy tokens."""
    dev = next(net.parameters()).device
    x = torch.tensor(ids, device=dev)
    pos = torch.arange(start, start + x.shape[1], device=dev).expand(x.shape[0], -1)
    out = net(input_ids=x, position_ids=pos, cache=cache, use_cache=True, logits_to_keep=1)
    return [int(t) for t in out.logits[:, -1].argmax(-1).tolist()]


def bench_overhead(net: Any, args: argparse.Namespace, timer: Timer) -> dict[str, list[Any]]:
    """Per kind of step, (plain s, engine step s, engine forward s) for `--repeats` steps,
    the plain forward and the engine step interleaved (so a load change hits both)."""
    from transformers import DynamicCache

    p, n = args.prompt, args.repeats
    fresh = lambda: DynamicCache(config=net.config)  # noqa: E731
    eng = engine(net, args, prefix_cache=False)
    fwd = ForwardTimer(eng, timer)

    def step(kind: str) -> float:
        dt, got = timer(eng.scheduler.step)
        assert got == kind, (got, kind)
        return dt

    res: dict[str, list[Any]] = {"prefill": [], "chunk": [], "decode": []}
    for i, q in enumerate(prompts(n, 2 * p, args.vocab, args.seed + 2, jitter=False)):
        plain = timer(lambda q=q: plain_step(net, [q[:p]], 0, fresh()))[0]  # 1. p tokens
        eng.scheduler.submit(Sequence(array("q", q[:p]), 1, id=i))
        res["prefill"].append((plain, step(PREFILL), fwd.seconds[-1]))
        cache = fresh()  # 2. p tokens after p of context
        plain_step(net, [q[:p]], 0, cache)
        plain = timer(lambda q=q, c=cache: plain_step(net, [q[p:]], p, c))[0]
        eng.scheduler.submit(Sequence(array("q", q), 1, id=n + i))
        step(PREFILL)
        res["chunk"].append((plain, step(PREFILL), fwd.seconds[-1]))
    ps = prompts(args.batch, p, args.vocab, args.seed + 4, jitter=False)  # 3. decode
    cache = fresh()
    tokens = plain_step(net, ps, 0, cache)
    seqs = [Sequence(array("q", q), n + 1, id=2 * n + i) for i, q in enumerate(ps)]
    for seq in seqs:
        eng.scheduler.submit(seq)
    while len(eng.scheduler.running) < len(seqs):
        step(PREFILL)
    for k in range(n):
        plain, tokens = timer(lambda t=tokens, k=k: plain_step(net, [[x] for x in t], p + k, cache))
        res["decode"].append((plain, step(DECODE), fwd.seconds[-1]))
    while eng.scheduler.busy:
        eng.scheduler.step()
    eng.check()
    return res


def build(args: argparse.Namespace) -> Any:
    preset = f"{args.family}-tiny"
    overrides = SIZES[args.family][args.size]
    net = build_model(preset, seed=args.seed, dtype=args.torch_dtype, overrides=overrides)
    args.vocab = int(net.config.vocab_size)
    return net.to(args.device)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--family", default="nemotron-h", choices=sorted(SIZES))
    ap.add_argument("--size", default="small", choices=["tiny", "small", "base"])
    ap.add_argument("--batch", type=int, default=8, help="running sequences")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens (decode, overhead)")
    ap.add_argument("--new", type=int, default=32, help="tokens generated per request")
    ap.add_argument("--system", type=int, default=512, help="shared prompt (serving)")
    ap.add_argument("--chunk", type=int, default=512, help="chunk size (serving)")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--kv-tokens", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sections", default="decode,serving,overhead")
    args = ap.parse_args()
    args.torch_dtype = getattr(torch, args.dtype)
    if args.kv_tokens is None:
        per_seq = args.system + 2 * args.prompt + 2 * args.new + 256
        args.kv_tokens = 2 * args.batch * per_seq
    return args


def main() -> None:
    args = parse()
    torch.set_num_threads(args.threads)
    timer = Timer(torch.device(args.device))
    start = time.perf_counter()
    net = build(args)
    params = sum(p.numel() for p in net.parameters())
    print(f"{args.family} {args.size}: {params / 1e6:.1f}M parameters, {args.dtype}, "
          f"{args.device}, {args.threads} threads")  # fmt: skip
    engine(net, args).generate(prompts(2, 16, args.vocab, 9, True), 4)  # warm-up
    plain_step(net, [[1] * 16], 0, None)
    sections = args.sections.split(",")
    if "decode" in sections:
        d = bench_decode(net, args, timer)
        print(f"\ndecode, {args.batch} sequences of ~{args.prompt} tokens, {args.new} new each")
        print(f"  batched: {d['batched']:9.1f} tok/s ({d['batched_forwards']:.0f} forwards)")
        print(f"  single:  {d['single']:9.1f} tok/s ({d['single_forwards']:.0f} forwards)")
        print(f"  batched / single: {d['ratio']:.2f}x  (target >= 4x)")
    if "serving" in sections:
        s = bench_serving(net, args)
        print(f"\nserving, {args.batch} sessions sharing {args.system} tokens, 2 rounds")
        for k in ("on", "off"):
            v = s[k]
            print(f"  cache {k:3}: {v['seconds']:7.2f} s  {v['tokens_per_s']:8.1f} out tok/s  "
                  f"TTFT {v['mean_ttft_s'] * 1e3:8.1f} ms  prefill {v['prefill_tokens']:7.0f}  "
                  f"hit {v['hit_rate']:.1%}")  # fmt: skip
        print(f"  wall off/on {s['off']['seconds'] / s['on']['seconds']:.2f}x, "
              f"TTFT off/on {s['off']['mean_ttft_s'] / s['on']['mean_ttft_s']:.2f}x, "
              f"same greedy tokens {s['on']['same_tokens']:.1%}")  # fmt: skip
    if "overhead" in sections:
        o = bench_overhead(net, args, timer)
        print(
            f"\noverhead vs a plain transformers forward (medians of {args.repeats}, interleaved)"
        )
        names = {
            "prefill": f"prefill {args.prompt}",
            "chunk": f"chunk {args.prompt} after {args.prompt}",
            "decode": f"decode x{args.batch} at {args.prompt}",
        }
        for k, rows in o.items():
            plain, step, fwd = (statistics.median(r[j] for r in rows) for j in range(3))
            ratio = statistics.median(r[1] / r[0] for r in rows)
            print(
                f"  {names[k]:24} plain {plain * 1e3:8.2f} ms  engine step {step * 1e3:8.2f} ms "
                f"({ratio:.2f}x)  pool forward {fwd * 1e3:8.2f} ms ({fwd / plain:.2f}x)"
            )
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
