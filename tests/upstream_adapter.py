"""What the adapters of SGLang's trees share: ``upstream_sglang.UpstreamCache`` (0.5.15.post1's
``MambaRadixCache``) and ``upstream_unified.UpstreamUnifiedCache`` (0.5.23's
``UnifiedRadixCache``) put the API of ``mambaradix.MambaRadixCache`` in front of upstream's
tree, with fake pools that record what the tree frees; insert, evict, the size counters and
the checks are called the same way in both releases.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

import torch

from mambaradix.core.results import EvictResult, InsertResult


def ints(indices: Any) -> list[int]:
    if isinstance(indices, torch.Tensor):
        return [int(i) for i in indices.reshape(-1).tolist()]
    return [int(i) for i in indices]


class Recorder:
    """A fake pool's ``free``: records the freed indices in order; ``take`` hands them over."""

    def __init__(self) -> None:
        self.freed: list[int] = []

    def free(self, indices: Any) -> None:
        self.freed.extend(ints(indices))

    def take(self) -> list[int]:
        out, self.freed = self.freed, []
        return out


class UpstreamAdapter:
    """The shared calls. A subclass sets ``inner`` (upstream's tree), ``kv`` and ``req_pool``
    (fakes whose ``take`` hands over what was freed, ``req_pool.mamba_allocator`` for states)
    and, with ``_bind``, the release's parameter classes."""

    inner: Any
    kv: Any
    req_pool: Any

    def _bind(self, base_prefix_cache: Any, radix_cache: Any) -> None:
        self._MatchPrefixParams = base_prefix_cache.MatchPrefixParams
        self._InsertParams = base_prefix_cache.InsertParams
        self._EvictParams = base_prefix_cache.EvictParams
        self._RadixKey = radix_cache.RadixKey

    def _key(self, key: Sequence[int], extra_key: str | None) -> Any:
        return self._RadixKey(array("q", key), extra_key)

    def insert(
        self,
        key: Sequence[int],
        kv_indices: Sequence[int],
        state: int,
        prev_prefix_len: int = 0,
        extra_key: str | None = None,
    ) -> InsertResult:
        self.kv.take()
        res = self.inner.insert(
            self._InsertParams(
                key=self._key(key, extra_key),
                value=torch.tensor(list(kv_indices), dtype=torch.int64),
                mamba_value=torch.tensor([state], dtype=torch.int64),
                prev_prefix_len=prev_prefix_len,
            )
        )
        self.last_insert_node = res.last_device_node
        return InsertResult(res.prefix_len, bool(res.mamba_exist), array("q", self.kv.take()))

    def _evict_result(self, res: Any) -> EvictResult:
        return EvictResult(
            kv_tokens=res.num_tokens_evicted,
            states=res.mamba_num_evicted,
            freed_kv=array("q", self.kv.take()),
            freed_states=self.req_pool.mamba_allocator.take(),
        )

    def evict(self, kv_tokens: int = 0, states: int = 0) -> EvictResult:
        self.kv.take()
        self.req_pool.mamba_allocator.take()
        return self._evict_result(
            self.inner.evict(self._EvictParams(num_tokens=kv_tokens, mamba_num=states))
        )

    def full_evictable_size(self) -> int:
        return int(self.inner.full_evictable_size())

    def full_protected_size(self) -> int:
        return int(self.inner.full_protected_size())

    def state_evictable_size(self) -> int:
        return int(self.inner.mamba_evictable_size())

    def state_protected_size(self) -> int:
        return int(self.inner.mamba_protected_size())

    def sanity_check(self) -> None:
        """Upstream's check; valid only while no locks are held."""
        self.inner.sanity_check()

    def pretty_print(self) -> None:
        self.inner.pretty_print()
