"""The offset → region table of one original: which husk run or pixel segment holds each byte.

Held as numpy columns, ~20 bytes a region: a region as a Python object cost ~250, and an archive
may list 2^21 pixel segments, each with a husk run before it (a daemon opening one reached 1.1 GiB
building its index as objects, red team 84). A `Region` is made only for the regions a read walks.
"""

from __future__ import annotations

import errno
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from vfs.decant.manifest import PageRecord
from vfs.decant.pagetable import segment_columns
from vfs.errors import ManifestError

HUSK = -1
_NONE = -2  # no page follows (the read-ahead target's column)
SMALL_INDEX = 8192  # regions kept as lists too (~0.5 MiB at most)


@dataclass(frozen=True)
class Region:
    start: int  # file offset
    length: int
    page: int  # page index, or HUSK
    pos: int  # position in the page's serialized bytes, or in the husk


class RegionIndex(Sequence[Region]):
    """Regions sorted by file offset, covering [0, size) with no gap and no overlap.

    A pixel region is a run of segments contiguous in the file and in their page's bytes.
    Built once per opened original (spec §5's walk, made random-access): a read finds its first
    region by binary search and walks forward, so only the pages and husk blocks it touches are
    decoded. Region i runs from `_starts[i]` to the next start (the last to `size`); `_pages[i]`
    is its page (or HUSK) and `_pos[i]` where its bytes start in that page's bytes (or the husk).
    """

    def __init__(
        self, starts: np.ndarray[Any, Any], pages: np.ndarray[Any, Any],
        pos: np.ndarray[Any, Any], size: int, husk_size: int,
    ) -> None:  # fmt: skip
        self.size = size
        self.husk_size = husk_size
        # Offsets within an original under 2 GiB (nearly all) fit 32 bits: 16 MiB less for each
        # 2^22 regions (an archive at mode D's bounds of 2^21 segments held ~120 MiB of tables
        # open; red team 88). Positions lie within the original too (`build` checks the sums).
        wide = np.int64 if size >= 2**31 else np.int32
        self._starts = starts.astype(wide, copy=False)
        self._pages = pages.astype(np.int32, copy=False)
        self._pos = pos.astype(wide, copy=False)
        self._next_page = _next_pages(self._pages)
        # Each page's first byte in the file: sorted page indexes and where each starts.
        pixel = self._pages >= 0
        ids, first = np.unique(self._pages[pixel], return_index=True)
        self._page_ids = ids
        self._page_first = self._starts[pixel][first]
        # A small index (most originals: a few regions a page) is also kept as lists, which a
        # read's lookups take from faster: numpy's scalars made a warm 128 KiB read through
        # the index 4.4 us, against 2.5 as lists.
        self._rows: tuple[list[int], list[int], list[int]] | None = None
        if len(starts) <= SMALL_INDEX:
            self._rows = (self._starts.tolist(), self._pages.tolist(), self._pos.tolist())

    @classmethod
    def husk_only(cls, size: int) -> RegionIndex:
        """A verbatim original: one husk run over the whole file."""
        n = 1 if size else 0
        zeros = np.zeros(n, np.int64)
        return cls(zeros, np.full(n, HUSK, np.int32), zeros, size, size)

    @classmethod
    def build(
        cls, pages: Sequence[PageRecord], size: int, husk_size: int, source: str
    ) -> RegionIndex:
        # Temporaries are let go as soon as used: for 2^21 segments each column is 8-16 MiB.
        offsets, counts, owners, pos = segment_columns(pages)
        if len(offsets) and max(int(offsets.max()), int(counts.max())) > size:
            # Before any sum: numpy's int64 wraps silently past 2^63 (the manifest allows up
            # to that); within `size` (1 PiB at most) no sum below can pass it.
            raise ManifestError(f"{source}: pixel segments run past original_size ({size})")
        keep = counts > 0
        if not keep.all():
            offsets, counts, owners, pos = offsets[keep], counts[keep], owners[keep], pos[keep]
        del keep
        if len(offsets) > 1 and not (offsets[1:] >= offsets[:-1]).all():
            order = np.argsort(offsets, kind="stable")
            offsets, counts, owners, pos = offsets[order], counts[order], owners[order], pos[order]
            del order
        gaps = np.empty_like(offsets)  # husk bytes before each segment, after the one before
        gaps[:1] = offsets[:1]
        np.subtract(offsets[1:], offsets[:-1], out=gaps[1:])
        gaps[1:] -= counts[:-1]
        bad = np.flatnonzero(gaps < 0)
        if len(bad):
            k = bad[0]
            raise ManifestError(
                f"{source}: pixel segment at offset {offsets[k]} of page {owners[k]} overlaps the "
                f"previous one (ends at {offsets[k] - gaps[k]})"
            )
        cur = int(offsets[-1] + counts[-1]) if len(offsets) else 0
        # A segment that goes on where the one before ended, in the file and in the same page's
        # bytes, joins its region: a striped page's strips usually lie so, one region a page.
        joined = np.zeros(len(offsets), bool)
        if len(offsets) > 1:
            joined[1:] = gaps[1:] == 0
            joined[1:] &= owners[1:] == owners[:-1]
            joined[1:] &= pos[1:] == pos[:-1] + counts[:-1]
        del counts
        if joined.any():
            alone = ~joined
            offsets, owners, pos, gaps = offsets[alone], owners[alone], pos[alone], gaps[alone]
            del alone
        del joined
        if cur > size:
            raise ManifestError(f"{source}: pixel segments run past original_size ({cur} > {size})")
        tail = size - cur
        hp = int(gaps.sum()) + tail
        if hp != husk_size:
            raise ManifestError(
                f"{source}: the pixel layout leaves {hp} husk bytes, husk_raw_size says {husk_size}"
            )
        # A husk run fills each gap before a segment, and the tail after the last one.
        has_gap = gaps > 0
        n = len(offsets) + int(np.count_nonzero(has_gap)) + (1 if tail else 0)
        at = np.cumsum(has_gap)  # each segment's region: its index, plus the gaps up to it
        at += np.arange(len(offsets))
        starts = np.empty(n, np.int64)
        owner = np.full(n, HUSK, np.int32)
        where = np.empty(n, np.int64)
        starts[at], owner[at], where[at] = offsets, owners, pos
        del owners, pos
        husk_at = at[has_gap] - 1
        del at
        starts[husk_at] = offsets[has_gap] - gaps[has_gap]
        del offsets
        husk_pos = np.cumsum(gaps)  # husk bytes up to each segment
        where[husk_at] = (husk_pos - gaps)[has_gap]
        del husk_at, husk_pos, gaps, has_gap
        if tail:
            starts[-1], where[-1] = cur, hp - tail
        return cls(starts, owner, where, size, husk_size)

    @property
    def nbytes(self) -> int:
        """What the index holds in memory (its columns)."""
        columns = (self._starts, self._pages, self._pos, self._next_page)
        return sum(c.nbytes for c in columns) + self._page_ids.nbytes + self._page_first.nbytes

    def __len__(self) -> int:
        return len(self._starts)

    @overload
    def __getitem__(self, i: int) -> Region: ...

    @overload
    def __getitem__(self, i: slice) -> list[Region]: ...

    def __getitem__(self, i: int | slice) -> Region | list[Region]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("region index out of range")
        if self._rows is not None:
            return self._region(i)
        start = int(self._starts[i])
        end = int(self._starts[i + 1]) if i + 1 < len(self) else self.size
        return Region(start, end - start, int(self._pages[i]), int(self._pos[i]))

    def __iter__(self) -> Iterator[Region]:
        # In slices, not one numpy scalar at a time: the packer and restore walk every region.
        for lo in range(0, len(self), 65536):
            hi = lo + 65536
            ends = self._starts[lo + 1 : hi + 1].tolist()
            if hi >= len(self):
                ends.append(self.size)
            rows = zip(
                self._starts[lo:hi].tolist(), ends,
                self._pages[lo:hi].tolist(), self._pos[lo:hi].tolist(), strict=True,
            )  # fmt: skip
            for start, end, page, pos in rows:
                yield Region(start, end - start, page, pos)

    def _region(self, i: int) -> Region:
        """Region i (0 <= i < len) of a small index, from its lists."""
        starts, pages, pos = self._rows  # type: ignore[misc]
        end = starts[i + 1] if i + 1 < len(starts) else self.size
        return Region(starts[i], end - starts[i], pages[i], pos[i])

    def columns(self, i0: int, i1: int) -> tuple[np.ndarray[Any, Any], ...]:
        """Regions i0..i1 (inclusive) as columns: start, end, page (or HUSK) and pos."""
        starts = self._starts[i0 : i1 + 1].astype(np.int64)  # sums of them are a read's own
        ends = np.append(self._starts[i0 + 1 : i1 + 1], self._end_of(i1)).astype(np.int64)
        return starts, ends, self._pages[i0 : i1 + 1], self._pos[i0 : i1 + 1].astype(np.int64)

    def _end_of(self, i: int) -> int:
        return int(self._starts[i + 1]) if i + 1 < len(self._starts) else self.size

    def locate(self, offset: int) -> int:
        """Index of the region holding byte `offset` (0 <= offset < size)."""
        if self._rows is not None:
            return bisect_right(self._rows[0], offset) - 1
        return int(np.searchsorted(self._starts, offset, side="right")) - 1

    def spans(self, offset: int, size: int) -> Iterator[tuple[Region, int, int]]:
        """(region, start within region, length) for each region the range touches, in order."""
        if offset < 0:  # the search would land on the last region and serve the wrong bytes
            raise OSError(errno.EINVAL, f"negative read offset {offset}")
        end = min(offset + size, self.size)
        if offset >= end:
            return
        i = self.locate(offset)
        region = self._region if self._rows is not None else self.__getitem__
        while offset < end:
            r = region(i)
            inner = offset - r.start
            n = min(r.length - inner, end - offset)
            yield r, inner, n
            offset += n
            i += 1

    def page_start(self, page: int) -> int | None:
        """The file offset of the first byte of `page`'s pixels (None: no bytes in the file)."""
        i = int(np.searchsorted(self._page_ids, page))
        if i < len(self._page_ids) and self._page_ids[i] == page:
            return int(self._page_first[i])
        return None

    def next_page_after(self, offset: int) -> int | None:
        """The first page whose pixels start after the region holding `offset` (for read-ahead)."""
        if not 0 <= offset < self.size:
            return None
        page = int(self._next_page[self.locate(offset)])
        return None if page == _NONE else page


def _next_pages(pages: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """For each region, the page of the first pixel region after it whose page differs from its
    own (_NONE when none does): a husk run's is the next pixel region's page."""
    out = np.full(len(pages), _NONE, np.int32)
    pixel = pages >= 0
    seq = pages[pixel]
    if not len(seq):
        return out
    first_of_run = np.empty(len(seq), bool)
    first_of_run[0] = True
    np.not_equal(seq[1:], seq[:-1], out=first_of_run[1:])
    following = np.append(seq[first_of_run][1:], np.int32(_NONE)).astype(np.int32)
    run = np.cumsum(first_of_run, dtype=np.int32)
    run -= 1
    out[pixel] = following[run]
    del run, following, first_of_run
    husk = ~pixel
    ahead = np.cumsum(pixel, dtype=np.int32)[husk]  # pixel regions before each husk run
    del pixel
    later = ahead < len(seq)
    out[np.flatnonzero(husk)[later]] = seq[ahead[later]]
    return out
