"""One home per rule and declared seams, checked by reading the source (issue 20): a rule
written twice drifts, and a `getattr` probe for a capability hides a seam the type checker
cannot see. Each check names the duplicates it guards against."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "mambaradix"
STRATEGY_HOME = SRC / "lifecycle" / "strategy.py"


def lines(exclude: Path | None = None) -> list[tuple[Path, int, str]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        if path == exclude:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            out.append((path, i, line))
    return out


def where(found: list[tuple[Path, int, str]]) -> list[str]:
    return [f"{p.relative_to(SRC)}:{i}: {line.strip()}" for p, i, line in found]


def test_the_page_rule_of_no_buffer_lives_in_lifecycle_strategy() -> None:
    """'no_buffer needs page size 1' was written in 6 places; now each asks `takes_page`."""
    compare = re.compile(r"(==|!=|>|<)")
    both = re.compile(r"no_buffer.*page|page.*no_buffer|NO_BUFFER.*page|page.*NO_BUFFER")
    found = [
        (p, i, s)
        for p, i, s in lines(STRATEGY_HOME)
        if both.search(s) and compare.search(s) and not s.lstrip().startswith(("#", '"'))
    ]
    assert found == [], where(found)


def test_the_strategy_names_are_declared_once() -> None:
    found = [(p, i, s) for p, i, s in lines(STRATEGY_HOME) if re.match(r"\s*STRATEGIES\s*=", s)]
    assert found == [], where(found)


def test_the_scheduler_hooks_are_called_not_probed() -> None:
    """`before_match`, `on_abort` (`policies.Policy`) and `pass_steps` (Forward) are declared."""
    probe = re.compile(r"getattr\([^)]*[\"'](before_match|on_abort|pass_steps)[\"']")
    found = [(p, i, s) for p, i, s in lines() if probe.search(s)]
    assert found == [], where(found)


# The optional capabilities of pools (`pools.defaults`, the `lifecycle.manager` protocols)
# and replay policies (`policies.base.BasePolicy`): declared with a default, never probed.
CAPABILITIES = (
    "free_list_size",
    "reclaims_cache",
    "page_size",
    "max_context",
    "alloc_extend",
    "adopt_loaded",
    "pool",
)
CAPABILITY_PROBE = re.compile(
    r"(getattr|hasattr)\([^)]*[\"'](" + "|".join(CAPABILITIES) + r")[\"']"
)
# A list of method names checked one by one: what `isinstance` on a runtime-checkable
# Protocol says (the tree's owner and listeners, the engine's `policy`).
METHOD_PROBE = re.compile(r"callable\(getattr\(")


def test_pool_and_policy_capabilities_are_declared_not_probed() -> None:
    found = [(p, i, s) for p, i, s in lines() if CAPABILITY_PROBE.search(s)]
    assert found == [], where(found)


def test_protocols_are_checked_with_isinstance_not_method_lists() -> None:
    found = [(p, i, s) for p, i, s in lines() if METHOD_PROBE.search(s)]
    assert found == [], where(found)


# A rule's message, and the one module that raises it (the copies removed: the engine's
# sglang_rules check, the indexer's block_size check, the cluster CLI's router check, the
# state pool geometry's dtype table and check).
RULE_HOMES = {
    "sglang_rules must be": "lifecycle/manager.py",
    "block_size must be a positive int": "events/model.py",
    "unknown router": "replay/routers.py",
    "unknown dtype": "geometry/layers.py",
    "must divide {what}": "geometry/cfgread.py",  # heads split a width (was in 3 places)
}


def raised_from(text: str) -> list[tuple[Path, int, str]]:
    return [(p, i, s) for p, i, s in lines() if text in s and not s.lstrip().startswith("#")]


def test_each_rule_is_raised_from_its_home_only() -> None:
    for text, home in RULE_HOMES.items():
        found = raised_from(text)
        assert found and {p.relative_to(SRC).as_posix() for p, _, _ in found} == {home}, where(
            found
        )


# "X must be a multiple of the page" was raised from 4 modules in 8 places above the pools
# (the engine's sizes, the replay's track interval and exact pools, the scheduler's chunk,
# grid and interval); now each calls `validate.check_page_multiple`. The layers below
# `validate` (the standard-library core's `chunk_size`, a paged pool's `alloc`) keep theirs.
PAGE_MULTIPLE = re.compile(r"must be a multiple of (page_size|the page size|the page) \(")
BELOW_VALIDATE = (SRC / "core", SRC / "pools")


def test_the_page_multiple_rule_is_worded_in_validate_only() -> None:
    found = [
        (p, i, s)
        for p, i, s in lines(SRC / "validate.py")
        if PAGE_MULTIPLE.search(s) and not any(p.is_relative_to(d) for d in BELOW_VALIDATE)
    ]
    assert found == [], where(found)


def _scheduler(page: int, **cfg: object) -> object:
    from driving import make_manager
    from mambaradix.scheduler import FingerprintForward, Scheduler, SchedulerConfig

    mgr, pool = make_manager(256, 8, strategy="extra_buffer", page=page)
    config = SchedulerConfig(**cfg)  # type: ignore[arg-type]
    return Scheduler(mgr, FingerprintForward(mgr, pool), config=config)


def _engine(**kw: object) -> object:
    from mambaradix.engine import EngineConfig

    return EngineConfig(strategy="extra_buffer", page_size=16, **kw)  # type: ignore[arg-type]


def _serving(**kw: object) -> object:
    from mambaradix.replay.serving import ServingConfig

    return ServingConfig(memory_gb=1.0, page_size=16, **kw)  # type: ignore[arg-type]


def _pools(kv_units: int) -> object:
    from mambaradix.replay.memory import exact_pools

    return exact_pools(kv_units, 4, 16)


MULTIPLE = "must be a multiple of"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: _serving(track_interval=100),
            f"track_interval (100) {MULTIPLE} page_size (16), as SGLang requires",
        ),
        (lambda: _pools(100), f"kv_units (100) {MULTIPLE} the page (16)"),
        (
            lambda: _scheduler(16, chunk_tokens=40),
            f"chunk_tokens (40) {MULTIPLE} the page size (16)",
        ),
        (
            lambda: _scheduler(16, chunk_tokens=64, truncation_align_size=24),
            f"truncation_align_size (24) {MULTIPLE} the page size (16)",
        ),
        (
            lambda: _scheduler(16, chunk_tokens=64, track_interval=40),
            f"track_interval (40) {MULTIPLE} the page size (16)",
        ),
    ],
)
def test_each_page_multiple_check_says_the_rule_by_its_parameter(
    make: Callable[[], object], message: str
) -> None:
    """By hand: 1000, 100, 40 and 24 are not whole pages of 16 tokens."""
    with pytest.raises(ValueError) as refused:
        make()
    assert str(refused.value) == message


# Named test_engine_*: conftest skips these without torch (the Python 3.10 tier).
@pytest.mark.parametrize(("field", "value"), [("kv_tokens", 1000), ("chunk_size", 100)])
def test_engine_page_multiple_checks_say_the_rule_by_its_field(field: str, value: int) -> None:
    """By hand: 1000 and 100 are not whole pages of 16 tokens."""
    with pytest.raises(ValueError) as refused:
        _engine(**{field: value})
    assert str(refused.value) == f"{field} ({value}) {MULTIPLE} page_size (16)"


def test_the_checks_can_fail() -> None:
    """The patterns above match the code they replaced."""
    old = [
        'if strategy == "no_buffer" and page != 1:',
        'hook = getattr(self.checkpoints, "before_match", None)',
    ]
    assert re.search(r"no_buffer.*page", old[0]) and re.search(r"(==|!=)", old[0])
    assert PAGE_MULTIPLE.search('f"track_interval ({t}) must be a multiple of page_size ({p})"')
    assert PAGE_MULTIPLE.search('f"chunk_tokens ({c}) must be a multiple of the page size ({p})"')
    assert PAGE_MULTIPLE.search('f"kv_units ({kv_units}) must be a multiple of the page ({page})"')
    assert re.search(r"getattr\([^)]*[\"'](before_match|on_abort|pass_steps)[\"']", old[1])
    probes = [
        'if getattr(kv, "reclaims_cache", False):',
        'used_kv = kv.capacity - getattr(kv, "free_list_size", kv.available_size)()',
        'free = getattr(pool, "free_list_size", pool.available_size)() // unit',
        'kv_page = getattr(kv, "page_size", 1)',
        'context = getattr(self.cache.rows, "max_context", None)',
        'alloc_extend = getattr(self.kv, "alloc_extend", None)',
        'tiered.adopt = getattr(self.policy, "adopt_loaded", None)',
        'pool = getattr(self, "pool", None)',
        'if hasattr(self.rows, "max_context"):',
    ]
    assert all(CAPABILITY_PROBE.search(line) for line in probes)
    assert not CAPABILITY_PROBE.search("value = getattr(self, name)  # a dataclass field")
    methods = "not all(callable(getattr(policy, m, None)) for m in POLICY_METHODS)"
    assert METHOD_PROBE.search(methods)
    assert METHOD_PROBE.search("if not callable(getattr(owner, name, None)):")


# Whether a policy replaces `build_memory` / `tree_page` (its own memory, its own page) was
# asked by looking the method up by name on its class; `BasePolicy` now declares it
# (`lays_out_memory`, `fixes_page`), set when each subclass is defined.
CLASS_PROBE = re.compile(r"getattr\(type\(")


def test_a_policy_s_own_memory_and_page_are_declared_not_looked_up() -> None:
    found = [(p, i, s) for p, i, s in lines() if CLASS_PROBE.search(s)]
    assert found == [], where(found)
    assert CLASS_PROBE.search("getattr(type(policy), method) is not getattr(BasePolicy, method)")


def test_the_declared_memory_and_page_follow_the_methods_a_class_replaces() -> None:
    """By hand: a class that replaces `build_memory` (or inherits one that does) lays out
    its memory; one that replaces only `tree_page` fixes the page and nothing more."""
    from mambaradix.policies import make_policy, own_memory, own_page
    from mambaradix.policies.base import BasePolicy
    from mambaradix.policies.vllm import VLLM

    class Page(BasePolicy):
        def tree_page(self, profile: object, unit_tokens: int) -> int:  # type: ignore[override]
            return 4

    class Sub(VLLM):
        pass

    assert (own_memory(BasePolicy()), own_page(BasePolicy())) == (False, False)
    assert (own_memory(Page()), own_page(Page())) == (False, True)
    assert (own_memory(make_policy("vllm")), own_page(make_policy("vllm"))) == (True, True)
    assert Sub.lays_out_memory and Sub.fixes_page
    assert not make_policy("sglang").lays_out_memory and not make_policy("marconi").fixes_page


# JSON codecs, not results: each returns the JSON of something typed or of JSON files.
JSON_CODECS = {
    "to_json",  # a result's JSON view (`mambaradix.results`)
    "requests_json",  # `Explanation`'s per-request records, the JSONL lines
    "event_json",  # an event's wire form on the index's HTTP API
    "merge",  # shard files' JSON in, the merged sweep's JSON out (`replay.shards`)
}


def untyped_results(root: Path) -> list[str]:
    """Public functions and methods (of public classes) under `root` whose return
    annotation holds `dict[str, Any]`, JSON codecs aside."""
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        scopes: list[ast.AST] = [tree] + [
            c for c in tree.body if isinstance(c, ast.ClassDef) and not c.name.startswith("_")
        ]
        for scope in scopes:
            for f in getattr(scope, "body", []):
                if not isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) or f.returns is None:
                    continue
                public = not f.name.startswith("_") and f.name not in JSON_CODECS
                if public and "dict[str, Any]" in ast.unparse(f.returns):
                    found.append(f"{path.relative_to(root)}:{f.lineno}: {f.name}")
    return found


def test_no_public_result_is_an_untyped_dict() -> None:
    """Results are frozen dataclasses with `to_json()` (`mambaradix.results`): 54
    `dict[str, Any]` results were a seam the type checker could not see."""
    found = untyped_results(SRC)
    assert found == [], found


def test_the_untyped_result_check_can_fail(tmp_path: Path) -> None:
    """It finds the shapes the replay's results had: a function, a method of a public
    class, a list of them; not a private helper, a private class or a JSON codec."""
    (tmp_path / "m.py").write_text(
        "from typing import Any\n"
        "def replay() -> dict[str, Any]: ...\n"
        "def _helper() -> dict[str, Any]: ...\n"
        "def run_on() -> list[dict[str, Any]]: ...\n"
        "class Engine:\n"
        "    def stats(self) -> dict[str, Any]: ...\n"
        "    def to_json(self) -> dict[str, Any]: ...\n"
        "class _Worker:\n"
        "    def info(self) -> dict[str, Any]: ...\n"
        "def typed() -> dict[str, int]: ...\n"
    )
    assert untyped_results(tmp_path) == ["m.py:2: replay", "m.py:4: run_on", "m.py:6: stats"]
