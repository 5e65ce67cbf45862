"""`Engine`: a reference serving engine for real hybrid models on the prefix cache.

It is the project's one request driver (`mambaradix.scheduler.Scheduler`:
SGLang's continuous batching with prefill priority, chunked prefill, admission
budgets, retraction) with the real model as its forward (`TorchForward`: one
forward per prefill chunk, one per decode step for every decoding sequence)
and the project's pools as its memory, on one device: attention K/V in a KV
pool indexed by the lifecycle's KV indices, conv and SSM states in a
`TorchStatePool`, the radix tree owning what is cached. Decoding is greedy.

Strategies as in SGLang: `no_buffer` (page_size 1; a checkpoint copies the
running state where the prefill stopped: chunk ends, the branch point and
input - 1 in the default mode) and `extra_buffer` (any page size; the forward
writes the state at the tracked position into a ping-pong slot, which the tree
takes). `prefix_cache=False` runs the same loop with nothing ever cached.

Where states are cached and what is evicted is a `mambaradix.policies.Policy`, the
same object the replay runs (`Engine(policy="mambaradix")`): attached to a
`PolicyContext` of the engine's own model profile, pools, tree and request table,
its `evict` the cache manager's evictor.
"""

from __future__ import annotations

import copy
import os
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

import torch

from mambaradix.core.compat import resolve_compat
from mambaradix.core.tree import MambaRadixCache
from mambaradix.engine.adapter import PoolAdapter
from mambaradix.engine.checks import check_generate_args, check_net_type, memory_shortfall
from mambaradix.engine.config import EngineConfig
from mambaradix.engine.deterministic import GridCheckpoints
from mambaradix.engine.device import check_net, resolve_device
from mambaradix.engine.forward import TorchForward
from mambaradix.engine.models import build_model, engine_profile
from mambaradix.engine.results import EngineStats
from mambaradix.engine.tiers import HostTier, TierLookup
from mambaradix.geometry.profile import ModelProfile
from mambaradix.lifecycle import CacheManager, Evictor, Request
from mambaradix.lifecycle.tier_write import WritePolicy
from mambaradix.policies import BasePolicy, Policy, PolicyContext, default_policy
from mambaradix.pools import (
    PagedKVAllocator,
    ReqToTokenTable,
    StateSlotAllocator,
    TokenKVAllocator,
)
from mambaradix.scheduler import Scheduler, SchedulerConfig, Sequence
from mambaradix.tiers.cost import LoadRule

__all__ = ["Engine", "Result", "TorchForward"]


@dataclass
class Result:
    """One prompt's outcome.

    `prompt_tokens` / `cached_tokens`: the prompt length and the prompt tokens
    served from the cache, of the admission that completed (a retracted
    sequence is admitted again with input + generated-so-far as its prompt).
    `logits[i]` are the fp32 logits that chose `output_ids[i]`."""

    output_ids: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    cached_tokens: int = 0
    prompt_tokens: int = 0
    retractions: int = 0
    ttft_s: float = 0.0
    latency_s: float = 0.0


class NoCache(BasePolicy):
    """Never checkpoint, never insert: the tree stays empty."""

    name = "no-cache"

    def cache_at(self, req: Request, kind: str) -> bool:
        return False

    def insert_at_finish(self, req: Request) -> bool:
        return False


