"""Argument checks for the public entry points above the pools (`ServingConfig`,
`replay`, `sweep`, `Engine`, the demo). Each helper returns a clean value or
raises `TypeError` / `ValueError` whose message starts with the parameter's
name; none changes anything, so an entry point that calls them first is left
as it was when they raise."""

from __future__ import annotations

import difflib
import math
import operator
from collections.abc import Iterable, Sequence
from pathlib import Path

from mambaradix.pools._checks import as_count, as_int, as_positive

HOST_BYTES_PER_ID = 17  # a free-list entry (8 B), its flag (1 B), scratch on first use (8 B)

__all__ = [
    "HOST_BYTES_PER_ID",
    "available_bytes",
    "as_bool",
    "as_finite_nonnegative",
    "as_count",
    "as_int",
    "as_int_nonnegative",
    "as_positive",
    "as_real",
    "as_token_ids",
    "as_type",
    "check_page_multiple",
]


def as_real(
    value: object,
    name: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """`value` as a finite float within [low, high] (an open end when `*_open`);
    ints and floats are accepted, bools, strings and nan/inf are not."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if low is not None and (x < low or (low_open and x == low)):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low:g}, got {value}")
    if high is not None and (x > high or (high_open and x == high)):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high:g}, got {value}")
    return x


def as_finite_nonnegative(value: object, name: str, what: str = "a finite number >= 0") -> float:
    """`value` (an int or a float, not a bool) as a float, finite and >= 0; the
    message says `name must be <what>` for a wrong type (TypeError) and value alike."""
    message = f"{name} must be {what}, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(message)
    if not math.isfinite(value) or value < 0:
        raise ValueError(message)
    return float(value)


def as_int_nonnegative(value: object, name: str) -> int:
    """`value` as a plain int >= 0 (only a Python int: not a bool, a float or a
    numpy integer); one message, `name must be an int >= 0`, for both errors."""
    message = f"{name} must be an int >= 0, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(message)
    if value < 0:
        raise ValueError(message)
    return value


def as_bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def as_type(value: object, cls: type, name: str) -> None:
    if not isinstance(value, cls):
        raise TypeError(f"{name} must be a {cls.__name__}, got {type(value).__name__}")


def as_token_ids(value: object, name: str, vocab_size: int) -> list[int]:
    """A non-empty sequence of token ids in [0, vocab_size) as a list of ints
    (numpy / torch integer scalars accepted; bools, floats and strings not)."""
    if not isinstance(value, Sequence) and hasattr(value, "tolist"):
        value = value.tolist()  # a numpy array or a torch tensor
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a list of token ids, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} is empty: a prompt needs at least one token")
    out = []
    for i, t in enumerate(value):
        if isinstance(t, bool):
            raise TypeError(f"{name}[{i}] must be an int token id, got bool")
        try:
            tok = operator.index(t)
        except TypeError:
            raise TypeError(
                f"{name}[{i}] must be an int token id, got {type(t).__name__}"
            ) from None
        if not 0 <= tok < vocab_size:
            raise ValueError(f"{name}[{i}] = {tok} is outside the vocabulary [0, {vocab_size})")
        out.append(tok)
    return out


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), else None (no check)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_page_multiple(
    value: int, name: str, page: int, page_name: str = "page_size", why: str = ""
) -> int:
    """`value` (`name`, already checked an int) if it is whole pages of `page` tokens or
    units; ValueError "name (value) must be a multiple of page_name (page)" otherwise,
    `why` appended (the one home of the rule and its wording: the engine's and the
    replay's sizes and intervals, the scheduler's chunk, grid and track interval, the
    replay's exact pools)."""
    if value % page:
        raise ValueError(f"{name} ({value}) must be a multiple of {page_name} ({page}){why}")
    return value


def suggest(name: str, known: Iterable[str]) -> str:
    """ "; did you mean 'x'?" for the known name closest to a mistyped `name`, or ""."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
