"""Part of a page without the whole plane: which plane rows a range of the page's on-disk bytes
needs, and those bytes rebuilt from just those rows (striped or tiled, chunky or planar, edge
tiles; the caller converts byte order before `extract`)."""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np

from vfs.decant.layout import tile_grid
from vfs.decant.manifest import PageRecord


class PageGeometry:
    """A page's serialized bytes as runs ("pieces"), each a rectangle of the plane in C order:
    one per tile (and sample, when planar), or one per sample plane of a striped page."""

    def __init__(self, page: PageRecord, itemsize: int) -> None:
        y, x = page.shape[0], page.shape[1]
        s = page.shape[2] if len(page.shape) == 3 else 1
        self.shape = (y, x, s)
        self.plane_rowbytes = x * s * itemsize
        if page.tilewidth:
            rects = list(tile_grid(page))
        else:
            samples = range(s) if page.planarconfig == 2 and s > 1 else [-1]
            rects = [(sample, 0, y, 0, x) for sample in samples]
        self.starts: list[int] = []
        self.pieces: list[tuple[int, int, int, int, int, int]] = []  # sample y0 y1 x0 x1 rowbytes
        pos = 0
        for sample, y0, y1, x0, x1 in rects:
            rowbytes = (x1 - x0) * (s if sample < 0 else 1) * itemsize
            self.starts.append(pos)
            self.pieces.append((sample, y0, y1, x0, x1, rowbytes))
            pos += (y1 - y0) * rowbytes
        self.nbytes = pos

    def _touched(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """(piece index, first byte, end byte) within each piece that [start, stop) overlaps."""
        out = []
        i = bisect_right(self.starts, start) - 1
        while i < len(self.pieces) and self.starts[i] < stop:
            _sample, y0, y1, _x0, _x1, rowbytes = self.pieces[i]
            base = self.starts[i]
            a, b = max(start, base) - base, min(stop, base + (y1 - y0) * rowbytes) - base
            if a < b:
                out.append((i, a, b))
            i += 1
        return out

    def rows_for(self, start: int, stop: int) -> tuple[int, int]:
        """Plane rows [r0, r1) that hold the serialized bytes [start, stop)."""
        r0, r1 = self.shape[0], 0
        for i, a, b in self._touched(start, stop):
            y0, rowbytes = self.pieces[i][1], self.pieces[i][5]
            r0 = min(r0, y0 + a // rowbytes)
            r1 = max(r1, y0 - (-b // rowbytes))
        return (r0, r1) if r0 < r1 else (0, 0)

    def extract(self, rows: np.ndarray[Any, Any], r0: int, start: int, stop: int) -> bytes:
        """Serialized bytes [start, stop) from `rows`, the plane's rows [r0, r0 + len(rows)) as a
        (rows, X, S) array already in the file's byte order."""
        parts = []
        for i, a, b in self._touched(start, stop):
            sample, y0, _y1, x0, x1, rowbytes = self.pieces[i]
            ya, yb = y0 + a // rowbytes, y0 - (-b // rowbytes)
            block = rows[ya - r0 : yb - r0, x0:x1]
            if sample >= 0:
                block = block[:, :, sample]
            skip = a - (ya - y0) * rowbytes
            parts.append(block.tobytes()[skip : skip + b - a])
        return parts[0] if len(parts) == 1 else b"".join(parts)
