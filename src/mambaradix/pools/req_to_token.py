"""`ReqToTokenTable`: per running request, the KV index of each of its token
positions (SGLang's `ReqToTokenPool`, without the padding row).

    table (int64, rows x max_context)
    row 0: [ 17, 18, 19,  4,  0,  0, ... ]   <- request A, 4 tokens written
    row 1: [  7,  8,  0,  0,  0,  0, ... ]   <- request B
    row 2:   (free)

Rows come from a LIFO free list (`_freelist.FreeStack`): a fresh table hands
out rows 0, 1, 2, ...; a freed row is reused first. Freeing a row does not
clear it; a reader must only read positions it wrote.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from mambaradix.pools._checks import as_count, as_index_array, as_int, as_positive
from mambaradix.pools._freelist import FreeStack

__all__ = ["ReqToTokenTable"]


class ReqToTokenTable:
    """A `rows x max_context` numpy int64 table of KV indices.

    Every method either succeeds or raises (ValueError / TypeError) leaving
    the table unchanged. Reads and writes are only allowed on allocated rows.
    """

    __slots__ = ("_rows", "_table", "_width", "_flat")

    def __init__(self, rows: int, max_context: int) -> None:
        rows = as_positive(rows, "rows")
        max_context = as_positive(max_context, "max_context")
        self._rows = FreeStack(rows, "row")
        self._table = np.zeros((rows, max_context), dtype=np.int64)
        self._width = max_context
        # The table's buffer as one flat run of int64 (row r at r * max_context): a slice of
        # it is read and written by memcpy, 5x faster than numpy's indexing for the short
        # spans the lifecycle moves (docs/benchmarks.md, "The main job").
        self._flat = self._table.data.cast("B").cast("q")

    @property
    def capacity(self) -> int:
        """Number of rows. Pure."""
        return self._rows.size

    @property
    def max_context(self) -> int:
        """Number of token positions per row. Pure."""
        return self._width

    @property
    def table(self) -> npt.NDArray[np.int64]:
        """The underlying `np.ndarray` (rows x max_context, int64), for
        kernels that read it in bulk. Writing to it bypasses all checks."""
        return self._table

    def available_size(self) -> int:
        """Number of free rows. Pure."""
        return self._rows.available()

    def is_free(self, row: int) -> bool:
        """Whether `row` is free. Pure; ValueError if out of range."""
        return self._rows.is_free(self._check_row(row, allocated=False))

    def alloc(self) -> int | None:
        """Take a free row, or return None when none is left. Mutates."""
        got = self._rows.alloc(1)
        return None if got is None else got[0]

    def free(self, row: int) -> None:
        """Give `row` back. ValueError if out of range or already free.
        Mutates the free list only (the row's contents are kept)."""
        row = self._check_row(row, allocated=True)
        self._rows.free(array("q", (row,)), "row")

    def write(self, row: int, start: int, indices: Iterable[int]) -> None:
        """Store `indices` at positions start .. start+len(indices)-1 of
        `row`. ValueError if the row is free or the span leaves
        [0, max_context). Mutates those positions."""
        row = self._check_row(row, allocated=True)
        start = as_count(start, "start")
        # read only here (numpy copies it into the table): an array('q') needs no copy
        if isinstance(indices, array) and indices.typecode == "q":
            idx = indices
        else:
            idx = as_index_array(indices, "indices")
        end = start + len(idx)
        if end > self._width:
            raise ValueError(
                f"write of {len(idx)} indices at {start} ends at {end} > "
                f"max_context ({self.max_context})"
            )
        base = row * self._width
        self._flat[base + start : base + end] = idx

    def read(self, row: int, start: int, end: int) -> array[int]:
        """Positions start .. end-1 of `row` as a new `array('q')`.
        ValueError unless the row is allocated and
        0 <= start <= end <= max_context. Pure."""
        row = self._check_row(row, allocated=True)
        start = as_count(start, "start")
        end = as_count(end, "end")
        if not start <= end <= self._width:
            raise ValueError(
                f"need 0 <= start <= end <= max_context, got start={start}, end={end}, "
                f"max_context={self.max_context}"
            )
        base = row * self._width
        return array("q", self._flat[base + start : base + end].tobytes())

    def check_invariants(self) -> None:
        """O(rows) self-check; raises RuntimeError on corruption. Pure."""
        self._rows.check_invariants()

    def _check_row(self, value: object, *, allocated: bool) -> int:
        row = as_int(value, "row")
        if not 0 <= row < self._rows.size:
            raise ValueError(f"row: {row} is out of range [0, {self._rows.size})")
        if allocated and self._rows.is_free(row):
            raise ValueError(f"row: {row} is not allocated")
        return row

    def __repr__(self) -> str:
        return (
            f"ReqToTokenTable(rows={self.capacity}, max_context={self.max_context}, "
            f"available={self.available_size()})"
        )
