"""Spec §5 geometry: page index → array coordinate, and page array ↔ on-disk pixel bytes."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from vfs.decant.manifest import PageRecord

# Canonical NGFF order of leading axes: time, then channel and any custom axis, then space.
_RANK = {"t": 0, "z": 2}


def axis_rank(name: str) -> int:
    return _RANK.get(name, 1)


def canonical_perm(plane_order: Sequence[str]) -> list[int]:
    """perm such that canonical[j] = plane_order[perm[j]] (a stable sort by axis rank)."""
    return sorted(range(len(plane_order)), key=lambda i: axis_rank(plane_order[i]))


def page_coordinate(
    index: int, leading: Sequence[int], plane_order: Sequence[str]
) -> tuple[int, ...]:
    """Canonical leading coordinate of storage page `index` (array leading shape `leading`)."""
    if not plane_order or len(plane_order) != len(leading):
        return tuple(int(i) for i in np.unravel_index(index, tuple(leading)))
    perm = canonical_perm(plane_order)
    storage_shape = [leading[perm.index(i)] for i in range(len(perm))]
    s = np.unravel_index(index, storage_shape)
    return tuple(int(s[p]) for p in perm)


def storage_shape(canonical_leading: Sequence[int], plane_order: Sequence[str]) -> list[int]:
    perm = canonical_perm(plane_order)
    return [canonical_leading[perm.index(i)] for i in range(len(perm))]


def _yxs(page: PageRecord) -> tuple[int, int, int]:
    y, x = page.shape[0], page.shape[1]
    return y, x, page.shape[2] if len(page.shape) == 3 else 1


def tile_grid(page: PageRecord) -> Iterator[tuple[int, int, int, int, int]]:
    """(sample, y0, y1, x0, x1) of each tile's real pixels, in file (serialization) order."""
    y, x, s = _yxs(page)
    samples = range(s) if page.planarconfig == 2 else [-1]
    for sample in samples:
        for y0 in range(0, y, page.tilelength):
            for x0 in range(0, x, page.tilewidth):
                yield sample, y0, min(y, y0 + page.tilelength), x0, min(x, x0 + page.tilewidth)


def serialize_page(plane: np.ndarray[Any, Any], page: PageRecord) -> bytes | memoryview:
    """The page's pixel bytes as they lie on disk, concatenated in segment order."""
    a = plane if plane.ndim == 3 else plane[:, :, None]
    if not page.tilewidth:
        if page.planarconfig == 1:
            return memoryview(np.ascontiguousarray(a)).cast("B")
        return np.ascontiguousarray(np.moveaxis(a, 2, 0)).tobytes()
    out = np.empty(a.size, a.dtype)
    for pixels, flat in _tiled(a, out, page):
        flat[...] = pixels
    return memoryview(out).cast("B")


def _tiled(
    a: np.ndarray[Any, Any], flat: np.ndarray[Any, Any], page: PageRecord
) -> Iterator[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
    """Pairs of views, the plane's pixels (`a`, Y X S) and where tile_grid's order puts them in
    the serialized page (`flat`, as many items): whole blocks of tiles at once, not one tile at
    a time (2^21 1x1 tiles were ~2 million tiny arrays and ~85 MiB of parts to join). Bands of
    full-height tiles and the last band; in each, the full-width tiles and the edge column."""
    y, x, s = a.shape
    tl, tw = page.tilelength, page.tilewidth
    planes = [a[:, :, k : k + 1] for k in range(s)] if page.planarconfig == 2 else [a]
    at = 0
    for p in planes:
        depth = p.shape[2]
        for y0, high, bands in ((0, tl, y // tl), (y // tl * tl, y % tl, 1 if y % tl else 0)):
            if not bands:
                continue
            size = bands * high * x * depth
            rows = flat[at : at + size].reshape(bands, high * x * depth)
            block = p[y0 : y0 + bands * high].reshape(bands, high, x, depth)
            full, edge = x // tw, x % tw
            split = full * high * tw * depth
            if full:
                yield (block[:, :, : full * tw].reshape(bands, high, full, tw, depth)
                       .transpose(0, 2, 1, 3, 4),
                       rows[:, :split].reshape(bands, full, high, tw, depth))  # fmt: skip
            if edge:
                yield block[:, :, full * tw :], rows[:, split:].reshape(bands, high, edge, depth)
            at += size


def deserialize_page(buf: bytes, page: PageRecord, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """Inverse of serialize_page: on-disk pixel bytes to a (Y, X[, S]) array in `dtype`."""
    y, x, s = _yxs(page)
    flat = np.frombuffer(buf, dtype=dtype)
    if not page.tilewidth:
        if page.planarconfig == 1:
            out = flat.reshape(y, x, s)
        else:
            out = np.moveaxis(flat.reshape(s, y, x), 0, 2)
    else:
        out = np.empty((y, x, s), dtype=dtype)
        for pixels, serialized in _tiled(out, flat, page):
            assert np.may_share_memory(pixels, out)  # a view (axes split), written through
            pixels[...] = serialized
    return out if len(page.shape) == 3 else out[:, :, 0]


def real_segments(
    page_shape: tuple[int, ...],
    itemsize: int,
    planarconfig: int,
    rowsperstrip: int,
    tile: tuple[int, int] | None,
    offsets: Sequence[int],
    bytecounts: Sequence[int],
) -> list[tuple[int, int]] | None:
    """(offset, count) of the real-pixel bytes of a strip or tile layout, in serialization order.

    Padding (bottom rows of a tile, right-edge columns, slack at the end of a strip) is left out, so
    it rides in the husk. None when the stored blocks are too short to hold the pixels they claim.
    """
    y, x = page_shape[0], page_shape[1]
    s = page_shape[2] if len(page_shape) == 3 else 1
    per_block_samples = 1 if planarconfig == 2 else s
    planes = s if planarconfig == 2 else 1
    segments: list[tuple[int, int]] = []
    if tile is None:
        rps = min(rowsperstrip or y, y) or 1
        per_plane = math.ceil(y / rps)
        if len(offsets) != per_plane * planes:
            return None
        for k, (off, cnt) in enumerate(zip(offsets, bytecounts, strict=True)):
            rows = min(rps, y - (k % per_plane) * rps)
            need = rows * x * per_block_samples * itemsize
            if cnt < need:
                return None
            segments.append((off, need))
        return segments
    tl, tw = tile
    across, down = math.ceil(x / tw), math.ceil(y / tl)
    if len(offsets) != across * down * planes:
        return None
    pixel = per_block_samples * itemsize
    for k, (off, cnt) in enumerate(zip(offsets, bytecounts, strict=True)):
        ty, tx = divmod(k % (across * down), across)
        rows, cols = min(tl, y - ty * tl), min(tw, x - tx * tw)
        if cnt < ((rows - 1) * tw + cols) * pixel:
            return None
        if cols == tw:
            segments.append((off, rows * tw * pixel))
        else:
            segments.extend((off + r * tw * pixel, cols * pixel) for r in range(rows))
    return segments
