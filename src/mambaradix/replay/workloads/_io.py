"""File helpers shared by the loaders: gzip-aware reading, JSON lines with line
numbers, typed field checks that name the offending line, and the bundled-data
folder."""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from array import array
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import IO

PathLike = str | os.PathLike[str]


class TraceFormatError(ValueError):
    """A trace file that does not parse; the message names the file and line."""

    def __init__(self, path: PathLike, line: int, problem: str) -> None:
        self.path = str(path)
        self.line = line
        super().__init__(f"{self.path}, line {line}: {problem}")


def open_text(path: PathLike, mode: str = "rt") -> IO[str]:
    """Open a text file, transparently (de)compressing names ending in `.gz`."""
    if str(path).endswith(".gz"):
        return gzip.open(path, mode, encoding="utf-8")  # type: ignore[return-value]
    return open(path, mode, encoding="utf-8")  # noqa: SIM115 - the caller closes it


def json_lines(path: PathLike) -> Iterator[tuple[int, dict[str, object]]]:
    """Yield `(line_number, object)` for each non-blank line (numbered from 1).

    Raises TraceFormatError for a line that is not a JSON object.
    """
    for lineno, line in _text_lines(path):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceFormatError(path, lineno, f"invalid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise TraceFormatError(path, lineno, "expected a JSON object")
        yield lineno, obj


def _text_lines(path: PathLike) -> Iterator[tuple[int, str]]:
    """`(line_number, text)` of each line; a damaged or truncated gzip stream or
    bytes that are not UTF-8 raise TraceFormatError naming the line."""
    lineno = 0
    with open_text(path) as f:
        try:
            for lineno, line in enumerate(f, 1):
                yield lineno, line
        except (EOFError, zlib.error, gzip.BadGzipFile, UnicodeDecodeError) as e:
            raise TraceFormatError(path, lineno + 1, f"unreadable: {e}") from None


def first_record(path: PathLike) -> tuple[int, dict[str, object]]:
    """The first non-blank line of a JSONL file; TraceFormatError if it has none."""
    for rec in json_lines(path):
        return rec
    raise TraceFormatError(path, 1, "file has no records")


class Fields:
    """Typed access to one JSON record, raising TraceFormatError naming the line."""

    __slots__ = ("path", "line", "obj")

    def __init__(self, path: PathLike, line: int, obj: dict[str, object]) -> None:
        self.path, self.line, self.obj = path, line, obj

    def error(self, problem: str) -> TraceFormatError:
        return TraceFormatError(self.path, self.line, problem)

    def get(self, key: str) -> object:
        if key not in self.obj:
            raise self.error(f"missing field {key!r}")
        return self.obj[key]

    def integer(self, key: str, minimum: int = 0, maximum: int | None = None) -> int:
        v = self.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            raise self.error(f"{key!r} must be an integer >= {minimum}, got {v!r}")
        if maximum is not None and v > maximum:
            raise self.error(f"{key!r} must be at most {maximum:,}, got {v!r}")
        return v

    def number(self, key: str) -> float:
        v = self.get(key)
        # json.loads reads NaN and Infinity; a time must be a finite number
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < math.inf:
            raise self.error(f"{key!r} must be a finite number >= 0, got {v!r}")
        return float(v)

    def session(self, key: str) -> int | str:
        v = self.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise self.error(f"{key!r} must be an integer or a string, got {v!r}")
        return v

    def int_array(self, key: str, *, nonempty: bool) -> array[int]:
        v = self.get(key)
        if not isinstance(v, list):
            raise self.error(f"{key!r} must be a list of integers, got {type(v).__name__}")
        if nonempty and not v:
            raise self.error(f"{key!r} must not be empty")
        if any(type(x) is not int for x in v):
            bad = next(x for x in v if type(x) is not int)
            raise self.error(f"{key!r} must hold only integers, found {bad!r}")
        try:
            return array("q", v)
        except OverflowError:
            raise self.error(f"{key!r} holds an integer outside the 64-bit range") from None


def data_file(*parts: str) -> Path:
    """Path of a file bundled under `mambaradix/data/` (never `../shared`)."""
    root = resources.files("mambaradix") / "data"
    path = Path(str(root.joinpath(*parts)))
    if not path.is_file():
        raise FileNotFoundError(f"bundled data file missing: {path}")
    return path
