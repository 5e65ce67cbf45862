"""Run a sweep's cells on forked worker processes that Ctrl-C stops at once.

Each worker takes the next cell index from a shared counter, runs the cell and
sends `(index, result)` back over its own pipe; the parent waits on the pipes.
Workers ignore SIGINT (they are started with it blocked, so a Ctrl-C cannot
reach one before it does), die on SIGTERM and SIGHUP, die with the parent however
it ends (Linux's parent-death signal; elsewhere a thread that watches the parent),
and use one torch thread. On any exception in the parent, KeyboardInterrupt
included (the CLI turns SIGTERM and SIGHUP into one), every worker is killed: the parent never
waits on a queue, a lock or a task a worker might hold (`multiprocessing.Pool`
can hang there when it is terminated). A worker that fails sends its
exception; one that dies is reported with its exit code.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["run_forked"]


# Held back while workers start: a Ctrl-C then reaches the parent alone, and a SIGTERM
# or SIGHUP to the group reaches each worker once it has its own handlers.
BLOCKED = {signal.SIGINT, signal.SIGTERM} | (
    {signal.SIGHUP} if hasattr(signal, "SIGHUP") else set()
)
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _quiet(parent: int) -> None:
    """A worker ignores Ctrl-C (the parent stops it), dies on SIGTERM and SIGHUP
    (the handlers it inherited from the parent may raise instead), and dies
    with its parent, however the parent ends (even by SIGKILL)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in BLOCKED - {signal.SIGINT}:
        signal.signal(sig, signal.SIG_DFL)
    _die_with(parent)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, BLOCKED)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def _die_with(parent: int) -> None:
    """SIGKILL this process when `parent` ends: the kernel's parent-death signal on
    Linux, a watching thread elsewhere."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        ok = sys.platform.startswith("linux") and libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) == 0
    except (OSError, AttributeError):
        ok = False
    if not ok:
        threading.Thread(target=_watch, args=(parent,), daemon=True).start()
    if os.getppid() != parent:  # it ended before the signal was asked for
        os._exit(1)


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _worker(
    run: Callable[[T], Any], items: Sequence[T], counter: Any, out: Connection, parent: int
) -> None:
    _quiet(parent)
    while True:
        with counter.get_lock():
            i = counter.value
            counter.value += 1
        if i >= len(items):
            return
        try:
            result: Any = run(items[i])
        except Exception as e:  # sent back, raised in the parent
            result = e if _picklable(e) else RuntimeError(f"{type(e).__name__}: {e}")
        out.send((i, result))


def _picklable(e: BaseException) -> bool:
    try:
        pickle.dumps(e)
    except Exception:
        return False
    return True


def run_forked(
    run: Callable[[T], Any],
    items: Sequence[T],
    workers: int,
    done: Callable[[], None],
) -> list[Any]:
    """`run(item)` for every item on `workers` forked processes; results in
    completion order; `done()` after each."""
    ctx = mp.get_context("fork")
    counter = ctx.Value("q", 0)
    procs: list[Any] = []
    pipes: list[Connection] = []
    old = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED)
    parent = os.getpid()
    try:
        for _ in range(workers):
            receive, send = ctx.Pipe(duplex=False)
            work = (run, items, counter, send, parent)
            proc = ctx.Process(target=_worker, args=work, daemon=True)
            proc.start()
            send.close()
            procs.append(proc)
            pipes.append(receive)
        signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a signal meanwhile lands here
        results = _collect(pipes, procs, len(items), done)
    except BaseException:
        for proc in procs:
            proc.kill()
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        for proc in procs:
            proc.join()
    return results


def _collect(
    pipes: list[Connection], procs: list[Any], n: int, done: Callable[[], None]
) -> list[Any]:
    results: list[Any] = []
    open_pipes = list(pipes)
    while len(results) < n:
        if not open_pipes:
            for proc in procs:
                proc.join(timeout=5)  # every pipe is closed: they have ended
            codes = [p.exitcode for p in procs]
            raise RuntimeError(
                f"sweep workers ended with {n - len(results)} cells left (exit codes {codes})"
            )
        for pipe in wait(open_pipes):
            assert isinstance(pipe, Connection)
            try:
                _, result = pipe.recv()
            except EOFError:  # that worker has ended
                open_pipes.remove(pipe)
                continue
            if isinstance(result, BaseException):
                raise result
            results.append(result)
            done()
    return results
