"""A hand-built model profile shared by the replay tests: numbers small enough to
work out by hand."""

from __future__ import annotations

from mambaradix.geometry.profile import ModelProfile

# 1000 B of KV per token, a 20 kB state. vLLM's block is the attention block padded to
# one state's bytes: ceil(20000 / 1000) = 20 tokens, rounded up to a multiple of 16 -> 32.
TINY = ModelProfile(
    name="tiny",
    source="hand-built for tests",
    kv_bytes_per_token=1000,
    state_bytes=20_000,
    linear_flops_per_token=10**9,
    attn_flops_per_pair=10**6,
)