class Engine:
    """Serve greedy generations of a hybrid `transformers` model on the cache.

    model: a preset (`"nemotron-h-tiny"`, `"qwen3-next-tiny"`) or a local
    checkpoint directory. kv_tokens / state_slots: pool sizes; chunk_size:
    prefill chunk (SGLang's chunked prefill size); max_running: sequences
    running at once (also the rows of the request table); max_context:
    longest sequence; page_size / strategy: as SGLang's `--page-size` and
    `--mamba-radix-cache-strategy`; compat: an SGLang release's tree and
    rules ("sglang-0.5.23", "sglang-0.5.15.post1"; "sglang": the current one);
    policy: where states are cached, which are admitted and what is evicted, a
    name of the registry (`mambaradix.policies.POLICIES`: "default", "sglang",
    "mambaradix", "marconi", ...) or a `mambaradix.policies.Policy`; None: the
    one the compat implies ("default", or the SGLang release's policy). A named
    policy brings its strategy and tree release: `strategy` and `compat`, when
    given, must agree (left unset, they are the policy's). Policies that lay
    out memory their own way (vLLM's block pool) are refused; marconi does not
    tune its alpha here (no replay to tune it on: alpha 0, or `marconi@ALPHA`).
    The cache persists across `generate` calls.

    device / dtype: where the model, the KV pool and the state pool live
    ("cpu", "cuda", "cuda:N"; ValueError if CUDA is asked for and absent) and
    the model's dtype (recurrent states keep the dtype the model gives them).
    A model handed in as `net` must already be there.
    batch_decode: every decoding sequence advances in one forward per step
    (False: one forward per sequence). deterministic: every prefill is cut on
    one grid of `chunk_size` positions and states are cached only there
    (`mambaradix.engine.deterministic`), so the cache cannot change a prefill
    computation (no_buffer strategy only). keep_logits: keep the logits of
    every generated token in the results.

    host_state_slots / host_kv_tokens: a host-memory tier (L2, `engine.tiers`):
    states and KV tokens the device tree evicts are copied into host pools of
    that many slots and tokens, and loaded back when a later request's prefix
    is there (both 0: no host tier; both > 0 with the cache on).
    store_dir / store_gb: a file store (L3) below the host tier, of that many
    GB: what the host drops is written there (`engine.tier_store`); it is read back
    by a later engine on the same directory, model and layout.
    tier_write: when units go down to the host ("back", "through",
    "through-selective" or a `WritePolicy`, `lifecycle.tier_write`). tier_cost: a
    `tiers.cost.LoadRule` to load or recompute each hit by cost (None: load the
    deepest hit). prefetch_wait_s: with a store, what a batch's prompts would load
    from the store is read into the host on a worker thread as they are submitted, a
    match waiting at most that many seconds for it (None: no prefetch); `close` joins it.
    """

    def __init__(
        self,
        model: str = "nemotron-h-tiny",
        seed: int = 0,
        prefix_cache: bool = True,
        kv_tokens: int = 65536,
        state_slots: int = 64,
        chunk_size: int = 256,
        max_running: int = 8,
        max_context: int | None = None,
        dtype: torch.dtype = torch.float32,
        model_overrides: dict[str, Any] | None = None,
        net: Any = None,
        page_size: int = 1,
        strategy: str | None = None,
        compat: str | None = None,
        track_interval: int = 256,
        policy: str | Policy | None = None,
        sglang_rules: bool | str | None = None,
        device: str | torch.device = "cpu",
        batch_decode: bool = True,
        deterministic: bool = False,
        keep_logits: bool = True,
        host_state_slots: int = 0,
        host_kv_tokens: int = 0,
        store_dir: str | os.PathLike[str] | None = None,
        store_gb: float = 0.0,
        tier_write: str | WritePolicy = "back",
        tier_cost: LoadRule | None = None,
        prefetch_wait_s: float | None = None,
    ) -> None:
        config = EngineConfig(
            model, seed, prefix_cache, kv_tokens, state_slots, chunk_size, max_running,
            max_context, dtype, model_overrides, page_size, strategy, compat, track_interval,
            policy, sglang_rules, device, batch_decode, deterministic, keep_logits,
            host_state_slots, host_kv_tokens, store_dir, store_gb, tier_write, tier_cost,
            prefetch_wait_s,
        )  # fmt: skip
        self._build(config, net)

    @classmethod
    def from_config(cls, config: EngineConfig, net: Any = None) -> Engine:
        """An engine of a config made beforehand (checked when it was made), on `net`
        (None: the model the config names, built from its seed)."""
        if not isinstance(config, EngineConfig):
            raise TypeError(f"config must be an EngineConfig, got {type(config).__name__}")
        engine = cls.__new__(cls)
        engine._build(config, net)
        return engine

    def _build(self, config: EngineConfig, net: Any) -> None:
        """Everything from a checked config; `net` is checked here (it is not configuration)."""
        self.config = c = config
        named, strategy, dtype, host_tier, store_bytes, write = c.resolved
        if isinstance(c.policy, str):  # a fresh copy: the config builds any number of engines
            named = copy.deepcopy(named)
        check_net_type(net)
        self.device = resolve_device(c.device)
        if net is not None:
            check_net(net, self.device, dtype)
        else:
            net = build_model(c.model, c.seed, dtype, c.model_overrides).to(self.device)
        _check_memory(net, c.kv_tokens, c.state_slots, c.max_running, c.max_context, c.page_size)
        self.model_name, self.net = c.model, net
        self.prefix_cache, self.deterministic = c.prefix_cache, c.deterministic
        self.max_context = c.max_context
        self.adapter = PoolAdapter(self.net, c.kv_tokens, c.state_slots)
        tree_compat = c.compat if c.compat is not None or named is None else named.compat
        deciding = (
            named if named is not None else default_policy(resolve_compat(tree_compat), strategy)
        )
        self.policy: Policy = deciding if c.prefix_cache else NoCache()
        self._blank = copy.deepcopy(self.policy)  # unattached: `fresh_policy`
        sglang_rules = c.sglang_rules
        if sglang_rules is None:  # the rules of the policy the cache would run, on or off
            sglang_rules = deciding.sglang_rules
        self.mgr = _cache_manager(
            self.adapter, c.kv_tokens, c.state_slots, c.max_running, c.max_context, c.page_size,
            strategy, tree_compat, self.policy.evict, sglang_rules,
        )  # fmt: skip
        self.forward = TorchForward(self.adapter, self.mgr, c.batch_decode, c.keep_logits)
        cfg = SchedulerConfig(
            chunk_tokens=c.chunk_size,
            max_running=c.max_running,
            track_interval=c.track_interval,
            truncation_align_size=c.chunk_size if c.deterministic else None,
        )
        hooks: Policy = self.policy
        if c.deterministic and c.prefix_cache:
            hooks = GridCheckpoints(hooks, c.chunk_size)
        self.host_tier: HostTier | None = None
        if host_tier:
            store = None if c.store_dir is None else (c.store_dir, store_bytes, str(c.model))
            self.host_tier = HostTier(
                self.mgr, self.adapter, c.host_state_slots, c.host_kv_tokens, self.device, store,
                write, c.tier_cost, c.prefetch_wait_s,
            )  # fmt: skip
            hooks = TierLookup(hooks, self.host_tier)
        self.scheduler = Scheduler(self.mgr, self.forward, hooks, cfg, on_finish=self._done)
        self.profile = engine_profile(self.net, str(c.model))
        self.policy.attach(self._context(self.profile, c.chunk_size))
        self._stats = dict.fromkeys(
            (
                "requests",
                "prompt_tokens",
                "cached_tokens",
                "computed_prefill_tokens",
                "decode_tokens",
                "retractions",
                "retracted_prefill_tokens",
            ),
            0,
        )

    def _context(self, profile: ModelProfile, chunk_size: int) -> PolicyContext:
        """What the policy knows of this engine: its model's profile, one token per
        unit, its own pools, tree, request table, cache manager and queue (as the
        replay's `ServingModel._context` for the same pools)."""
        mgr = self.mgr
        return PolicyContext(
            profile,
            1,
            chunk_size,
            profile.kv_bytes_per_token,
            mgr.kv.capacity,
            mgr.slots.capacity,
            mgr.slots.available_size,
            tree=mgr.tree,
            state_bytes=self.policy.state_bytes(profile),
            budget_units=chunk_size,
            rows=mgr.rows,
            cache=mgr,
            waiting=lambda: [seq.req for seq in self.scheduler.waiting],
        )

    def _done(self, seq: Sequence) -> None:
        self.policy.on_request_done()  # a finished request (Marconi counts them)

    def fresh_policy(self) -> Policy:
        """A new, unattached copy of this engine's policy as it was before the engine
        attached it (for another driver: `compare.replay_prediction`)."""
        return copy.deepcopy(self._blank)

    @property
    def vocab_size(self) -> int:
        return self.adapter.vocab_size

    # ------------------------------------------------------------------ API

    def generate(self, prompts: list[list[int]], max_new_tokens: int = 16) -> list[Result]:
        """Greedy-decode `max_new_tokens` for every prompt (token id lists),
        batched by the scheduler. Returns one `Result` per prompt.
        TypeError / ValueError first for ids that are not ints in the
        vocabulary, and for a prompt that cannot be admitted even alone."""
        prompts = check_generate_args(self, prompts, max_new_tokens)
        if max_new_tokens == 0:
            return [Result(prompt_tokens=len(p)) for p in prompts]
        t0 = time.perf_counter()
        seqs = [Sequence(array("q", p), max_new_tokens, id=i) for i, p in enumerate(prompts)]
        for seq in seqs:
            seq.arrival = t0
            self.scheduler.submit(seq)
        if self.host_tier is not None:
            self.host_tier.prefetch(prompts)
        try:
            self.scheduler.run()
        except BaseException:
            for seq in seqs:  # free what the failed call holds: the engine stays usable
                self.scheduler.abort(seq)
            raise
        if self.host_tier is not None:
            self.host_tier.flush()  # write-through copies of the last inserts, prefetches
        return [self._result(seq, t0) for seq in seqs]

    def _result(self, seq: Sequence, t0: float) -> Result:
        s = self._stats
        s["requests"] += 1
        s["prompt_tokens"] += seq.prompt_tokens
        s["cached_tokens"] += seq.cached_tokens
        s["computed_prefill_tokens"] += seq.prefill_tokens - seq.retracted_tokens
        s["decode_tokens"] += len(seq.outputs) - 1
        s["retractions"] += seq.retractions
        s["retracted_prefill_tokens"] += seq.retracted_tokens
        return Result(
            output_ids=list(seq.outputs),
            logits=self.forward.logits.pop(id(seq), []),
            cached_tokens=seq.cached_tokens,
            prompt_tokens=seq.prompt_tokens,
            retractions=seq.retractions,
            ttft_s=(seq.first_token_time or t0) - t0,
            latency_s=(seq.finish_time or t0) - t0,
        )

    def stats(self) -> EngineStats:
        """Counters since construction (`results.EngineStats`)."""
        s = self._stats
        kv, states = self.mgr.evictions["kv_tokens"], self.mgr.evictions["states"]
        return EngineStats(
            requests=s["requests"],
            prompt_tokens=s["prompt_tokens"],
            cached_tokens=s["cached_tokens"],
            computed_prefill_tokens=s["computed_prefill_tokens"],
            decode_tokens=s["decode_tokens"],
            retractions=s["retractions"],
            retracted_prefill_tokens=s["retracted_prefill_tokens"],
            forwards=self.forward.forwards,
            decode_forwards=self.forward.decode_forwards,
            hit_rate=s["cached_tokens"] / s["prompt_tokens"] if s["prompt_tokens"] else 0.0,
            evicted_kv_tokens=kv,
            evicted_states=states,
            evictions=kv + states,
            host=None if self.host_tier is None else dict(self.host_tier.stats),
        )

    def check(self) -> None:
        """Leak checks (raise AssertionError): conservation of KV indices and
        state slots, the tree's invariants, and the host tier's (`HostTier.check`)."""
        self.mgr.check_conservation()
        self.mgr.tree.check_invariants()
        if self.host_tier is not None:
            self.host_tier.check()

    def close(self) -> None:
        """Finish the tiers' work in flight and join their worker thread."""
        if self.host_tier is not None:
            self.host_tier.close()

    def reset_cache(self) -> None:
        """Drop everything the tree caches (no request may be running)."""
        if self.mgr.active:
            raise RuntimeError("requests are running")
        if self.host_tier is not None:
            self.host_tier.flush()  # copies queued from units the reset frees
        r = self.mgr.tree.reset()
        if r.freed_kv:
            self.mgr.kv.free(r.freed_kv)
        if r.freed_states:
            self.mgr.slots.free(r.freed_states)


