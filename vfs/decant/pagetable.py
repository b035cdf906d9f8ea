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


class PageTable(Sequence["PageRecord"]):
    """Validated page records in manifest order; `table[i]` makes record i anew."""

    def __init__(self, pages: Sequence[PageRecord] = ()) -> None:
        self._scalars = {name: array("q") for name in _SCALARS}
        self._shape = array("q")  # three a page: Y, X, S (0 when the shape is [Y, X])
        self._dtype = array("b")
        self._first = array("q", [0])  # page i's segments are [_first[i], _first[i + 1])
        self._offsets = array("q")
        self._counts = array("q")
        # The first refusal met while reading the pages; raised where the old parser raised it.
        self.error: Exception | None = None
        for page in pages:
            self.append(page)

    def append(self, page: PageRecord) -> None:
        """Add a record check_geometry has passed (its dtype known, its shape 2 or 3 long)."""
        for name, column in self._scalars.items():
            column.append(getattr(page, name))
        self._shape.extend((*page.shape, 0)[:3])
        self._dtype.append(_DTYPES.index(page.dtype))
        self._offsets.extend(page.dataoffsets)
        self._counts.extend(page.databytecounts)
        self._first.append(len(self._offsets))

    def __len__(self) -> int:
        return len(self._dtype)

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
        return self._record(i)

    def _record(self, i: int) -> PageRecord:
        from vfs.decant.manifest import PageRecord

        y, x, s = self._shape[3 * i : 3 * i + 3]
        first, end = self._first[i], self._first[i + 1]
        scalars = {name: column[i] for name, column in self._scalars.items()}
        return PageRecord(
            shape=(y, x, s) if s else (y, x),
            dtype=_DTYPES[self._dtype[i]],
            dataoffsets=tuple(self._offsets[first:end]),
            databytecounts=tuple(self._counts[first:end]),
            **scalars,
        )

    def __iter__(self) -> Iterator[PageRecord]:
        return (self._record(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PageTable):
            return self._columns() == other._columns()
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def _columns(self) -> tuple[Any, ...]:
        return (self._scalars, self._shape, self._dtype, self._first, self._offsets, self._counts)

    def __repr__(self) -> str:
        return f"PageTable({len(self)} pages, {self.segments()} segments)"

    def segments(self) -> int:
        return len(self._offsets)

    def nbytes(self) -> int:
        """Σ databytecounts over every page."""
        return sum(self._counts)

    def indexes(self) -> array[int]:
        return self._scalars["index"]


def segment_columns(pages: Sequence[PageRecord]) -> tuple[np.ndarray[Any, Any], ...]:
    """Every pixel segment of `pages` as columns: file offset, byte count, its page's index and
    its position in that page's serialized bytes. From a PageTable's own columns without making
    a record (2^21 segments as tuples of Python ints took ~600 MiB)."""
    import numpy as np  # not at start-up: the daemon imports this before any archive opens

    empty = np.zeros(0, np.int64)
    if isinstance(pages, PageTable):
        offsets = np.frombuffer(pages._offsets, np.int64) if pages.segments() else empty
        counts = np.frombuffer(pages._counts, np.int64) if pages.segments() else empty
        first = np.frombuffer(pages._first, np.int64)
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
