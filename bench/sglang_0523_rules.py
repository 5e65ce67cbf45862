"""Which of SGLang 0.5.23's rules move an `sglang` row on one trace, at one memory point.

First the 2 x 2 of tree (`compat`) and scheduler rules (`sglang_rules`) of the two releases,
then the 0.5.23 tree put back to 0.5.15.post1's rules one at a time (cumulative): the branching
point reported also at the matched state, state-less ancestors deleted with their leaf, the
state LRU refreshed along the whole matched / inserted path. Those variants patch the tree's
methods in this process only (an experiment, not a supported mode).

    PYTHONPATH=src .venv/bin/python bench/sglang_0523_rules.py synthetic-agent 2 extra_buffer
    PYTHONPATH=src .venv/bin/python bench/sglang_0523_rules.py swe-agent 2 no_buffer
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import mambaradix.core.tree as tree_mod
import mambaradix.core.unified as unified
from mambaradix.core.compat import SGLANG_0_5_15, SGLANG_0_5_23
from mambaradix.geometry.profile import get_profile
from mambaradix.policies import SGLang, SGLangExtraBuffer
from mambaradix.replay.serving import ServingConfig, ServingModel
from mambaradix.replay.workloads import load

Tree = tree_mod.MambaRadixCache


def hit_rate(
    trace: Any, gb: float, extra: bool, tree: str = SGLANG_0_5_23, rules: str = ""
) -> float:
    policy = SGLangExtraBuffer() if extra else SGLang()
    policy.compat, policy.sglang_rules = tree, rules or tree  # type: ignore[assignment]
    model = ServingModel(trace, get_profile("nemotron-h-8b"), policy, ServingConfig(gb))
    model.run()
    hits = sum(o.hit_tokens for o in model.outcomes)
    return 100 * hits / sum(o.input_tokens for o in model.outcomes)


def branching_at_the_state() -> None:
    match = Tree.match_prefix

    def patched(self: Tree, key: Any, extra_key: Any = None, read_only: bool = False) -> Any:
        got = match(self, key, extra_key, read_only)
        aligned = got.kv_hit_len - got.kv_hit_len % self.chunk_size
        if got.branching_len is None and got.kv_hit_len > got.prefix_len and aligned > 0:
            got = got._replace(branching_len=aligned)
        return got

    Tree.match_prefix = patched  # type: ignore[method-assign]


def ancestors_deleted() -> None:
    delete = unified._delete_leaf

    def patched(tree: Tree, leaf: Any, freed: Any) -> None:
        parent = leaf.parent
        delete(tree, leaf, freed)
        while parent.parent is not None and parent.state is None and not parent.children:
            if parent.kv.lock:
                break
            grandparent = parent.parent
            freed.got[unified.KV] += tree._detach(parent, freed.kv)
            parent = grandparent

    unified._delete_leaf = patched


def path_state_refresh() -> None:
    for name in ("_refresh_after_match", "_touch_walked"):
        original = getattr(Tree, name)

        def patched(self: Tree, *args: Any, _original: Callable[..., None] = original) -> None:
            self._sglang = True  # 0.5.15.post1's refresh of every state on the path
            try:
                _original(self, *args)
            finally:
                self._sglang = False

        setattr(Tree, name, patched)


def main() -> None:
    name, gb, strategy = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    trace, extra = load(name), strategy == "extra_buffer"
    print(f"{name} at {gb:g} GB, {strategy}: token hit rate")
    for tree in (SGLANG_0_5_15, SGLANG_0_5_23):
        for rules in (SGLANG_0_5_15, SGLANG_0_5_23):
            got = hit_rate(trace, gb, extra, tree, rules)
            print(f"  tree {tree:20} rules {rules:20} {got:5.1f}%")
    print("  0.5.23, its tree put back step by step:")
    branching_at_the_state()
    print(f"  + branching point also at the state        {hit_rate(trace, gb, extra):5.1f}%")
    ancestors_deleted()
    print(f"  + state-less ancestors deleted with a leaf {hit_rate(trace, gb, extra):5.1f}%")
    path_state_refresh()
    print(f"  + state LRU refreshed along the path       {hit_rate(trace, gb, extra):5.1f}%")


if __name__ == "__main__":
    main()
