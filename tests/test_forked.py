"""`replay.forked.run_forked`: the sweep's worker processes (Ctrl-C is tested for
real, end to end, in `test_cli_interrupt.py`)."""

from __future__ import annotations

import os

import pytest

from mambaradix.replay.forked import run_forked


def square(x: int) -> int:
    return x * x


def fails_on_3(x: int) -> int:
    if x == 3:
        raise ValueError(f"cell {x} is bad")
    return x


def dies_on_3(x: int) -> int:
    if x == 3:
        os._exit(7)  # a worker killed from outside (the OOM killer, say)
    return x


class Unpicklable(Exception):
    def __reduce__(self) -> object:
        raise TypeError("no pickling")


def unpicklable_on_2(x: int) -> int:
    if x == 2:
        raise Unpicklable("a lock inside")
    return x


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_every_item_once(workers: int) -> None:
    ticks: list[int] = []
    out = run_forked(square, list(range(20)), workers, lambda: ticks.append(1))
    assert sorted(out) == [x * x for x in range(20)] and len(ticks) == 20


def test_a_failing_cell_raises_its_exception_in_the_parent() -> None:
    with pytest.raises(ValueError, match="cell 3 is bad"):
        run_forked(fails_on_3, list(range(8)), 2, lambda: None)


def test_an_unpicklable_exception_comes_back_as_its_message() -> None:
    with pytest.raises(RuntimeError, match="Unpicklable: a lock inside"):
        run_forked(unpicklable_on_2, list(range(8)), 2, lambda: None)


def test_a_dead_worker_is_reported_not_waited_for() -> None:
    with pytest.raises(
        RuntimeError, match=r"sweep workers ended with \d+ cells left \(exit codes \[7\]\)"
    ):
        run_forked(dies_on_3, list(range(8)), 1, lambda: None)
