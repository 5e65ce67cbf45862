"""The cache is not thread-safe; its debug guard (core/threads.py) says so when two
threads are inside it at once, and costs nothing when off.

The race is made certain, not hoped for: thread A's insert stops inside the tree (in
a listener, which the tree calls mid-operation) until the main thread has tried its
own call."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from mambaradix import MambaRadixCache
from mambaradix.core.threads import ENV, ConcurrentUseError

SRC = Path(__file__).resolve().parents[1] / "src"


class Stopper:
    """A listener that holds the first node_added call until released."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()

    def node_added(self, node: Any) -> None:
        self.inside.set()
        assert self.release.wait(10)

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None


def hold_inside(cache: MambaRadixCache) -> tuple[threading.Thread, Stopper, list[object]]:
    """Thread 'A' stops inside cache.insert; returns it, its listener and its result."""
    stopper, out = Stopper(), []
    cache.add_listener(stopper)  # type: ignore[arg-type]
    thread = threading.Thread(
        target=lambda: out.append(cache.insert([1, 2, 3], [10, 11, 12], 7)), name="A"
    )
    thread.start()
    assert stopper.inside.wait(10)
    return thread, stopper, out


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.insert([1, 2, 9], [20, 21, 22], 8),
        lambda c: c.match_prefix([1, 2]),
        lambda c: c.evict(kv_tokens=1),
    ],
    ids=["insert", "match_prefix", "evict"],
)
def test_a_second_thread_inside_is_refused(call: Any) -> None:
    cache = MambaRadixCache(check_threads=True)
    cache.insert([5, 6], [0, 1], 1)
    thread, stopper, out = hold_inside(cache)
    with pytest.raises(ConcurrentUseError, match=r"while thread 'A' is inside insert\(\)"):
        call(cache)
    stopper.release.set()
    thread.join()
    assert len(out) == 1  # A finished its insert
    cache.check_invariants()
    assert cache.match_prefix([1, 2, 3]).prefix_len == 3  # A's insert, nothing of ours
    assert cache.total_size() == (5, 2)


def test_a_cache_handed_between_threads_is_fine() -> None:
    cache = MambaRadixCache(check_threads=True)
    for i in range(4):
        t = threading.Thread(target=cache.insert, args=([i, 100], [2 * i, 2 * i + 1], i))
        t.start()
        t.join()
    cache.check_invariants()
    assert cache.total_size() == (8, 4)


def test_off_by_default_it_is_the_plain_class(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    if sys.flags.dev_mode:
        pytest.skip("this run is under python -X dev, which turns the guard on")
    assert type(MambaRadixCache()) is MambaRadixCache  # no wrapper: no cost
    monkeypatch.setenv(ENV, "0")
    assert type(MambaRadixCache()) is MambaRadixCache
    monkeypatch.setenv(ENV, "1")
    assert type(MambaRadixCache()) is not MambaRadixCache
    assert type(MambaRadixCache(check_threads=False)) is MambaRadixCache


def test_python_dev_mode_turns_it_on() -> None:
    code = "from mambaradix import MambaRadixCache as C; print(type(C()).__name__)"
    env = {k: v for k, v in os.environ.items() if k != ENV} | {"PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, "-X", "dev", "-c", code], capture_output=True, text=True, env=env
    )
    assert out.stdout.strip() == "ThreadCheckedMambaRadixCache", out.stderr


def test_a_guarded_cache_pickles_and_copies() -> None:
    cache = MambaRadixCache(check_threads=True)
    cache.insert([1, 2], [0, 1], 5)
    for twin in (copy.deepcopy(cache), pickle.loads(pickle.dumps(cache))):
        assert type(twin) is type(cache)  # guarded, as the original is
        twin.check_invariants()
    plain = MambaRadixCache(check_threads=False)
    assert type(copy.deepcopy(plain)) is MambaRadixCache
