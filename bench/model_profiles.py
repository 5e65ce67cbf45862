"""Print the README's model-profile table, every number derived from the
models' per-layer geometry (`mambaradix.geometry`).

    .venv/bin/python bench/model_profiles.py
"""

from __future__ import annotations

from mambaradix.geometry.profile import PROFILES, ModelProfile

SHOWN = ("nemotron-h-8b", "qwen3-next-80b-a3b", "jamba-1.5-mini", "marconi-7b")


def _row(p: ModelProfile) -> str:
    g0, g8 = p.prefill_flops(0, 1) / 1e9, p.prefill_flops(8192, 1) / 1e9
    vllm_ssm = p.vllm_state_dtypes.ssm if p.vllm_state_dtypes else "?"
    return (
        f"| `{p.name}` | {p.kv_bytes_per_token:,} | {p.state_bytes / 1e6:.1f} MB "
        f"| {g0:.1f} G / {g8:.1f} G | {p.vllm_block_tokens:,} "
        f"| {p.vllm_state_bytes / 1e6:.1f} MB ({vllm_ssm} SSM) |"
    )


def main() -> None:
    print(
        "| profile | KV bytes/token | bytes per state | prefill FLOPs/token at 0 / 8k context "
        "| vLLM block (tokens) | vLLM bytes per state |"
    )
    print("|---|---|---|---|---|---|")
    for name in SHOWN:
        print(_row(PROFILES[name]))


if __name__ == "__main__":
    main()