def _check_memory(
    net: Any, kv: int, slots: int, rows: int, max_context: int | None, page: int
) -> None:
    """ValueError naming the sizes when the pools would not fit (before any is made)."""
    short = memory_shortfall(net, kv, slots, rows, (max_context or kv) + page)
    if short is not None:
        names = [f"kv_tokens={kv:,}", f"state_slots={slots:,}", f"max_running={rows:,}"]
        names += [] if max_context is None else [f"max_context={max_context:,}"]
        raise ValueError(f"{', '.join(names[:-1])} and {names[-1]} {short}")


def _cache_manager(
    adapter: PoolAdapter,
    kv_tokens: int,
    state_slots: int,
    max_running: int,
    max_context: int | None,
    page_size: int,
    strategy: str,
    compat: str | None,
    evictor: Evictor,
    sglang_rules: bool | str | None,
) -> CacheManager:
    # SGLang: max(FLA chunk 64, page_size), which must divide each other; a page
    # that does not divide 64 rounds it up to whole pages, as the replay does
    mamba_chunk = -(-max(64, page_size) // page_size) * page_size
    kv = TokenKVAllocator(kv_tokens) if page_size == 1 else PagedKVAllocator(kv_tokens, page_size)
    return CacheManager(
        MambaRadixCache(page_size=page_size, chunk_size=mamba_chunk, compat=compat),
        kv,
        StateSlotAllocator(state_slots),
        adapter.states,
        ReqToTokenTable(max_running, (max_context or kv_tokens) + page_size),
        strategy=strategy,
        evictor=evictor,
        sglang_rules=sglang_rules,
    )
