"""What every command shares: the one-line argument parser, argument types that
refuse nonsense (nan, inf, zero or negative where meaningless, fractions for
counts), output-path checks made before any work, and all-or-nothing writes."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

from mambaradix.validate import suggest

__all__ = [
    "STDOUT",
    "Parser",
    "UsageError",
    "check_output",
    "count",
    "names",
    "plot_formats",
    "real",
    "reals",
    "suggest",
    "write_all",
]

STDOUT = "-"  # an output path that means stdout


class UsageError(Exception):
    """Bad input found by a command's `validate()`: one line on stderr, exit 2."""


class HelpFormatter(argparse.HelpFormatter):
    """Help that shows every option's default (unless its text already says it), and
    never breaks a name such as `synthetic-agent` at its hyphen."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        empty = isinstance(default, (list, tuple, dict, set)) and not default
        if (
            not action.option_strings
            or default is None
            or default is False
            or default == argparse.SUPPRESS
            or empty
            or "default" in text
        ):
            return text
        if isinstance(default, (list, tuple)):
            shown = ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in default)
        elif isinstance(default, float):
            shown = f"{default:g}"
        else:
            shown = str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block), still exit code 2, the
    defaults in `--help`, and "did you mean" for a mistyped choice."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is not None and value not in choices:
            listed = ", ".join(map(repr, choices))
            hint = suggest(str(value), [str(c) for c in choices])
            raise argparse.ArgumentError(
                action, f"invalid choice: {value!r} (choose from {listed}){hint}"
            )


class Listed:
    """Names for a help text, looked up only when the help is shown (`--help`);
    use as `help="... %(known)s"` after `listed(action, names)`."""

    def __init__(self, names: Callable[[], Iterable[str]]) -> None:
        self._names = names

    def __str__(self) -> str:
        return ", ".join(self._names())


def listed(action: argparse.Action, names: Callable[[], Iterable[str]]) -> None:
    """Give `action`'s help a `%(known)s` that lists `names()`."""
    action.known = Listed(names)  # type: ignore[attr-defined]


# ---------------------------------------------------------------- argument types


def count(minimum: int, below: tuple[int, str] | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number >= `minimum` ("3", not "3.0" or "1e3")
    and, with `below=(limit, text)`, < limit (`text` says the limit)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {text!r}")
        if below is not None and value >= below[0]:
            raise argparse.ArgumentTypeError(f"must be < {below[1]}, got {text!r}")
        return value

    parse.__name__ = "count"
    return parse


def _real(text: str, low: float, high: float | None, low_open: bool, high_open: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    lo = value > low if low_open else value >= low
    hi = high is None or (value < high if high_open else value <= high)
    if not (lo and hi):
        rule = f"{'>' if low_open else '>='} {low:g}"
        if high is not None:
            rule += f" and {'<' if high_open else '<='} {high:g}"
        raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
    return value


def real(
    low: float, high: float | None = None, *, low_open: bool = True, high_open: bool = True
) -> Callable[[str], float]:
    """An argparse type: a finite number above `low` (and below `high`)."""

    def parse(text: str) -> float:
        return _real(text, low, high, low_open, high_open)

    parse.__name__ = "real"
    return parse


def reals(
    low: float, high: float | None = None, *, low_open: bool = True
) -> Callable[[str], list[float]]:
    """An argparse type: comma-separated finite numbers in (low, high) ([low, high) when
    not `low_open`), no repeats."""

    def parse(text: str) -> list[float]:
        parts = [x.strip() for x in text.split(",")]
        if not all(parts):
            raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}")
        values = [_real(x, low, high, low_open, True) for x in parts]
        _no_repeats(values)
        return values

    parse.__name__ = "reals"
    return parse


def names(text: str) -> list[str]:
    """An argparse type: comma-separated names, no empty ones, no repeats."""
    parts = [x.strip() for x in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"expected names separated by commas, got {text!r}")
    _no_repeats(parts)
    return parts


def _no_repeats(values: list[float] | list[str]) -> None:
    repeated = sorted({str(v) for v in values if values.count(v) > 1})  # type: ignore[arg-type]
    if repeated:
        raise argparse.ArgumentTypeError(f"{', '.join(repeated)} given more than once")


# ---------------------------------------------------------------- output paths


def plot_formats() -> dict[str, str]:
    """File extensions matplotlib can write, without the dot -> description."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    return dict(FigureCanvasAgg(Figure()).get_supported_filetypes())


def is_stdout(path: Path | str | None) -> bool:
    return path is not None and str(path) == STDOUT


def check_output(path: Path, flag: str, inputs: Iterable[tuple[Path | str, str]] = ()) -> None:
    """UsageError unless `path` can be written: stdout (`-`), or not a directory and
    either a writable file or creatable inside the nearest existing directory above
    it; and not one of `inputs`, (path, what it is) pairs: the run would overwrite
    what it reads."""
    if is_stdout(path):
        return
    for source, what in inputs:
        if Path(source).is_file() and _same_file(path, Path(source)):
            raise UsageError(f"{flag} {path} is {what}: the run would overwrite it")
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a directory; name a file")
    if path.exists() and not path.is_file():  # a device or a FIFO: the output is renamed onto it
        raise UsageError(f"{flag} {path} is not a regular file")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise UsageError(f"{flag} {path} is not writable")
        return
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: {parent} is a file, so no directory can be made there")
    try:  # a real probe: os.access says yes to root, and to read-only file systems
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot create files in {parent} ({e.strerror})") from None


def _same_file(a: Path, b: Path) -> bool:
    """Whether `a` names the existing file `b` (through links, `..` and hard links)."""
    try:
        return a.exists() and os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def write_all(writers: dict[Path, Callable[[Path], object]]) -> None:
    """Write every file or none: each writer writes a temporary file next to its
    target (same extension), and only when all have succeeded are they renamed
    into place (a symlink's target, not the link). On any failure, Ctrl-C
    included, the temporaries are removed."""
    temps: dict[Path, Path] = {}
    try:
        for link, write in writers.items():
            target = link.resolve()  # through a symlink to its file, the link kept
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(
                dir=target.parent, prefix=f".{target.stem}-", suffix=target.suffix
            )
            os.close(fd)
            temps[target] = Path(name)
            write(temps[target])
        for target, temp in temps.items():
            os.replace(temp, target)
            os.chmod(target, 0o666 & ~_umask())
        temps = {}
    finally:
        for temp in temps.values():
            temp.unlink(missing_ok=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)
