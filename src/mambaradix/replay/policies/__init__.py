"""Checkpoint admission and eviction policies, each a small plug-in on the same
tree and the same scheduler.

    sglang               SGLang 0.5.15.post1, no_buffer: every prefill chunk end,
                         the prompt end (if decoding goes on), finish; LRU;
                         SGLang's scheduler rules (compat tree)
    sglang-extra-buffer  SGLang 0.5.15.post1's default for these models:
                         extra_buffer tracking (chunk-aligned prefill positions,
                         the branching point, every track_interval in decode)
    sglang-used          0.5.16+ (#31643): sglang's checkpoints; LRU refreshing
                         only the used state
    vllm                 vLLM 0.33.0 with default arguments: align mode, only the
                         prompt's replay boundary and shared-prefix junctions kept,
                         one block pool for KV and states with vLLM's free queue
                         (`vllm@dense`, `vllm@N`: other retention intervals)
    vllm-0.20-all        vLLM 0.20.0 "all" mode: every block boundary; LRU
    marconi              branch point + last decoded token; FLOP-aware utility,
                         alpha tuned online by replaying recent requests
    marconi-oracle       marconi with the best alpha of a grid in hindsight
                         (each alpha a full run; `mambaradix.replay.run`)
    mambaradix           ours: one value model, expected FLOPs saved per byte
                         held, for admission and eviction

Every constant lives in `constants`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mambaradix.replay.policies.base import (
    DefaultPolicy,
    NodeTable,
    Policy,
    PolicyContext,
    evict_in_order,
)
from mambaradix.replay.policies.mambaradix import ABLATIONS, MambaRadix
from mambaradix.replay.policies.marconi import Marconi
from mambaradix.replay.policies.sglang import SGLang, SGLangExtraBuffer, SGLangUsed
from mambaradix.replay.policies.vllm import VLLM, parse_retention
from mambaradix.replay.policies.vllm_020 import VLLM020All
from mambaradix.scheduler import CHUNK, DECODED, FINISH, PROMPT_END, STOP

ORACLE = "marconi-oracle"
"""Not one policy but a set of runs (`mambaradix.replay.run.replay`)."""

POLICIES: dict[str, Callable[[], Policy]] = {
    "sglang": SGLang,
    "sglang-extra-buffer": SGLangExtraBuffer,
    "sglang-used": SGLangUsed,
    "vllm": VLLM,
    "vllm-0.20-all": VLLM020All,
    "marconi": Marconi,
    ORACLE: Marconi,  # run once per alpha of its grid by the replay
    "mambaradix": MambaRadix,
}


SINGLE_RUN = [p for p in POLICIES if p != ORACLE]
"""The policies that cost one run per point (all but `marconi-oracle`)."""

FIXED_ALPHA = "marconi@"
"""`marconi@0.5`: Marconi with alpha fixed at 0.5 (no tuning): one run of the oracle."""


def fixed_alpha(name: str) -> float | None:
    """The alpha of a `marconi@ALPHA` name (a finite number >= 0), else None."""
    if not name.startswith(FIXED_ALPHA):
        return None
    try:
        alpha = float(name[len(FIXED_ALPHA) :])
    except ValueError:
        return None
    return alpha if 0 <= alpha < float("inf") else None


VLLM_RETENTION = "vllm@"
"""`vllm@dense`, `vllm@4160`: vLLM 0.33.0 with another retention interval."""


def vllm_retention(name: str) -> int | None | bool:
    """The retention interval of a `vllm@N` / `vllm@dense` name (None: dense), else False."""
    if not name.startswith(VLLM_RETENTION):
        return False
    try:
        return parse_retention(name[len(VLLM_RETENTION) :])
    except (TypeError, ValueError):
        return False


def is_known(name: str) -> bool:
    """A name `make_policy` builds, or `marconi-oracle`: a key of POLICIES, an
    ablation of ours (`ABLATIONS`), Marconi at a fixed alpha (`marconi@0.5`) or
    vLLM at another retention interval (`vllm@dense`, `vllm@4160`)."""
    return (
        name in POLICIES
        or name in ABLATIONS
        or fixed_alpha(name) is not None
        or vllm_retention(name) is not False
    )


def make_policy(name: str, **kwargs: Any) -> Policy:
    """The policy called `name` (`is_known`). `marconi-oracle` is not one
    policy: ask `mambaradix.replay.run.replay` for it."""
    if name == ORACLE:
        raise ValueError(f"{ORACLE} is a set of runs, one per alpha: use replay() or sweep()")
    if name in ABLATIONS:
        return MambaRadix(**ABLATIONS[name], **kwargs)
    alpha = fixed_alpha(name)
    if alpha is not None:
        return Marconi(alpha=alpha, **kwargs)
    retention = vllm_retention(name)
    if retention is not False:
        assert not isinstance(retention, bool)
        return VLLM(retention=retention, **kwargs)
    if name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    return POLICIES[name](**kwargs)


__all__ = [
    "ABLATIONS",
    "CHUNK",
    "DECODED",
    "FINISH",
    "FIXED_ALPHA",
    "ORACLE",
    "POLICIES",
    "PROMPT_END",
    "SINGLE_RUN",
    "STOP",
    "DefaultPolicy",
    "MambaRadix",
    "Marconi",
    "NodeTable",
    "Policy",
    "PolicyContext",
    "SGLang",
    "SGLangExtraBuffer",
    "SGLangUsed",
    "VLLM",
    "VLLM020All",
    "VLLM_RETENTION",
    "evict_in_order",
    "fixed_alpha",
    "is_known",
    "make_policy",
    "vllm_retention",
]
