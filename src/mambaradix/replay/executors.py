"""Where a sweep's cells run, beyond the local process pool.

`sweep(..., executor=...)` takes any `concurrent.futures.Executor`. Cells are submitted
as `run_sweep_cell(work, cell)` with `work = (trace, profile)` passed by value (pickled), never
by name: a remote worker needs neither the bundled data nor the `text` extra. An executor
that can place data on its workers once (`SharingExecutor.share`) gets the work that way
instead of once per cell.

`DaskExecutor("dask://HOST:PORT")` runs them on a Dask cluster (the `dask` extra:
`dask[distributed]`): `Client.get_executor()` with `pure=False`, and the work scattered
to every worker (`Client.scatter(..., broadcast=True)`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future, as_completed
from importlib import import_module
from typing import Any

from mambaradix.replay.cells import Cell, Work, run_sweep_cell
from mambaradix.replay.results import ReplayResult

_DASK_URL = re.compile(r"^dask://([A-Za-z0-9.\-\[\]:]+):(\d{1,5})$")


class SharingExecutor(Executor):
    """An executor that can send an object to its workers once."""

    def share(self, obj: Any) -> Any:
        """A handle that stands for `obj` in later `submit` arguments."""
        return obj


class DaskExecutor(SharingExecutor):
    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        address = dask_address(url)
        try:
            distributed: Any = import_module("distributed")  # untyped: used through Any
        except ImportError:
            raise ValueError(
                "--executor dask:// needs the dask extra: pip install 'mambaradix[dask]'"
            ) from None
        try:
            self.client: Any = distributed.Client(address, timeout=timeout_s)
        except (OSError, TimeoutError) as e:
            raise ValueError(
                f"--executor {url}: cannot reach the Dask scheduler at {address}: {e}"
            ) from None
        self._executor: Any = self.client.get_executor(pure=False)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = self._executor.submit(fn, *args, **kwargs)
        return future

    def share(self, obj: Any) -> Any:
        return self.client.scatter([obj], broadcast=True)[0]

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._executor.shutdown(wait=wait)
        self.client.close()


def dask_address(url: str) -> str:
    """`dask://HOST:PORT` -> the scheduler's `tcp://HOST:PORT`; ValueError otherwise."""
    m = _DASK_URL.match(url)
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise ValueError(f"--executor must be dask://HOST:PORT, got {url!r}")
    return f"tcp://{m.group(1)}:{m.group(2)}"


def open_executor(url: str) -> Executor:
    """The executor a `--executor` value names."""
    return DaskExecutor(url)


def run_on(
    executor: Executor, work: Work, cells: list[Cell], progress: Callable[[], None]
) -> list[ReplayResult]:
    """Run every cell on `executor`; results in completion order."""
    shared = executor.share(work) if isinstance(executor, SharingExecutor) else work
    futures: Iterable[Future[ReplayResult]] = [
        executor.submit(run_sweep_cell, shared, cell) for cell in cells
    ]
    results = []
    for f in as_completed(futures):
        results.append(f.result())
        progress()
    return results
