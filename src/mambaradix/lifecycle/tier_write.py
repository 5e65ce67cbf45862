"""When a unit's bytes go down to the host tier: the write policy of `lifecycle.tiers`.

SGLang's HiCache has three (`--hicache-write-policy`, sglang 0.5.23
`managers/cache_controller.py`: "write_through", "write_through_selective",
"write_back"), and so does the tracker:

* WRITE_BACK (the default): a unit is copied down when the device lets go of it (an
  eviction demotes it); nothing is copied while it is on the device.
* WRITE_THROUGH: a unit is copied down when it is cached on the device (a node's KV when
  the node is added, its state when the state is); an eviction then only drops the device
  copy, and a unit whose copy the host has dropped since is gone (SGLang counts these as
  `write_through_unbacked_eviction`).
* WRITE_THROUGH_SELECTIVE: a node is copied down once it has been hit `hits` times, the
  insert that added it counting as its first hit; before that an eviction drops it.

SGLang 0.5.23's rule (`mem_cache/unified_radix_cache.py`: ``write_through_threshold = 1
if hicache_write_policy == "write_through" else 2``; `unified_cache/unified_tree_core.py`
`_inc_hit_count_and_check`: a node not backed up is written once ``hit_count >=
write_through_threshold``, a new leaf counting one, a split node keeping its child's count,
write_back counting nothing): write-through is the selective rule with a threshold of 1, and
the selective threshold is 2. SGLang counts a hit when a request's insert walks through a
node; here a hit is a request admitted on a matched prefix (`TierTracker.hit`), once per
admission, which is when the same request's insert later walks it.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["SELECTIVE_HITS", "WritePolicy", "as_write_policy", "write_threshold"]

SELECTIVE_HITS = 2  # SGLang 0.5.23's write_through_threshold for write_through_selective


class WritePolicy(Enum):
    WRITE_BACK = "back"
    WRITE_THROUGH = "through"
    WRITE_THROUGH_SELECTIVE = "through-selective"


def as_write_policy(value: object, name: str = "tier_write") -> WritePolicy:
    """`value` (a WritePolicy or its name: back, through, through-selective) as a
    WritePolicy; ValueError naming `name` otherwise."""
    if isinstance(value, WritePolicy):
        return value
    if isinstance(value, str):
        for policy in WritePolicy:
            if value == policy.value:
                return policy
    names = ", ".join(p.value for p in WritePolicy)
    raise ValueError(f"{name} must be one of {names} (or a WritePolicy), got {value!r}")


def write_threshold(policy: WritePolicy, hits: int = SELECTIVE_HITS) -> int | None:
    """Hits after which a node is copied down while on the device (None: never,
    write-back); `hits` is the selective policy's (ValueError unless an int >= 1)."""
    if isinstance(hits, bool) or not isinstance(hits, int) or hits < 1:
        raise ValueError(f"hits must be an int >= 1, got {hits!r}")
    if policy is WritePolicy.WRITE_BACK:
        return None
    return 1 if policy is WritePolicy.WRITE_THROUGH else hits
