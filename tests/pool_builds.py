"""Both builds of the pools' free list and KV owner map in one process, and a seeded
operation sequence run on both.

The compiled build types `pools/_freelist.py` and `pools/ownership.py` (their `.pxd`
files) and runs their short batches as C loops over the buffers; the pure modules are the
reference. `run_pair` drives a token and a paged KV allocator of each build through one
seeded sequence of allocations (short, long, more than is free), frees, the tree's claims
and releases, valid and refused (a repeat, an index out of range, one already free, one
the tree holds, a claim that keeps less than it checks), and raises at the first result,
error (type and message) or state (free stack, flags, owner map) that differs, with
`check_invariants` on both after every step that leaves the pools consistent.
tests/test_compiled.py runs `python tests/pool_builds.py SEEDS STEPS` in a process of its
own; it prints one line per run.
"""

from __future__ import annotations

import os
import random
import sys
from array import array
from types import ModuleType
from typing import Any

from core_builds import PURE_ENV, _forget_package

VECTOR_MIN = 64  # pools/_checks.py: batches from here on take the numpy paths


def load_kv(build: str) -> ModuleType:
    """A fresh import of mambaradix as `build`; its `pools.kv` module (the compiled one
    first: an extension module is initialised once per process)."""
    _forget_package()
    saved = os.environ.pop(PURE_ENV, None)
    if build == "pure":
        os.environ[PURE_ENV] = "1"
    try:
        import mambaradix
        from mambaradix.pools import _freelist, kv, ownership

        files = {m.__name__: str(m.__file__) for m in (_freelist, ownership)}
        is_py = {name: f.endswith(".py") for name, f in files.items()}
        if build != mambaradix.BUILD or set(is_py.values()) != {build == "pure"}:
            raise RuntimeError(f"asked for the {build} pools, got {files}: pip install -e .")
        return kv
    finally:
        os.environ.pop(PURE_ENV, None)
        if saved is not None:
            os.environ[PURE_ENV] = saved
        _forget_package()


def state(pool: Any) -> tuple[Any, ...]:
    """Everything an allocator holds: its free stack, its flags, its owner map."""
    stack = pool._free if hasattr(pool, "_free") else pool._pages
    return (list(stack._stack), bytes(stack._flags), bytes(pool._owners.owners))


def call(pool: Any, method: str, *args: Any) -> Any:
    """The call's result in comparable form, or its error's type and message."""
    try:
        out = getattr(pool, method)(*args)
    except Exception as e:  # compared, not hidden: both builds must fail alike
        return ("raised", type(e).__name__, str(e))
    return list(out) if isinstance(out, array) else out


class Ops:
    """A seeded operation, built from one allocator's state (both hold the same)."""

    def __init__(self, rng: random.Random, size: int, page: int) -> None:
        self.rng, self.size, self.page = rng, size, page

    def owned(self, pool: Any, byte: int) -> list[int]:
        owners = pool._owners.owners
        return [i for i in range(len(owners)) if owners[i] == byte]

    def indices(self, pool: Any, byte: int, most: int, spoil: bool = True) -> array[int]:
        """Up to `most` indices the owner map marks `byte`, shuffled; with `spoil`, now and
        then one out of range, a repeat, or one the map marks otherwise (free, the tree's,
        the caller's)."""
        rng = self.rng
        pick = self.owned(pool, byte)
        rng.shuffle(pick)
        out = pick[: rng.randint(1, most)]
        spoil_at = rng.random() if spoil else 1.0
        if spoil_at < 0.06:
            out.insert(rng.randint(0, len(out)), rng.choice([-1, len(pool._owners.owners)]))
        elif spoil_at < 0.12 and out:
            out.insert(rng.randint(0, len(out)), rng.choice(out))
        elif spoil_at < 0.18:
            other = self.owned(pool, rng.choice([b for b in (0, 1, 2) if b != byte]))
            if other:
                out.insert(rng.randint(0, len(out)), rng.choice(other))
        return array("q", out)

    def next(self, pool: Any) -> tuple[str, tuple[Any, ...]]:
        """An operation; now and then the tree's indices as a list, which the owner's
        `claim` and `release` take as the pure build does (the compiled loops read arrays)."""
        method, args = self._next(pool)
        if method in ("claim", "release") and self.rng.random() < 0.1:
            args = (args[0].tolist(), *args[1:])
        return method, args

    def _next(self, pool: Any) -> tuple[str, tuple[Any, ...]]:
        rng = self.rng
        kind = rng.choice(["alloc", "alloc", "free", "claim", "claim", "release"])
        most = VECTOR_MIN + 8 if rng.random() < 0.1 else 12
        if kind == "alloc":
            n = rng.choice([0, 1, 2, 3, 5, 8, VECTOR_MIN + 4, self.size + self.page])
            return "alloc", (n - n % self.page,)
        if kind == "free":
            return "free", (self.indices(pool, 0, most),)
        if kind == "release":  # the tree hands back only its own: spoilt, out of range
            values = self.indices(pool, 2, most, spoil=False)
            if rng.random() < 0.1:
                values.insert(rng.randint(0, len(values)), self.size + rng.randint(0, 3))
            return "release", (values,)
        if rng.random() < 0.1:  # keeping more than it checks (values[keep:start] unchecked)
            values = self.indices(pool, 0, most, spoil=False)
            return "claim", (values, rng.randint(0, len(values)), 0)
        values = self.indices(pool, 0, most)
        start = rng.randint(0, len(values))
        return "claim", (values, start, start + rng.choice([0, 0, 1, 2, len(values)]))


def run_pair(kvs: tuple[ModuleType, ModuleType], seed: int, steps: int, paged: bool) -> int:
    size, page = (96, 4) if paged else (160, 1)
    pools = [kv.PagedKVAllocator(size, page) if paged else kv.TokenKVAllocator(size) for kv in kvs]
    ops = Ops(random.Random(seed), size, page)
    for step in range(steps):
        method, args = ops.next(pools[1])
        got = [
            call(pool, method, *[a[:] if isinstance(a, array) else a for a in args])
            for pool in pools
        ]
        where = f"seed {seed} step {step}: {method}{args}"
        if got[0] != got[1]:
            raise AssertionError(f"{where}: compiled {got[0]!r}, pure {got[1]!r}")
        if state(pools[0]) != state(pools[1]):
            raise AssertionError(f"{where}: the two builds' pools differ after the call")
        for pool in pools:
            pool.check_invariants()
    return steps


def main(argv: list[str]) -> int:
    """`pool_builds.py SEEDS STEPS`: every seed on a token and a paged allocator of each
    build; prints one line per run."""
    seeds, steps = int(argv[0]), int(argv[1])
    kvs = (load_kv("compiled"), load_kv("pure"))
    for seed in range(seeds):
        for paged in (False, True):
            done = run_pair(kvs, seed, steps, paged)
            print(f"same: {'paged' if paged else 'token'} seed {seed}, {done} steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
