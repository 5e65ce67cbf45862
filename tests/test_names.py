"""The string families (`mambaradix.names.Names`): a member is its value wherever a string is,
on every supported Python (f-strings included, which `str, Enum` alone breaks from 3.11)."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable

import pytest

from mambaradix.index.indexer import Role
from mambaradix.lifecycle.strategy import Strategy
from mambaradix.lifecycle.tiers import Level
from mambaradix.names import Names
from mambaradix.policies.kinds import Kind
from mambaradix.policies.mambaradix import Label
from mambaradix.policies.tier_rules import Choice, Split, StateRule
from mambaradix.replay.explain import CATEGORIES
from mambaradix.replay.explain.attribute import Category
from mambaradix.replay.explain.records import Room
from mambaradix.replay.routers import ROUTERS, RouterName, check_router_names, make_router
from mambaradix.scheduler import Status, Step
from mambaradix.scheduler.budget import Added
from mambaradix.tiers import HitPolicy

FAMILIES = {
    Strategy: ["no_buffer", "extra_buffer"],
    Kind: ["chunk", "stop", "prompt_end", "decoded", "finish"],
    Split: ["shared", "proportional", "auto"],
    Choice: ["cost", "deepest"],
    StateRule: ["all", "prompt"],
    Level: ["host", "store"],
    # routers.py's docstring, `--router`
    RouterName: ["round-robin", "session", "kv-overlap", "hybrid", "oracle"],
    # Scheduler.step's docstring; SGLang's AddReqResult; a sequence's life
    Step: ["prefill", "decode", "preempted", "idle", "stalled"],
    Added: ["continue", "no_token", "other"],
    Status: ["waiting", "prefilling", "running", "finished", "aborted"],
    # explain's categories, bound down to hit (attribute.py's docstring, docs/explain.md)
    Category: [
        "dropped", "unreachable", "in_flight", "session_in_flight", "source_dropped",
        "other_instance", "no_checkpoint", "admission_refused", "kv_evicted", "state_evicted",
        "tier_dropped", "tier_kv_dropped", "lower_tier", "recompute_chosen", "load_failed",
        "beyond_bound",
    ],
    Room: ["kv", "states", "both"],  # explain's evictions, by the pool they made room in
    Label: ["branch", "prompt", "chunk", "finish"],  # our policy's classes: where a state was taken
    Role: ["kv", "state", "other", "unknown"],  # the indexer's block roles, by group kind
    HitPolicy: ["all_pages", "trailing_pages"],  # SGLang's PoolHitPolicy values
}  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.__name__)
def test_each_member_is_its_value_as_a_string(family: type[Names]) -> None:
    assert [m.value for m in family] == FAMILIES[family]  # by hand: what callers pass
    for member in family:
        value = member.value
        assert member == value and hash(member) == hash(value)
        assert {value: 1}[member] == 1 and {member: 1}[value] == 1
        assert f"{member}" == str(member) == value and f"{member:>12}" == f"{value:>12}"
        assert json.dumps({member: member}) == json.dumps({value: value})
        assert pickle.loads(pickle.dumps(member)) is member
        assert family(value) is member
        assert repr(member) == repr(value) and f"got {member!r}" == f"got {value!r}"
    with pytest.raises(ValueError):
        family("no such name")


def test_the_registries_are_keyed_by_their_family_in_its_order() -> None:
    assert list(ROUTERS) == list(RouterName) and tuple(Category) == CATEGORIES
    for member in RouterName:
        assert ROUTERS[member].name is member
        assert make_router(member.value).name is member  # the plain string callers pass


KNOWN = "choose from round-robin, session, kv-overlap, hybrid, oracle"


@pytest.mark.parametrize(
    ("refuse", "message"),
    [
        (
            lambda: make_router("hybird"),
            f"unknown router 'hybird'; {KNOWN}; did you mean 'hybrid'?",
        ),
        (lambda: make_router("nope"), f"unknown router 'nope'; {KNOWN}"),
        (lambda: make_router(None), f"unknown router None; {KNOWN}"),
        (
            lambda: check_router_names(["hybrid", "kv_overlap"], "--router"),
            f"--router: unknown router kv_overlap; {KNOWN}; did you mean 'kv-overlap'?",
        ),
        (lambda: check_router_names(["x"], "routers"), f"routers: unknown router x; {KNOWN}"),
    ],
)
def test_an_unknown_name_is_refused_by_its_parameter(
    refuse: Callable[[], object], message: str
) -> None:
    """By hand: the names `--router` lists, and "did you mean" as the CLI's other choices."""
    with pytest.raises(ValueError) as refused:
        refuse()
    assert str(refused.value) == message
