"""SGLang's policies, each named by the release it models, in both strategies.

    sglang                            SGLang 0.5.23 (the current release), no_buffer
    sglang-extra-buffer               SGLang 0.5.23, extra_buffer (its default for
                                      Nemotron-H and Qwen3-Next)
    sglang-0.5.15.post1               SGLang 0.5.15.post1, no_buffer
    sglang-0.5.15.post1-extra-buffer  SGLang 0.5.15.post1, extra_buffer

Each runs that release's tree (`compat`) and scheduler rules (`sglang_rules`),
both proven against the release's own code (tests/test_differential*.py,
tests/test_lifecycle_differential*.py); docs/sglang-0.5.23.md lists what
changed between the two.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mambaradix.core.compat import SGLANG_0_5_15, SGLANG_0_5_23
from mambaradix.policies.base import BasePolicy
from mambaradix.policies.tier_rules import SGLANG_HICACHE, SGLANG_HICACHE_AUTO, TierRules

if TYPE_CHECKING:
    from mambaradix.geometry.profile import ModelProfile


class SGLang(BasePolicy):
    """SGLang 0.5.23, no_buffer: a state at every prefill chunk end and at the
    prompt end (a checkpoint when the request goes on decoding), and at finish;
    the tree's LRU (UnifiedRadixCache: a match refreshes only the state it uses,
    state-less ancestors of an evicted leaf stay as KV-only leaves); SGLang's
    scheduler rules (the slots a batch takes, KV eviction of the shortfall)."""

    name = "sglang"
    compat: str | None = SGLANG_0_5_23
    sglang_rules = True


class SGLangExtraBuffer(SGLang):
    """SGLang 0.5.23's default strategy for Nemotron-H and Qwen3-Next (a default
    deployment runs it): extra_buffer, ping-pong track slots, states only at
    tracked positions (chunk-aligned prefill positions, the branching point,
    every track_interval while decoding). Departure: its overlap scheduler (on
    by default with extra_buffer) processes a step's results while the next step
    runs; the replay's loop is the non-overlap one, so finished requests are
    cached and freed one step earlier than there. The two track slots per
    request are the overlap default's."""

    name = "sglang-extra-buffer"
    strategy = "extra_buffer"


class SGLang0515(SGLang):
    """SGLang 0.5.15.post1, no_buffer: the same checkpoints; its tree refreshes
    the whole matched path in both LRU lists and deletes a leaf with its
    state-less ancestors; its scheduler keeps 3 free state slots per request of a
    prefill batch and evicts a whole allocation's KV when it does not fit."""

    name = "sglang-0.5.15.post1"
    compat: str | None = SGLANG_0_5_15


class SGLang0515ExtraBuffer(SGLang0515):
    """SGLang 0.5.15.post1's extra_buffer (see `SGLangExtraBuffer` for the
    strategy and the departure)."""

    name = "sglang-0.5.15.post1-extra-buffer"
    strategy = "extra_buffer"


class SGLangHiCache(SGLang):
    """SGLang 0.5.23 with HiCache for Mamba (`--enable-hierarchical-cache`): the
    `sglang` row's checkpoints (one per prefill chunk and per finished request) on the
    device, and with `--host-gb` / `--store-gb` HiCache's tier rules
    (`policies.tier_rules.SGLANG_HICACHE`): the host split into a KV pool and a state pool
    in proportion to the device pools' bytes (sglang #32915), every evicted state
    demoted, the deepest hit loaded. Without tiers it is the `sglang` row."""

    name = "sglang-hicache"

    def tier_rules(self, profile: ModelProfile) -> TierRules:
        return SGLANG_HICACHE


class SGLangHiCacheAuto(SGLangHiCache):
    """`sglang-hicache` with the host state pool sized by SGLang's proposed `auto` rule
    (sglang #39436, `tier_rules.auto_kv_share`) instead of in proportion to the device."""

    name = "sglang-hicache-auto"

    def tier_rules(self, profile: ModelProfile) -> TierRules:
        return SGLANG_HICACHE_AUTO


_BY_RELEASE: dict[tuple[str, bool], type[SGLang]] = {
    (SGLANG_0_5_23, False): SGLang,
    (SGLANG_0_5_23, True): SGLangExtraBuffer,
    (SGLANG_0_5_15, False): SGLang0515,
    (SGLANG_0_5_15, True): SGLang0515ExtraBuffer,
}

RETIRED = {
    "sglang-used": "it modelled SGLang 0.5.16's LRU (refresh only the state a match uses, #31643) "
    "over 0.5.15.post1's rules; SGLang 0.5.23 (`sglang`) refreshes only the consumed state: "
    "use `sglang`"
}
"""Policy names that no longer run, and why (`make_policy` says so)."""


def sglang_policy(release: str, extra_buffer: bool) -> SGLang:
    """The policy of an SGLang release (an explicit name, `core.compat`)."""
    return _BY_RELEASE[(release, extra_buffer)]()
