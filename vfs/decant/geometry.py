"""Page geometry of spec §5 as arithmetic: how many bytes and segments a page's shape makes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vfs.decant.limits import MAX_CHUNK_BYTES, human
from vfs.errors import ManifestError, UnsupportedFormatError

if TYPE_CHECKING:
    from vfs.decant.manifest import PageRecord

# Sample types mode D serializes (tiffscan packs kinds u, i, f only), by NumPy name.
ITEMSIZE = {
    f"{kind}{bits}": bits // 8
    for kind, sizes in (
        ("uint", (8, 16, 32, 64)),
        ("int", (8, 16, 32, 64)),
        ("float", (16, 32, 64)),
    )
    for bits in sizes
}


def check_geometry(page: PageRecord, where: str, source: str) -> None:
    """The page's segments must be exactly the bytes its shape serializes to (spec §5): then
    every region slices inside its decoded plane, and tile loops are bounded by the manifest."""
    if page.dtype not in ITEMSIZE:
        raise UnsupportedFormatError(
            f"{source}: {where} dtype {page.dtype[:40]!r} is not one mode D serializes"
        )
    shape = list(page.shape)
    if min(shape) < 1:
        raise ManifestError(f"{source}: {where} shape {shape} has an empty axis")
    if page.samplesperpixel != (shape[2] if len(shape) == 3 else 1):
        raise ManifestError(
            f"{source}: {where} samplesperpixel {page.samplesperpixel} disagrees with shape {shape}"
        )
    plane = page.plane_nbytes
    if plane > MAX_CHUNK_BYTES:
        raise ManifestError(
            f"{source}: {where} shape {shape} makes a plane of {plane} bytes, more than the "
            f"{human(MAX_CHUNK_BYTES)} a chunk may hold"
        )
    if page.nbytes != plane:
        raise ManifestError(
            f"{source}: {where} databytecounts sum to {page.nbytes} bytes, but shape {shape} of "
            f"{page.dtype} makes {plane}"
        )
    want = segment_count(page)
    if len(page.dataoffsets) != want:
        raise ManifestError(
            f"{source}: {where} lists {len(page.dataoffsets)} pixel segments, its strip/tile "
            f"geometry makes {want}"
        )


def segment_count(page: PageRecord) -> int:
    """How many real-pixel segments layout.real_segments makes for this geometry."""
    y, x = page.shape[0], page.shape[1]
    planes = page.samplesperpixel if page.planarconfig == 2 else 1
    if not page.tilewidth:
        rows = min(page.rowsperstrip or y, y)
        return planes * -(-y // rows)
    across, down = -(-x // page.tilewidth), -(-y // page.tilelength)
    partial = 1 if x % page.tilewidth else 0  # a right-edge tile: one segment per real row
    return planes * (down * (across - partial) + partial * y)
