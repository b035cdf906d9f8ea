"""What every reader of one original shares: its checked arrays, region index and page order.

Derived from the archive alone, so built and checked once per opened archive (DecantArchive.plan)
and shared by every handle open on that original. Each handle used to build its own: 65,536
pages of 4×4 planes cost ~55 MiB and 4-12 s of daemon CPU per open, outside --cache-size (eight
handles of one such stack held 604 MiB). What changes as a handle reads (its position, its
read-ahead queue, the digests it noted) stays on the reader (vfs.decant.reader).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from vfs.decant.chunks import ArraySpec, check_byte_chunks
from vfs.decant.layout import page_coordinate
from vfs.decant.limits import MAX_BLOCK_BYTES, MAX_CHUNK_BYTES, MAX_CHUNKS
from vfs.decant.manifest import Manifest, PageRecord
from vfs.decant.partial import PageGeometry
from vfs.decant.regions import RegionIndex
from vfs.errors import CorruptArchiveError, ManifestError

if TYPE_CHECKING:
    from vfs.decant.reader import DecantArchive


class HuskPlan:
    """A verbatim original: one husk run, its byte array checked against the size it needs."""

    def __init__(self, archive: DecantArchive, husk: str, size: int, sha256: str) -> None:
        self.size = size
        self.sha256 = sha256
        self.husk = husk
        self.husk_spec = husk_spec(archive, husk, size)
        self.regions = RegionIndex.husk_only(size)


class PixelPlan:
    """A byte-exact original (or a consolidated series member): its pages by index, the regions
    of the file they and the husk fill, the pages in file order, and array `0` checked to hold
    every plane they need."""

    def __init__(
        self,
        archive: DecantArchive,
        pages: Sequence[PageRecord],
        size: int,
        sha256: str,
        husk: str,
        husk_size: int,
        byteorder: str,
    ) -> None:
        source = str(archive.path)
        self.size = size
        self.sha256 = sha256
        self.husk = husk
        self.regions = RegionIndex.build(pages, size, husk_size, source)
        # The manifest's table makes a record at each look: made once here, not once a check
        # (five looks took 6 of the 10 s 65,536 pages cost), without the segment lists the
        # region index now holds (up to 2^21 offsets as Python ints: ~80 MiB).
        self.pages = {p.index: replace(p, dataoffsets=(), databytecounts=()) for p in pages}
        pages = list(self.pages.values())
        self.byteorder = byteorder
        self.husk_spec = husk_spec(archive, husk, husk_size)
        self.pixels = archive.spec("0", MAX_CHUNK_BYTES)
        dtype = self.pixels.dtype
        self.file_dtype = dtype.newbyteorder(byteorder) if dtype.itemsize > 1 else dtype
        self.geometries: dict[tuple[Any, ...], PageGeometry] = {}  # filled as reads need them
        self.by_rank = sorted(self.pages, key=self._page_start)  # pages in file order
        self.rank = {p: i for i, p in enumerate(self.by_rank)}
        self.leading = self._check_pixels(pages, source)
        self.plane_order = self._check_plane_order(archive.manifest, source)
        self._check_stored(archive, pages)

    def _page_start(self, page: int) -> int:
        start = self.regions.page_start(page)
        return -1 if start is None else start

    def chunk_index(self, page: PageRecord) -> tuple[int, ...]:
        coord = page_coordinate(page.index, self.leading, self.plane_order)
        return (*coord, *([0] * len(page.shape)))

    def geometry(self, page: PageRecord) -> PageGeometry:
        layout = (page.shape, page.planarconfig, page.tilewidth, page.tilelength)
        geom = self.geometries.get(layout)
        if geom is None:  # two readers may both make it: equal values, either one kept
            geom = self.geometries[layout] = PageGeometry(page, self.pixels.dtype.itemsize)
        return geom

    def _check_pixels(self, pages: Sequence[PageRecord], source: str) -> tuple[int, ...]:
        """`0` holds one plane per chunk, each page's plane: its leading shape, checked."""
        spec = self.pixels
        page_ndims = {len(p.shape) for p in pages}
        if len(page_ndims) > 1:
            raise ManifestError(f"{source}: pages mix (Y, X) and (Y, X, S) shapes")
        ndim = page_ndims.pop() if page_ndims else 2
        lead = len(spec.shape) - ndim
        if lead < 0 or spec.chunks[lead:] != spec.shape[lead:] or set(spec.chunks[:lead]) - {1}:
            raise ManifestError(
                f"{source}: array '0' chunks {list(spec.chunks)} do not hold one plane per chunk "
                f"of shape {list(spec.shape)}"
            )
        leading = spec.shape[:lead]
        n_planes = math.prod(leading)
        if n_planes > MAX_CHUNKS:
            raise CorruptArchiveError(
                f"{source}: array '0' shape {list(spec.shape)} has {n_planes} planes, more than "
                f"{MAX_CHUNKS}"
            )
        plane, dtype = spec.shape[lead:], spec.dtype.name
        for p in pages:
            if p.index >= n_planes or tuple(p.shape) != plane:
                raise ManifestError(f"{source}: page {p.index} does not fit array '0'")
            if dtype != p.dtype:
                raise ManifestError(
                    f"{source}: page {p.index} dtype {p.dtype} differs from array '0' "
                    f"({spec.dtype.name})"
                )
        return leading

    def _check_plane_order(self, m: Manifest, source: str) -> tuple[str, ...]:
        """plane_order names `0`'s leading axes. Writers that store every chunk always record
        it (spec §4b); only older archives may leave it empty, meaning a plain unravel."""
        if len(m.plane_order) == len(self.leading):
            return m.plane_order
        if m.all_chunks_stored:
            raise ManifestError(
                f"{source}: plane_order {list(m.plane_order)} does not name the "
                f"{len(self.leading)} leading axes of array '0'"
            )
        return ()

    def _check_stored(self, archive: DecantArchive, pages: Sequence[PageRecord]) -> None:
        """Every plane the pages need is in the store (when the store can tell without reads)."""
        store, spec = archive.store, self.pixels
        if not spec.all_stored:
            return
        for p in pages:
            key = spec.chunk_key(self.chunk_index(p))
            if store.has(key) is False:
                raise CorruptArchiveError(f"{store.name}: chunk {key!r} is missing")


def husk_spec(archive: DecantArchive, array: str, needed: int) -> ArraySpec:
    """A husk (or verbatim original) array, checked: 1-D uint8 of exactly `needed` bytes, its
    stored chunks those the size needs."""
    spec = archive.spec(array, MAX_BLOCK_BYTES)
    where = f"{archive.path}: array '{array}'"
    if len(spec.shape) != 1 or spec.dtype != np.uint8:
        raise ManifestError(f"{where} is not 1-D uint8")
    if spec.shape[0] != needed:
        relation = "shorter" if spec.shape[0] < needed else "longer"
        raise ManifestError(
            f"{where} holds {spec.shape[0]} bytes, {relation} than the {needed} the manifest needs"
        )
    n_chunks = spec.grid[0]
    if n_chunks > MAX_CHUNKS:
        raise CorruptArchiveError(f"{where} needs {n_chunks} chunks, more than {MAX_CHUNKS}")
    check_byte_chunks(archive.store, spec, n_chunks)
    return spec
