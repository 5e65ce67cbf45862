"""`Names`: the base of the project's string families (strategies, checkpoint kinds, tier
rules): an `Enum` whose members are `str`s, so a member equals, hashes, joins, formats and is
written to JSON as its value, and the plain strings callers pass keep working (the standard
library's `StrEnum` does this from Python 3.11; the project runs on 3.10 too)."""

from __future__ import annotations

from enum import Enum

__all__ = ["Names"]


class Names(str, Enum):
    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)
