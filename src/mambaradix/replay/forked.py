"""Run a sweep's cells on forked worker processes that Ctrl-C stops at once.

Each worker takes the next cell index from a shared counter, runs the cell and
sends `(index, result)` back over its own pipe; the parent waits on the pipes.
Workers ignore SIGINT (they are started with it blocked, so a Ctrl-C cannot
reach one before it does) and use one torch thread. On any exception in the
parent, KeyboardInterrupt included, every worker is killed: the parent never
waits on a queue, a lock or a task a worker might hold (`multiprocessing.Pool`
can hang there when it is terminated). A worker that fails sends its
exception; one that dies is reported with its exit code.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import signal
import sys
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["run_forked"]


def _quiet() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def _worker(run: Callable[[T], Any], items: Sequence[T], counter: Any, out: Connection) -> None:
    _quiet()
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
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        for _ in range(workers):
            receive, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_worker, args=(run, items, counter, send), daemon=True)
            proc.start()
            send.close()
            procs.append(proc)
            pipes.append(receive)
        signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a Ctrl-C meanwhile lands here
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
