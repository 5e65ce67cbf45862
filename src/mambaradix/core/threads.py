"""`MambaRadixCache` is not thread-safe; in debug mode it says so when misused.

Like SGLang's and vLLM's prefix caches, the tree assumes one caller at a time: two
threads inside it at once (two inserts, an insert and an eviction) corrupt it without
a word. Callers that share a cache between threads hold one lock around every call.

The guard finds the mistake. It is on when `python -X dev` runs, when the environment
variable MAMBARADIX_CHECK_THREADS is set to anything but "" or "0", or when the cache
is built with `check_threads=True`. A guarded cache is an instance of a subclass whose
public methods record which thread is inside; a call from a second thread while the
first is still inside raises `ConcurrentUseError` before it changes anything. Handing
a cache from one thread to another between calls is fine. Off (the default), the cache
is the plain class: the guard costs nothing but one check when the cache is built.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

ENV = "MAMBARADIX_CHECK_THREADS"
C = TypeVar("C")
_GUARDED: dict[type, type] = {}  # a class -> its guarded subclass
_PLAIN: dict[type, type] = {}  # a guarded subclass -> the class it checks


class ConcurrentUseError(RuntimeError):
    """Two threads were inside one cache at once."""


def wanted(flag: bool | None) -> bool:
    """Whether to guard: `flag` if given, else `-X dev` or the environment variable."""
    if flag is not None:
        return flag
    return bool(sys.flags.dev_mode) or os.environ.get(ENV, "") not in ("", "0")


class _Guard:
    """Which thread is inside the cache, and how deep (a method may call another)."""

    __slots__ = ("lock", "owner", "method", "depth")

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held only while `owner` is read or written
        self.owner: int | None = None
        self.method = ""
        self.depth = 0

    def enter(self, cls: str, method: str) -> None:
        me = threading.get_ident()
        with self.lock:
            if self.owner is not None and self.owner != me:
                raise ConcurrentUseError(
                    f"{cls}.{method}() called from thread {_name(me)} while thread "
                    f"{_name(self.owner)} is inside {self.method}(): the cache is not "
                    "thread-safe; hold one lock around every call"
                )
            if self.depth == 0:
                self.owner, self.method = me, method
            self.depth += 1

    def leave(self) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth == 0:
                self.owner = None


def _name(ident: int) -> str:
    for t in threading.enumerate():
        if t.ident == ident:
            return repr(t.name)
    return str(ident)


def _checked(method: Callable[..., Any], cls: str) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        guard: _Guard = self._thread_guard
        guard.enter(cls, method.__name__)
        try:
            return method(self, *args, **kwargs)
        finally:
            guard.leave()

    return call


def _is_method(value: Any) -> bool:
    """A plain method: a Python function, or its compiled self (the core's compiled build
    makes functions Cython's own type, which `inspect.isfunction` does not accept)."""
    return inspect.isfunction(value) or type(value).__name__ == "cython_function_or_method"


def guarded_class(cls: type[C]) -> type[C]:
    """`cls` with every public method checked (one subclass per class, made once)."""
    if cls in _GUARDED:
        return _GUARDED[cls]
    methods: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if not name.startswith("_") and _is_method(value):
                methods[name] = _checked(value, cls.__name__)
    guarded = type(f"ThreadChecked{cls.__name__}", (cls,), methods)
    _GUARDED[cls] = _GUARDED[guarded] = guarded
    _PLAIN[guarded] = cls
    return guarded


def plain_class(cls: type) -> type:
    """The class a guarded class checks (`cls` itself if it is not one)."""
    return _PLAIN.get(cls, cls)


def guard(cache: Any, flag: bool | None) -> None:
    """Turn the guard on for `cache` if `wanted(flag)`."""
    if wanted(flag):
        cache._thread_guard = _Guard()
        cache.__class__ = guarded_class(type(cache))
