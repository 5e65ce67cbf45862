"""`HeldKV`: the KV indices a tree holds, checked and updated at memory-copy speed.

`insert` refuses a KV index the tree already holds, a negative one, or one repeated in the
part of the key it checks, at O(1) amortised cost per index. A Python set costs a hashed object
per index (about 60 ns to add and 40 to remove, and a cache miss each), far above the
rest of the tree, which copies and compares whole arrays. Allocators hand out runs of
consecutive indices, so a run gets a few C calls and anything else an O(1) step per
index:

* Storage: a paged byte map. Page p covers indices [p * PAGE, (p + 1) * PAGE) and is a
  bytearray holding 1 at each held index, with a count of its ones. A page whose count
  drops to 0 leaves the map (a few all-zero pages are kept for reuse, so a new page
  needs no zeroing). Memory follows the held indices: about one byte per index where
  they are dense (a pool's slots), at most one page per held index where they are not.
* Run detection: values[i:i+n] is range(a, a + n) exactly when its bytes equal the
  bytes of that range. `expected` builds them by copying the slice of a template
  (range(65536) as 8-byte items: the two low bytes of every index) and writing each
  non-zero higher byte of a into its byte column (one strided slice assignment; these
  bytes are the same across a page). About 1 ns per index, where
  `array('q', range(a, a + n))` alone costs over 30.
* A run inside one page (the common case) is checked with one `find` and marked or
  cleared with one slice assignment. Anything else is cut into runs where long ones
  exist (found by doubling then bisection, comparing only positions not yet compared)
  and goes index by index otherwise.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator

PAGE_BITS = 14  # at most 16: `expected` needs a page inside one 65536-aligned block
PAGE = 1 << PAGE_BITS  # indices per page, one byte each
PAGE_MASK = PAGE - 1
SPARE_PAGES = 16  # emptied pages kept (all zero) for reuse
PROBE = 64  # runs shorter than this go index by index (cheaper than `is_run`)

# Slice sources are bytearrays: assigning one costs a third of assigning bytes or a view.
_ONES = bytearray(b"\x01" * PAGE)
_ZEROS = bytearray(PAGE)
# Byte position, within one 8-byte item, of bits 8k..8k+7 of its value.
_COL = tuple(range(8)) if sys.byteorder == "little" else tuple(range(7, -1, -1))
# range(65536) as 8-byte items: bytes 0-1 of every index of a page, bytes 2-7 zero.
_TEMPLATE = bytearray(array("q", range(1 << 16)).tobytes())
_BYTE = [bytearray((c,)) for c in range(256)]  # bytearray: strided writes need no copy
_FAST_END = 1 << 32  # below it only bytes 0-3 of an index can be non-zero


def expected(a: int, n: int) -> bytearray:
    """The bytes of array('q', range(a, a + n)), for a >= 0 and a run inside one page."""
    low = a & 0xFFFF
    out = _TEMPLATE[8 * low : 8 * (low + n)]
    high, k = a >> 16, 2
    while high:  # bytes 2.. are the same for the whole run (it stays inside one page)
        if high & 255:
            out[_COL[k] :: 8] = _BYTE[high & 255] * n
        high >>= 8
        k += 1
    return out


def is_run(values: array[int], i: int, n: int, a: int) -> bool:
    """True when values[i:i+n] == range(a, a + n) (n >= 1); False for a < 0."""
    if a < 0 or values[i] != a or values[i + n - 1] != a + n - 1:
        return False  # also any a + n - 1 beyond int64
    with memoryview(values) as view:
        while n:
            m = min(n, PAGE - (a & PAGE_MASK))
            if expected(a, m) != view[i : i + m]:
                return False
            i, a, n = i + m, a + m, n - m
    return True


def segments(values: array[int], i: int, end: int) -> Iterator[tuple[int, int, bool]]:
    """Cut values[i:end] into (start, stop, is_run) pieces: maximal runs of at least
    PROBE indices, and loose pieces of at most PROBE indices in between. O(1) amortised
    per index: a run of length L costs O(L) compared bytes and O(log L) calls."""
    while i < end:
        a = values[i]
        if end - i >= PROBE and is_run(values, i, PROBE, a):
            good, bad = PROBE, end - i + 1  # values[i:i+good] is a run, values[i:i+bad] not
            step = PROBE
            while good + step < bad and is_run(values, i + good, step, a + good):
                good += step
                step *= 2
            bad = min(bad, good + step)
            while bad - good > 1:  # only positions past `good` are ever compared again
                mid = (good + bad) // 2
                if is_run(values, i + good, mid - good, a + good):
                    good = mid
                else:
                    bad = mid
            yield i, i + good, True
            i += good
        else:
            stop = min(i + PROBE, end)
            yield i, stop, False
            i = stop


class HeldKV:
    """A set of KV indices (ints) with run-speed `claim` / `release`."""

    __slots__ = ("_pages", "_counts", "_spare")

    def __init__(self) -> None:
        self._pages: dict[int, bytearray] = {}  # page number -> 1 at each held index
        self._counts: dict[int, int] = {}  # page number -> its held indices (> 0)
        self._spare: list[bytearray] = []  # all-zero pages to reuse

    def __contains__(self, index: int) -> bool:
        page = self._pages.get(index >> PAGE_BITS)
        return page is not None and page[index & PAGE_MASK] == 1

    def indices(self) -> set[int]:
        """Every held index (O(held + pages); for checks)."""
        out = set()
        for p, page in self._pages.items():
            base, j = p << PAGE_BITS, page.find(1)
            while j >= 0:
                out.add(base + j)
                j = page.find(1, j + 1)
        return out

    def check(self) -> None:
        """Raise AssertionError unless every page holds only 0/1 bytes, its count is
        its number of ones and not 0, and every spare page is all zero."""
        if self._pages.keys() != self._counts.keys():
            raise AssertionError("held KV: pages and counts disagree")
        for p, page in self._pages.items():
            ones = page.count(1)
            if ones + page.count(0) != PAGE or ones != self._counts[p] or not ones:
                raise AssertionError(f"held KV: page {p} holds {ones}, counted {self._counts[p]}")
        if any(page.count(0) != PAGE for page in self._spare):
            raise AssertionError("held KV: a spare page is not all zero")

    # ------------------------------------------------------------------ claim

    def claim(self, values: array[int], start: int, keep: int) -> bool | None:
        """Hold values[keep:] (start <= keep <= len), provided no index of
        values[start:] is held, negative, or there twice; otherwise change
        nothing and return None. Returns True when values[keep:] is one run of
        consecutive indices (then `release(..., run=True)` may be used for it)."""
        n = len(values) - start
        if n <= 0:
            return True
        a = values[start]
        lo = a & PAGE_MASK
        if lo + n <= PAGE and 0 <= a < _FAST_END:  # the common case: a run in one page?
            low = a & 0xFFFF  # expected(a, n), inlined: bytes 0-1 from the template
            want = _TEMPLATE[8 * low : 8 * (low + n)]
            if a >> 16:
                want[_COL[2] :: 8] = _BYTE[(a >> 16) & 255] * n
                if a >> 24:
                    want[_COL[3] :: 8] = _BYTE[a >> 24] * n
            if want == memoryview(values)[start:]:
                p, k = a >> PAGE_BITS, keep - start
                page = self._pages.get(p)
                if page is None:  # nothing held here yet
                    if k == n:
                        return True
                    page = self._page(p)
                elif page.find(1, lo, lo + n) >= 0:
                    return None
                page[lo + k : lo + n] = _ONES[k:n]
                self._counts[p] += n - k
                return True
        return self._claim_other(values[start:], keep - start)

    def _claim_other(self, new: array[int], k: int) -> bool | None:
        a = new[0]
        if not is_run(new, 0, len(new), a):
            return self._claim_pieces(new, k)
        if self._any_held(a, a + len(new)):
            return None
        self._mark_run(a + k, a + len(new))
        return True

    def _claim_pieces(self, new: array[int], keep: int) -> bool | None:
        """claim() for anything that is not one run: piece by piece, each checked
        against what is held so far (earlier pieces included), all undone on a
        conflict. Returns False: the kept part is not known to be one run."""
        done: list[tuple[int, int, bool]] = []
        for i, j, run in segments(new, 0, len(new)):
            if run:
                a = new[i]
                if self._any_held(a, a + j - i):
                    self._release_pieces(new, done)
                    return None
                self._mark_run(a, a + j - i)
            else:
                stop = self._mark_loose(new, i, j)
                if stop < j:
                    done.append((i, stop, False))
                    self._release_pieces(new, done)
                    return None
            done.append((i, j, run))
        if keep:  # the caller's duplicates were checked, not taken
            self._release_pieces(new, [(i, min(j, keep), r) for i, j, r in done if i < keep])
        return False

    def _any_held(self, a: int, b: int) -> bool:
        while a < b:
            lo = a & PAGE_MASK
            hi = min(PAGE, lo + b - a)
            page = self._pages.get(a >> PAGE_BITS)
            if page is not None and page.find(1, lo, hi) >= 0:
                return True
            a += hi - lo
        return False

    def _page(self, p: int) -> bytearray:
        page = self._pages.get(p)
        if page is None:
            page = self._pages[p] = self._spare.pop() if self._spare else bytearray(PAGE)
            self._counts[p] = 0
        return page

    def _mark_run(self, a: int, b: int) -> None:
        while a < b:
            lo = a & PAGE_MASK
            hi = min(PAGE, lo + b - a)
            self._page(a >> PAGE_BITS)[lo:hi] = _ONES[lo:hi]
            self._counts[a >> PAGE_BITS] += hi - lo
            a += hi - lo

    def _mark_loose(self, values: array[int], i: int, j: int) -> int:
        """Hold values[i:j] one by one; stop at the first one already held or
        negative and return its position (j when there is none)."""
        for k in range(i, j):
            v = values[k]
            if v < 0:  # not a pool slot (a run never starts below 0: see `is_run`)
                return k
            page = self._page(v >> PAGE_BITS)
            if page[v & PAGE_MASK]:  # (a page just taken is all zero: never here)
                return k
            page[v & PAGE_MASK] = 1
            self._counts[v >> PAGE_BITS] += 1
        return j

    # ---------------------------------------------------------------- release

    def release(self, values: array[int], run: bool) -> None:
        """Stop holding every index of `values` (all held). `run` may be True only
        when `values` is one run of consecutive indices (as `claim` reported), at
        least one index long."""
        n = len(values)
        if not run:
            self._release_pieces(values, list(segments(values, 0, n)))
            return
        a = values[0]
        lo = a & PAGE_MASK
        if lo + n > PAGE:
            self._clear_run(a, a + n)
            return
        p = a >> PAGE_BITS
        self._pages[p][lo : lo + n] = _ZEROS[:n]
        left = self._counts[p] - n
        if left:
            self._counts[p] = left
        else:
            self._drop_page(p)

    def _release_pieces(self, values: array[int], pieces: list[tuple[int, int, bool]]) -> None:
        for i, j, run in pieces:
            if run:
                self._clear_run(values[i], values[i] + j - i)
                continue
            for k in range(i, j):
                v = values[k]
                p = v >> PAGE_BITS
                self._pages[p][v & PAGE_MASK] = 0
                self._counts[p] -= 1
                if not self._counts[p]:
                    self._drop_page(p)

    def _clear_run(self, a: int, b: int) -> None:
        while a < b:
            lo = a & PAGE_MASK
            hi = min(PAGE, lo + b - a)
            p = a >> PAGE_BITS
            self._pages[p][lo:hi] = _ZEROS[lo:hi]
            self._counts[p] -= hi - lo
            if not self._counts[p]:
                self._drop_page(p)
            a += hi - lo

    def _drop_page(self, p: int) -> None:
        page = self._pages.pop(p)  # all zero: its count is 0
        del self._counts[p]
        if len(self._spare) < SPARE_PAGES:
            self._spare.append(page)
