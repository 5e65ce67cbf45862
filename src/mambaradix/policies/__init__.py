"""The policy layer: admission, checkpoints and eviction, one plug-in each, on the
same tree and the same scheduler, below the scheduler (core <- pools <- lifecycle
<- policies <- scheduler <- replay, engine <- cli).

    Policy            the protocol the scheduler, the engine and the replay run
                      (`protocol`: what each member may mutate and when)
    BasePolicy        the base class of the policies below (`base`)
    PolicyTree        the tree as policies see it (`seam`)
    PolicyContext     what a run tells a policy (`base`)
    CHUNK, STOP, ...  the checkpoint kinds (`kinds`)

The registry (`make_policy(name)`, `POLICIES`):

    default              the engine's default: chunk ends, the branch point,
                         input - 1, finish; the tree's LRU

    sglang               SGLang 0.5.23 (current release), no_buffer: every
                         prefill chunk end, the prompt end (if decoding goes on),
                         finish; its tree's LRU and scheduler rules (compat tree)
    sglang-extra-buffer  SGLang 0.5.23's default for these models: extra_buffer
                         tracking (chunk-aligned prefill positions, the branching
                         point, every track_interval in decode)
    sglang-0.5.15.post1  SGLang 0.5.15.post1, no_buffer (its tree and rules)
    sglang-0.5.15.post1-extra-buffer
                         SGLang 0.5.15.post1, extra_buffer
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
    sglang-hicache       sglang with HiCache's tier rules (`policies.tier_rules`)
    sglang-hicache-auto  the same, host state pool by SGLang's proposed `auto` rule
    vllm-offload         vllm with its native CPU offload's tier rules

Every constant lives in `constants`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mambaradix.core.compat import is_sglang
from mambaradix.policies.base import (
    BasePolicy,
    DefaultPolicy,
    NodeTable,
    PolicyContext,
    evict_in_order,
    own_memory,
    own_page,
)
from mambaradix.policies.kinds import CHUNK, DECODED, FINISH, PROMPT_END, STOP
from mambaradix.policies.mambaradix import ABLATIONS, MambaRadix
from mambaradix.policies.marconi import Marconi
from mambaradix.policies.protocol import Policy
from mambaradix.policies.seam import PolicyTree
from mambaradix.policies.sglang import (
    RETIRED,
    SGLang,
    SGLang0515,
    SGLang0515ExtraBuffer,
    SGLangExtraBuffer,
    SGLangHiCache,
    SGLangHiCacheAuto,
    sglang_policy,
)
from mambaradix.policies.vllm import VLLM, VLLMOffload, parse_retention
from mambaradix.policies.vllm_020 import VLLM020All
from mambaradix.policies.wrap import PolicyWrapper
from mambaradix.validate import suggest

ORACLE = "marconi-oracle"
"""Not one policy but a set of runs (`mambaradix.replay.run.replay`)."""

POLICIES: dict[str, Callable[[], Policy]] = {
    "sglang": SGLang,
    "sglang-extra-buffer": SGLangExtraBuffer,
    "sglang-0.5.15.post1": SGLang0515,
    "sglang-0.5.15.post1-extra-buffer": SGLang0515ExtraBuffer,
    "vllm": VLLM,
    "vllm-0.20-all": VLLM020All,
    "marconi": Marconi,
    ORACLE: Marconi,  # run once per alpha of its grid by the replay
    "mambaradix": MambaRadix,
    "sglang-hicache": SGLangHiCache,
    "sglang-hicache-auto": SGLangHiCacheAuto,
    "vllm-offload": VLLMOffload,
    "default": DefaultPolicy,  # the engine's default; the replay runs it when named
}


SINGLE_RUN = [p for p in POLICIES if p != ORACLE]
"""The policies that cost one run per point (all but `marconi-oracle`)."""

OLDER_RELEASES = ("sglang-0.5.15.post1", "sglang-0.5.15.post1-extra-buffer")

TIER_ROWS = ("sglang-hicache", "sglang-hicache-auto", "vllm-offload")
"""Peers' tiered setups: run by default only with a lower tier (`--host-gb`, `--store-gb`);
without one each is its device row (`sglang`, `vllm`)."""
"""Rows of releases users no longer run: selectable by name, not run by default."""

DEFAULT_RUN = [
    p for p in SINGLE_RUN if p not in OLDER_RELEASES and p not in TIER_ROWS and p != "default"
]
"""What the replay runs when no policy is named (`--policy`)."""

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


def retired_reason(names: list[str]) -> str | None:
    """Why the first retired name among `names` no longer runs, or None."""
    for name in names:
        if name in RETIRED:
            return f"policy {name!r} was retired: {RETIRED[name]}"
    return None


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
    if name in RETIRED:
        raise KeyError(f"policy {name!r} was retired: {RETIRED[name]}")
    if name not in POLICIES:
        known = ", ".join(POLICIES)
        raise KeyError(f"unknown policy {name!r}; choose from {known}{suggest(name, POLICIES)}")
    return POLICIES[name](**kwargs)


def default_policy(compat: str | None, strategy: str = "no_buffer") -> Policy:
    """The policy a tree of `compat` (resolved) implies when none is named: the
    SGLang release's (its strategy) on an SGLang tree, else `DefaultPolicy` with
    `strategy`. What the scheduler and the engine run by default."""
    if compat is not None and is_sglang(compat):
        return sglang_policy(compat, strategy == "extra_buffer")
    policy = DefaultPolicy()
    policy.strategy = strategy
    return policy


__all__ = [
    "ABLATIONS",
    "BasePolicy",
    "CHUNK",
    "DEFAULT_RUN",
    "DECODED",
    "FINISH",
    "FIXED_ALPHA",
    "OLDER_RELEASES",
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
    "PolicyTree",
    "PolicyWrapper",
    "RETIRED",
    "SGLang",
    "SGLang0515",
    "SGLang0515ExtraBuffer",
    "SGLangExtraBuffer",
    "SGLangHiCache",
    "SGLangHiCacheAuto",
    "TIER_ROWS",
    "VLLM",
    "VLLMOffload",
    "VLLM020All",
    "VLLM_RETENTION",
    "default_policy",
    "evict_in_order",
    "fixed_alpha",
    "is_known",
    "make_policy",
    "own_memory",
    "own_page",
    "retired_reason",
    "sglang_policy",
    "vllm_retention",
]
