"""Typed results with a JSON view.

A public result (`replay`'s `ReplayResult`, `sweep`'s `SweepResult`, `plan`'s
`PlanResult`, `compare_cache`'s `CompareResult`, `Engine.stats`'s `EngineStats`, ...)
is a frozen dataclass deriving from `JsonResult`. Attribute access is the typed way to
read it (`result.token_hit_rate`). `to_json()` gives the JSON-ready dict the command
line writes: its fields in order, nested results converted too. The result is also a
read-only `Mapping` over the keys of that dict (`result["token_hit_rate"]`, `in`,
`get`, `keys`), the JSON view, so code written against the JSON reads a result and a
loaded JSON file alike; `result[key]` is `result.to_json()[key]`.

How fields become keys (a field's `metadata`, made by the helpers below):
- `omitted()`: a field left out of the JSON while it is None (an optional key);
- `flat()` (optional) or `field(metadata=FLAT)`: a nested result whose keys are spliced
  in at its place (an optional one omitted while None); a key already present keeps its
  place and takes the nested value;
- `field(metadata=json_key(name))`: a key that is not an identifier (`"no cache"`).
Everything else is always present (None as null). A value with a `to_json()` method
becomes what it returns, another dataclass `dataclasses.asdict`; lists and dicts are
converted element by element.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = ["FLAT", "JsonResult", "ToJson", "flat", "json_key", "json_value", "omitted"]


def omitted(default: Any = None) -> Any:
    """A field absent from the JSON while None."""
    return dataclasses.field(default=default, metadata={"omit": True})


def flat() -> Any:
    """An optional nested result (default None) spliced into its parent's JSON, absent
    while None. A required one: `field(metadata=FLAT)`."""
    return dataclasses.field(default=None, metadata={"omit": True, "flat": True})


FLAT = {"flat": True}
"""The metadata of a required nested result spliced into its parent's JSON."""


def json_key(name: str) -> dict[str, str]:
    """The metadata of a field whose JSON key is `name`: `field(metadata=json_key(name))`."""
    return {"key": name}


def json_value(value: Any) -> Any:
    """`value` as JSON-ready data (see the module docstring)."""
    if isinstance(value, JsonResult):
        return value.to_json()
    if isinstance(value, list):
        return [json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: json_value(v) for k, v in value.items()}
    if isinstance(value, ToJson):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


@runtime_checkable
class ToJson(Protocol):
    """A value with its own JSON form (`to_json()`), used as it is."""

    def to_json(self) -> dict[str, Any]: ...


class JsonResult(Mapping[str, Any]):
    """Base of the frozen result dataclasses: `to_json()` and the read-only mapping
    over its keys. Subclasses are `@dataclass(frozen=True, eq=False)`: equality is the
    JSON view's, so a result equals another result or a dict with the same JSON."""

    def items_raw(self) -> Iterator[tuple[str, Any]]:
        """(key, typed value) in JSON order; a key may repeat (a spliced result's)."""
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None and f.metadata.get("omit"):
                continue
            if f.metadata.get("flat"):
                yield from value.items_raw()
            else:
                yield f.metadata.get("key", f.name), value

    def to_json(self) -> dict[str, Any]:
        """The JSON-ready dict (fresh; changing it changes nothing here)."""
        return {k: json_value(v) for k, v in self.items_raw()}

    def __getitem__(self, key: str) -> Any:
        found, hit = False, None
        for k, v in self.items_raw():
            if k == key:
                found, hit = True, v
        if not found:
            raise KeyError(key)
        return json_value(hit)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(k for k, _ in self.items_raw()))

    def __len__(self) -> int:
        return len(dict.fromkeys(k for k, _ in self.items_raw()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self.to_json() == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]
