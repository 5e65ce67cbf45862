"""Write the bundled sample trace, src/mambaradix/data/sample/sample_trace.jsonl.

Six MT-Bench questions that have GPT-4 reference answers (so every answer is
real text), two turns each, through the Mistral v7 chat template (each turn's
prompt is the whole conversation before it), in the neutral JSONL schema
version 2. Arrivals as `load_mt_bench` makes them (seeded): sessions start as
a Poisson process at 0.2/s; a turn's think time (recorded as ``think_s``) is
exponential with mean 20 s after the previous answer (its tokens at 50/s).

Needs the `text` extra. Run from the repository root:
    PYTHONPATH=src python scripts/make_sample_trace.py
"""

from __future__ import annotations

import json
from pathlib import Path

from mambaradix.replay.workloads import save_jsonl
from mambaradix.replay.workloads.sources import mt_bench_conversations
from mambaradix.replay.workloads.text import MT_BENCH_SOURCE, _synthetic_trace

OUT = Path("src/mambaradix/data/sample/sample_trace.jsonl")
LICENSE = (
    "Apache-2.0: MT-Bench questions and GPT-4 reference answers (lm-sys/FastChat); "
    "Mistral v7 tokenizer (mistral-common); see ATTRIBUTION.md next to this file"
)


def main() -> None:
    answered = {101 + i for i in range(30)}  # the question ids with reference answers
    convs = [c for c in mt_bench_conversations() if c.session_id in answered][:6]
    trace = _synthetic_trace(
        "sample",
        MT_BENCH_SOURCE,
        convs,
        seed=0,
        session_rate=0.2,
        think_time_s=20.0,
        decode_tps=50.0,
        max_prompt_tokens=None,
    )
    save_jsonl(trace, OUT)
    lines = OUT.read_text().splitlines()
    header = json.loads(lines[0])
    header["license"] = LICENSE
    OUT.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    print(f"{OUT}: {len(trace)} requests, {OUT.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
