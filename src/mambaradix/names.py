"""`Names`: the base of the project's string families (strategies, checkpoint kinds, tier
rules, routers, scheduler steps...): an `Enum` whose members are `str`s, so a member equals,
hashes, joins, formats, is written to JSON and is shown by `repr` as its value, and the plain
strings callers pass keep working (the standard library's `StrEnum` does most of this from
Python 3.11; the project runs on 3.10 too). `repr` too because error messages quote what they
name (`{x!r}`): a message about a member reads as it did about the string it replaced."""

from __future__ import annotations

from enum import Enum

__all__ = ["Names"]


class Names(str, Enum):
    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    def __repr__(self) -> str:
        return repr(str(self.value))
