"""A parsed manifest's page records as columns of machine integers, made records when read.

2^18 page records of 8 segments as Python objects are ~1 KiB each (a dataclass, three tuples,
~20 distinct ints): ~250 MiB. As columns they are ~90 bytes a page and 16 bytes a segment.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

from vfs.decant.geometry import ITEMSIZE

if TYPE_CHECKING:
    import numpy as np

    from vfs.decant.manifest import PageRecord

_DTYPES = tuple(ITEMSIZE)  # a page's dtype is one of these once check_geometry has passed
_SCALARS = (
    "index",
    "samplesperpixel",
    "planarconfig",
    "predictor",
    "rowsperstrip",
    "tilewidth",
    "tilelength",
)

PAGE_FIELDS = frozenset((*_SCALARS, "shape", "dtype", "dataoffsets", "databytecounts"))


class _Columns:
    """The columns page records are kept in; one set may hold many tables' pages (views)."""

    __slots__ = ("counts", "dtype", "first", "offsets", "scalars", "shape")

    def __init__(self) -> None:
        self.scalars = {name: array("q") for name in _SCALARS}
        self.shape = array("q")  # three a page: Y, X, S (0 when the shape is [Y, X])
        self.dtype = array("b")
        self.first = array("q", [0])  # page i's segments are [first[i], first[i + 1])
        self.offsets = array("q")
        self.counts = array("q")


class PageTable(Sequence["PageRecord"]):
    """Validated page records in manifest order; `table[i]` makes record i anew.

    A table may be a view of pages [lo, hi) of another's columns (`view`): a series' members
    each held a table of their own, ~1.2 KiB of empty columns each (400,000 members of a 3.6 MB
    archive: 1.3 GiB with their records; red team 87); their pages now share one set."""

    __slots__ = ("_cols", "_hi", "_lo", "error")

    def __init__(self, pages: Sequence[PageRecord] = ()) -> None:
        self._cols = _Columns()
        self._lo, self._hi = 0, -1  # -1: the columns' own table, which grows
        # The first refusal met while reading the pages; raised where the old parser raised it.
        self.error: Exception | None = None
        for page in pages:
            self.append(page)

    def view(self, lo: int, hi: int) -> PageTable:
        """Pages [lo, hi) of this table, sharing its columns (read-only)."""
        out = PageTable.__new__(PageTable)
        out._cols, out._lo, out._hi, out.error = self._cols, self._lo + lo, self._lo + hi, None
        return out

    def append(self, page: PageRecord) -> None:
        """Add a record check_geometry has passed (its dtype known, its shape 2 or 3 long)."""
        if self._hi != -1:
            raise TypeError("a view of a page table is read-only")
        c = self._cols
        for name, column in c.scalars.items():
            column.append(getattr(page, name))
        c.shape.extend((*page.shape, 0)[:3])
        c.dtype.append(_DTYPES.index(page.dtype))
        c.offsets.extend(page.dataoffsets)
        c.counts.extend(page.databytecounts)
        c.first.append(len(c.offsets))

    def _end(self) -> int:
        return len(self._cols.dtype) if self._hi == -1 else self._hi

    def __len__(self) -> int:
        return self._end() - self._lo

    @overload
    def __getitem__(self, i: int) -> PageRecord: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[PageRecord, ...]: ...

    def __getitem__(self, i: int | slice) -> PageRecord | tuple[PageRecord, ...]:
        if isinstance(i, slice):
            return tuple(self[k] for k in range(*i.indices(len(self))))
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("page table index out of range")
        return self._record(self._lo + i)

    def _record(self, i: int) -> PageRecord:
        from vfs.decant.manifest import PageRecord

        c = self._cols
        y, x, s = c.shape[3 * i : 3 * i + 3]
        first, end = c.first[i], c.first[i + 1]
        scalars = {name: column[i] for name, column in c.scalars.items()}
        return PageRecord(
            shape=(y, x, s) if s else (y, x),
            dtype=_DTYPES[c.dtype[i]],
            dataoffsets=tuple(c.offsets[first:end]),
            databytecounts=tuple(c.counts[first:end]),
            **scalars,
        )

    def __iter__(self) -> Iterator[PageRecord]:
        return (self._record(i) for i in range(self._lo, self._end()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PageTable):
            return self._columns() == other._columns()
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def _columns(self) -> tuple[Any, ...]:
        c, lo, hi = self._cols, self._lo, self._end()
        first, end = c.first[lo], c.first[hi]
        scalars = {name: column[lo:hi] for name, column in c.scalars.items()}
        starts = array("q", (f - first for f in c.first[lo : hi + 1]))
        return (scalars, c.shape[3 * lo : 3 * hi], c.dtype[lo:hi], starts,
                c.offsets[first:end], c.counts[first:end])  # fmt: skip

    def __repr__(self) -> str:
        return f"PageTable({len(self)} pages, {self.segments()} segments)"

    def _span(self) -> tuple[int, int]:
        """The segments of this table's pages: [first, end) of the columns'."""
        return self._cols.first[self._lo], self._cols.first[self._end()]

    def segments(self) -> int:
        first, end = self._span()
        return end - first

    def nbytes(self) -> int:
        """Σ databytecounts over every page."""
        first, end = self._span()
        return sum(self._cols.counts[first:end])

    def indexes(self) -> array[int]:
        return self._cols.scalars["index"][self._lo : self._end()]


def segment_columns(pages: Sequence[PageRecord]) -> tuple[np.ndarray[Any, Any], ...]:
    """Every pixel segment of `pages` as columns: file offset, byte count, its page's index and
    its position in that page's serialized bytes. From a PageTable's own columns without making
    a record (2^21 segments as tuples of Python ints took ~600 MiB)."""
    import numpy as np  # not at start-up: the daemon imports this before any archive opens

    empty = np.zeros(0, np.int64)
    if isinstance(pages, PageTable):
        c, (lo, end) = pages._cols, pages._span()
        offsets = np.frombuffer(c.offsets, np.int64)[lo:end] if end > lo else empty
        counts = np.frombuffer(c.counts, np.int64)[lo:end] if end > lo else empty
        first = np.frombuffer(c.first, np.int64)[pages._lo : pages._end() + 1] - lo
        per_page = np.diff(first)
        indexes = np.frombuffer(pages.indexes(), np.int64) if len(pages) else empty
    else:
        offsets = np.array([o for p in pages for o in p.dataoffsets], np.int64)
        counts = np.array([c for p in pages for c in p.databytecounts], np.int64)
        per_page = np.array([len(p.dataoffsets) for p in pages], np.int64)
        indexes = np.array([p.index for p in pages], np.int64)
        first = np.concatenate(([0], np.cumsum(per_page))).astype(np.int64)
    pos = np.cumsum(counts)
    pos -= counts  # bytes of all segments listed before each one
    page_base = np.concatenate((pos, [0]))[first[:-1]] if len(per_page) else empty
    pos -= np.repeat(page_base, per_page)  # ... of its own page
    owners = np.repeat(indexes.astype(np.int32), per_page)  # indexes < MAX_CHUNKS (2^24)
    return offsets, counts, owners, pos
