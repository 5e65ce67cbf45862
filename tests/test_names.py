"""The string families (`mambaradix.names.Names`): a member is its value wherever a string is,
on every supported Python (f-strings included, which `str, Enum` alone breaks from 3.11)."""

from __future__ import annotations

import json
import pickle

import pytest

from mambaradix.lifecycle.strategy import Strategy
from mambaradix.lifecycle.tiers import Level
from mambaradix.names import Names
from mambaradix.policies.kinds import Kind
from mambaradix.policies.tier_rules import Choice, Split, StateRule

FAMILIES = {
    Strategy: ["no_buffer", "extra_buffer"],
    Kind: ["chunk", "stop", "prompt_end", "decoded", "finish"],
    Split: ["shared", "proportional", "auto"],
    Choice: ["cost", "deepest"],
    StateRule: ["all", "prompt"],
    Level: ["host", "store"],
}


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
