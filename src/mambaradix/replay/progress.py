"""Progress bars (tqdm, the `replay` extra) for the replay's long phases, on stderr.

Library calls show nothing by default; the CLI turns bars on for what it runs
with `with shown(): ...`. A bar appears only once its phase has run for
`delay` seconds, so short phases stay silent. Without tqdm installed there are
no bars.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")
DELAY_S = 1.0  # a bar for a phase that may be short appears after this long
_SHOWN: ContextVar[bool] = ContextVar("mambaradix_progress", default=False)

__all__ = ["Counter", "counter", "shown", "track"]


@contextmanager
def shown(on: bool = True) -> Iterator[None]:
    """Show (or hide) progress bars inside the block."""
    token = _SHOWN.set(on)
    try:
        yield
    finally:
        _SHOWN.reset(token)


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # the replay extra is optional for library use
        return None
    return tqdm


def track(
    items: Iterable[T], desc: str, total: int | None = None, unit: str = "it", delay: float = 1.0
) -> Iterable[T]:
    """`items`, with a bar while `shown()` is on (it disappears when done)."""
    tqdm = _tqdm()
    if not _SHOWN.get() or tqdm is None:
        return items
    bar: Iterable[T] = tqdm(
        items, desc=desc, total=total, unit=unit, delay=delay, leave=False, file=sys.stderr
    )
    return bar


class Counter:
    """A bar advanced by hand; a no-op when bars are off."""

    def __init__(self, bar: Any = None) -> None:
        self._bar = bar

    def update(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def counter(
    total: int, desc: str, unit: str, show: bool | None = None, delay: float = 0.0
) -> Counter:
    """A bar of `total` steps, kept on screen when done (if it appeared: after
    `delay` seconds); `show=None` follows `shown()`."""
    tqdm = _tqdm()
    if not (_SHOWN.get() if show is None else show) or tqdm is None:
        return Counter()
    return Counter(tqdm(total=total, desc=desc, unit=unit, delay=delay, file=sys.stderr))
