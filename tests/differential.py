"""Seeded random operation streams driven through two caches side by side.

`run_differential` feeds the same insert / match / lock / unlock / evict stream
to two objects with the MambaRadixCache API and raises on the first result that
differs. Keys share prefixes on purpose (tenants, branches, random cuts), so
splits, tombstones, cascades and the restart-from-tail rule all occur.
"""

from __future__ import annotations

import random
from array import array
from typing import Any


class OpStream:
    """Random keys built by extending and cutting earlier keys."""

    def __init__(self, seed: int, page_size: int, namespaces: tuple[Any, ...] = (None, "lora-a")):
        self.rng = random.Random(seed)
        self.page = page_size
        self.namespaces = namespaces
        self.keys: list[list[int]] = [[]]
        self.next_kv = 1_000_000
        self.next_state = 0

    def fresh_kv(self, n: int) -> list[int]:
        self.next_kv += n
        return list(range(self.next_kv - n, self.next_kv))

    def fresh_state(self) -> int:
        self.next_state += 1
        return self.next_state

    def key(self, aligned: bool) -> list[int]:
        rng = self.rng
        base = rng.choice(self.keys)
        cut = rng.randint(0, len(base)) if rng.random() < 0.5 else len(base)
        ext = [rng.randrange(8) for _ in range(rng.choice((0, 1, 2, 3, 5, 8, 13, 30)))]
        key = base[:cut] + ext
        if aligned:
            key = key[: len(key) - len(key) % self.page]
        if len(self.keys) < 400:
            self.keys.append(key)
        else:
            self.keys[rng.randrange(len(self.keys))] = key
        return key

    def namespace(self) -> Any:
        return self.namespaces[0] if self.rng.random() < 0.85 else self.rng.choice(self.namespaces)


def _same(what: str, step: int, ours: Any, theirs: Any) -> None:
    if ours != theirs:
        raise AssertionError(
            f"step {step}: {what} differs: ours={_short(ours)} upstream={_short(theirs)}"
        )


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) < 400 else text[:400] + "..."


def _cmp_match(step: int, a: Any, b: Any, kv_hit: bool = False) -> None:
    _same("match prefix_len", step, a.prefix_len, b.prefix_len)
    _same("match kv_indices", step, list(a.kv_indices), list(b.kv_indices))
    _same("match branching_len", step, a.branching_len, b.branching_len)
    if kv_hit:
        _same("match kv_hit_len", step, a.kv_hit_len, b.kv_hit_len)


def run_differential(
    ours: Any,
    theirs: Any,
    seed: int,
    n_ops: int,
    page_size: int,
    check_every: int = 0,
    unified: bool = False,
) -> dict[str, int]:
    """Drive both caches through `n_ops` seeded operations; return op counts.

    unified: `theirs` is SGLang 0.5.23's cache (`upstream_unified`): also compare the full KV
    hit of every match, and drive half of the evictions as its allocation-driven eviction
    (`evict_for_alloc`, one resource, to an availability target) against our `evict` of the
    same amount."""
    s = OpStream(seed, page_size)
    rng = s.rng
    held: list[tuple[Any, Any]] = []
    counts = {"insert": 0, "match": 0, "lock": 0, "unlock": 0, "evict": 0}
    if unified:
        counts["evict_for_alloc"] = 0
    for step in range(n_ops):
        r = rng.random()
        ns = s.namespace()
        if r < 0.40:
            counts["insert"] += 1
            key = s.key(aligned=True)
            prev = rng.randint(0, len(key)) if rng.random() < 0.5 else 0
            kv, state = s.fresh_kv(len(key)), s.fresh_state()
            a = ours.insert(key, kv, state, prev_prefix_len=prev, extra_key=ns)
            b = theirs.insert(key, kv, state, prev_prefix_len=prev, extra_key=ns)
            _same(
                "insert",
                step,
                (a.prefix_len, a.state_existed, list(a.freed_kv)),
                (b.prefix_len, b.state_existed, list(b.freed_kv)),
            )
        elif r < 0.70:
            counts["match"] += 1
            key = s.key(aligned=False)
            a, b = ours.match_prefix(key, extra_key=ns), theirs.match_prefix(key, extra_key=ns)
            _cmp_match(step, a, b, unified)
        elif r < 0.80:
            counts["lock"] += 1
            key = s.key(aligned=False)
            a, b = ours.match_prefix(key, extra_key=ns), theirs.match_prefix(key, extra_key=ns)
            _cmp_match(step, a, b, unified)
            held.append((ours.inc_lock_ref(a.node), theirs.inc_lock_ref(b.node)))
        elif r < 0.90 and held:
            counts["unlock"] += 1
            la, lb = held.pop(rng.randrange(len(held)))
            ours.dec_lock_ref(la)
            theirs.dec_lock_ref(lb)
        else:
            kv_n = rng.choice((0, 0, 1, 3, 10, 40, 200))
            st_n = rng.choice((0, 0, 1, 2, 5, 20))
            evict = theirs.evict
            if unified and rng.random() < 0.5:
                counts["evict_for_alloc"] += 1
                kv_n, st_n = (kv_n or 1, 0) if rng.random() < 0.5 else (0, st_n or 1)
                evict = theirs.evict_for_alloc
            else:
                counts["evict"] += 1
            a, b = ours.evict(kv_tokens=kv_n, states=st_n), evict(kv_tokens=kv_n, states=st_n)
            _same(
                "evict",
                step,
                (a.kv_tokens, a.states, list(a.freed_kv), a.freed_states),
                (b.kv_tokens, b.states, list(b.freed_kv), b.freed_states),
            )
        _same("sizes", step, _sizes(ours), _sizes(theirs))
        if check_every and step % check_every == 0:
            ours.check_invariants()
            if not held:
                theirs.sanity_check()
        if len(held) > 12 or (held and rng.random() < 0.01):  # drain now and then
            for la, lb in held:
                ours.dec_lock_ref(la)
                theirs.dec_lock_ref(lb)
            held.clear()
    return counts


def _sizes(c: Any) -> tuple[int, int, int, int]:
    return (
        c.full_evictable_size(),
        c.full_protected_size(),
        c.state_evictable_size(),
        c.state_protected_size(),
    )


def kv_array(xs: list[int]) -> array[int]:
    return array("q", xs)
