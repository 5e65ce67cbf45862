"""Both builds of the core in one process, and a seeded operation sequence run on both.

`load_cache_class("compiled")` then `load_cache_class("pure")` import mambaradix twice,
forgetting it in between, so that each class keeps its own modules (the compiled one first:
an extension module is initialised once per process). Meant for a process of its own
(tests/test_compiled.py runs `python tests/core_builds.py`, bench/bench_compiled.py too):
the package in sys.modules afterwards is neither.

`run_pair` drives a compiled and a pure tree through one seeded sequence of inserts
(valid and refused), matches (read-only too), locks, unlocks, evictions (LRU, of a chosen
state, of a chosen leaf), touches, peeks, path reads and resets, with `check_invariants`
on both after every step, and raises at the first result, error, node id or tree that
differs. Node ids count per module copy, so the same decisions give the same ids.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from differential import OpStream

PURE_ENV = "MAMBARADIX_PURE"


def _forget_package() -> None:
    for name in [m for m in sys.modules if m == "mambaradix" or m.startswith("mambaradix.")]:
        del sys.modules[name]
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "CompiledCore"]


def load_cache_class(build: str) -> Any:
    """A fresh import of mambaradix as `build` ("compiled" or "pure"); its MambaRadixCache.

    Raises RuntimeError if that build does not load (the compiled one is not built)."""
    _forget_package()
    saved = os.environ.pop(PURE_ENV, None)
    if build == "pure":
        os.environ[PURE_ENV] = "1"
    try:
        import mambaradix
        from mambaradix._build import loaded_build

        if build != mambaradix.BUILD or loaded_build() != build:
            raise RuntimeError(
                f"asked for the {build} core, got {mambaradix.BUILD} (files: {loaded_build()}):"
                " build it with `pip install -e .` (docs/build.md)"
            )
        return mambaradix.MambaRadixCache
    finally:
        os.environ.pop(PURE_ENV, None)
        if saved is not None:
            os.environ[PURE_ENV] = saved
        _forget_package()


def _plain(x: Any) -> Any:
    """A result in comparable form (nodes and receipts by node id)."""
    if hasattr(x, "_fields"):  # the result records (named tuples)
        return tuple(_plain(v) for v in x)
    if hasattr(x, "typecode") or isinstance(x, list):
        return [_plain(v) for v in x]
    if type(x).__name__ == "TreeNode":
        return ("node", x.id)
    if type(x).__name__ == "LockReceipt":
        return ("receipt", x.node.id, x.state_locked, x.active)
    return x


class _Both(list[Any]):
    """One object per tree (a node, a receipt, a result)."""


class _Pair:
    """The same call on both trees; the first difference raises."""

    def __init__(self, trees: tuple[Any, Any], where: str) -> None:
        self.trees = trees
        self.where = where
        self.step = 0

    def same(self, what: str, a: Any, b: Any) -> None:
        if a != b:
            raise AssertionError(
                f"{self.where} step {self.step}: {what}: compiled={a!r:.300} pure={b!r:.300}"
            )

    def do(self, method: str, *args: Any, **kwargs: Any) -> _Both | None:
        """Call `method` on both trees (a `_Both` argument gives each tree its own object);
        return both results, or None when both raised the same error."""
        results, plain = _Both(), []
        for i, tree in enumerate(self.trees):
            own = [a[i] if isinstance(a, _Both) else a for a in args]
            try:
                results.append(getattr(tree, method)(*own, **kwargs))
                plain.append(_plain(results[-1]))
            except (ValueError, TypeError, RuntimeError) as e:
                plain.append(("raised", type(e).__name__, str(e)))
        self.same(method, *plain)
        return results if len(results) == 2 else None

    def check(self) -> None:
        for tree in self.trees:
            tree.check_invariants()
        self.same("tree", *(t.pretty() for t in self.trees))
        self.same("sizes", *(t.total_size() for t in self.trees))


def run_pair(classes: tuple[Any, Any], seed: int, n_ops: int, **options: Any) -> int:
    """Drive classes[0] (compiled) and classes[1] (pure) trees built with `options` through
    `n_ops` seeded steps; return the steps run. Raises AssertionError at a difference."""
    pair = _Pair((classes[0](**options), classes[1](**options)), f"{options} seed {seed}")
    s = OpStream(seed, options.get("page_size", 1))
    rng = s.rng
    held: list[_Both] = []  # receipts
    nodes: list[_Both] = []  # nodes from results (some since evicted: those calls raise)
    for step in range(n_ops):
        pair.step = step
        r, ns = rng.random(), s.namespace()
        if r < 0.33:
            key = s.key(aligned=True)
            prev = rng.randint(0, len(key)) if rng.random() < 0.5 else 0
            kv = s.fresh_kv(len(key))
            if options.get("check_kv") and len(kv) > 1 and rng.random() < 0.1:  # refused
                kv[-1] = kv[0] if rng.random() < 0.5 else -1
            res = pair.do("insert", key, kv, s.fresh_state(), prev_prefix_len=prev, extra_key=ns)
            if res is not None:
                nodes.append(_Both(x.node for x in res))
        elif r < 0.55:
            res = pair.do("match_prefix", s.key(aligned=False), extra_key=ns)
            assert res is not None
            nodes.append(_Both(x.node for x in res))
        elif r < 0.60:
            pair.do("match_prefix", s.key(aligned=False), extra_key=ns, read_only=True)
        elif r < 0.70 and nodes:
            receipts = pair.do("inc_lock_ref", rng.choice(nodes[-20:]))
            if receipts is not None:
                held.append(receipts)
        elif r < 0.78 and held:
            receipts = held.pop(rng.randrange(len(held)))
            by_node = rng.random() < 0.1  # SGLang's form: a node releases one lock on it
            pair.do("dec_lock_ref", _Both(x.node for x in receipts) if by_node else receipts)
        elif r < 0.86:
            kv_n = rng.choice((0, 1, 3, 10, 40, 200))
            pair.do("evict", kv_tokens=kv_n, states=rng.choice((0, 1, 2, 5)))
        elif r < 0.90:  # a chosen victim: one of the unlocked states (a leaf's or not)
            states = pair.do("evictable_states")
            assert states is not None
            if states[0]:
                i = rng.randrange(len(states[0]))
                victim = _Both(listed[i] for listed in states)
                pair.do(rng.choice(("evict_state_of", "evict_leaf")), victim)
        elif r < 0.96 and nodes:
            pair.do(rng.choice(("touch", "path_kv", "state_last_use")), rng.choice(nodes))
            pair.do("peek", s.key(aligned=False), extra_key=ns)
        elif r < 0.97 and not held:
            pair.do("reset")
            nodes.clear()
        pair.check()
        if len(held) > 8:
            for receipts in held:
                pair.do("dec_lock_ref", receipts)
            held.clear()
    return n_ops


MODES = (None, "sglang-0.5.15.post1", "sglang-0.5.23")


def main(argv: list[str]) -> int:
    """`python tests/core_builds.py SEEDS N_OPS`: every mode, page size 1 and 4, with and
    without the tree's own KV check, on both builds; prints one line per run."""
    seeds, n_ops = int(argv[0]), int(argv[1])
    classes = (load_cache_class("compiled"), load_cache_class("pure"))
    for compat in MODES:
        for page in (1, 4):
            for seed in range(seeds):
                options = {"compat": compat, "page_size": page, "chunk_size": 4 * page}
                options["check_kv"] = seed % 2 == 1
                steps = run_pair(classes, seed, n_ops, **options)
                print(f"same: {options} seed {seed}, {steps} steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
