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
