"""The offset → region table of one original: which husk run or pixel segment holds each byte."""

from __future__ import annotations

import errno
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from vfs.decant.manifest import PageRecord
from vfs.errors import ManifestError

HUSK = -1


@dataclass(frozen=True)
class Region:
    start: int  # file offset
    length: int
    page: int  # page index, or HUSK
    pos: int  # position in the page's serialized bytes, or in the husk


class RegionIndex:
    """Regions sorted by file offset, covering [0, size) with no gap and no overlap.

    Built once per opened original (spec §5's walk, made random-access): a read finds its first
    region with bisect and walks forward, so only the pages and husk blocks it touches are decoded.
    """

    def __init__(self, regions: list[Region], size: int, husk_size: int) -> None:
        self.regions = regions
        self.size = size
        self.husk_size = husk_size
        self._starts = [r.start for r in regions]
        # _next_page[i]: the first page after region i other than its own (the read-ahead target).
        self._next_page: list[int | None] = [None] * len(regions)
        self.page_start: dict[int, int] = {}
        for r in reversed(regions):
            if r.page != HUSK:
                self.page_start[r.page] = r.start
        nearest: int | None = None  # page of the nearest pixel region after i
        other: int | None = None  # the nearest page after i that differs from `nearest`
        for i in range(len(regions) - 1, -1, -1):
            page = regions[i].page
            self._next_page[i] = nearest if nearest != page else other
            if page != HUSK and page != nearest:
                nearest, other = page, nearest

    @classmethod
    def build(
        cls, pages: Sequence[PageRecord], size: int, husk_size: int, source: str
    ) -> RegionIndex:
        pixels: list[tuple[int, int, int, int]] = []
        for page in pages:
            pos = 0
            for off, cnt in zip(page.dataoffsets, page.databytecounts, strict=True):
                if cnt:
                    pixels.append((off, cnt, page.index, pos))
                pos += cnt
        pixels.sort()
        regions: list[Region] = []
        cur = hp = 0
        for off, cnt, index, pos in pixels:
            if off < cur:
                raise ManifestError(
                    f"{source}: pixel segment at offset {off} of page {index} overlaps the "
                    f"previous one (ends at {cur})"
                )
            if off > cur:
                regions.append(Region(cur, off - cur, HUSK, hp))
                hp += off - cur
            regions.append(Region(off, cnt, index, pos))
            cur = off + cnt
        if cur > size:
            raise ManifestError(f"{source}: pixel segments run past original_size ({cur} > {size})")
        if cur < size:
            regions.append(Region(cur, size - cur, HUSK, hp))
            hp += size - cur
        if hp != husk_size:
            raise ManifestError(
                f"{source}: the pixel layout leaves {hp} husk bytes, husk_raw_size says {husk_size}"
            )
        return cls(regions, size, husk_size)

    def locate(self, offset: int) -> int:
        """Index of the region holding byte `offset` (0 <= offset < size)."""
        return bisect_right(self._starts, offset) - 1

    def spans(self, offset: int, size: int) -> Iterator[tuple[Region, int, int]]:
        """(region, start within region, length) for each region the range touches, in order."""
        if offset < 0:  # bisect would land on the last region and serve the wrong bytes
            raise OSError(errno.EINVAL, f"negative read offset {offset}")
        end = min(offset + size, self.size)
        if offset >= end:
            return
        i = self.locate(offset)
        while offset < end:
            r = self.regions[i]
            inner = offset - r.start
            n = min(r.length - inner, end - offset)
            yield r, inner, n
            offset += n
            i += 1

    def next_page_after(self, offset: int) -> int | None:
        """The first page whose pixels start after the region holding `offset` (for read-ahead)."""
        if not 0 <= offset < self.size:
            return None
        return self._next_page[self.locate(offset)]
