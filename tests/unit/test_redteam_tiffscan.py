"""A hostile TIFF written into the mount is scanned by the daemon (root) before it is packed:
a file of minimal IFDs (18-byte pages, thousands of them) must not cost memory far beyond its
own size. tifffile's page objects take a few KiB each; the scan keeps only its page records."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import tifffile

from vfs.decant.tiffscan import NotByteExact, scan_tiff

PAGES = 20_000


def many_ifds(path: Path, n: int) -> int:
    """A classic little-endian TIFF of `n` one-pixel pages whose IFDs follow one another."""
    out = bytearray(b"II*\x00" + struct.pack("<I", 8))
    tags = [(256, 3, 1, 1), (257, 3, 1, 1), (258, 3, 1, 8), (273, 4, 1, 0), (279, 4, 1, 1)]
    ifd = struct.pack("<H", len(tags)) + b"".join(struct.pack("<HHII", *t) for t in tags)
    for i in range(n):
        nxt = len(out) + len(ifd) + 4 if i < n - 1 else 0
        out += ifd + struct.pack("<I", nxt)
    path.write_bytes(out)
    return len(out)


def test_a_tiff_of_many_tiny_pages_costs_memory_near_its_size(tmp_path: Path) -> None:
    size = many_ifds(tmp_path / "many.tif", PAGES)
    tracemalloc.start()
    try:
        with pytest.raises(NotByteExact):  # its strips overlap: mode V
            scan_tiff(tmp_path / "many.tif", size)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Measured: 39x the file's size with every tifffile page kept, 12x with records only.
    assert peak < 20 * size, f"peak {peak / 1e6:.1f} MB for a {size / 1e6:.1f} MB file"


def test_many_pages_too_tiny_to_carry_mode_d_go_verbatim(tmp_path: Path) -> None:
    """20,000 pages of 2 x 2: mode D costs ~4.7 KiB of memory a page to pack (and made a
    12 MB archive of 30,000 such pages, 3.4 MB as a TIFF), so the file goes verbatim."""
    tif = tmp_path / "tiny.tif"
    tifffile.imwrite(tif, np.zeros((20_000, 2, 2), np.uint8), photometric="minisblack")
    with pytest.raises(NotByteExact, match="20000 pages of 4 bytes on average"):
        scan_tiff(tif, tif.stat().st_size)


def test_a_stack_of_small_pages_within_the_free_overhead_stays_mode_d(tmp_path: Path) -> None:
    tif = tmp_path / "small.tif"
    tifffile.imwrite(tif, np.zeros((8192, 4, 4), np.uint8), photometric="minisblack")
    assert len(scan_tiff(tif, tif.stat().st_size).pages) == 8192
