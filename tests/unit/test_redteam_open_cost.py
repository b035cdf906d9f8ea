"""What an opened archive keeps while a handle holds it open (red team 3).

A user may hold thousands of handles on as many archives (4096 a user, more with more users),
so the cost of one open archive is multiplied by that: each kept the last 64 KiB of its zip
(the central directory's read, at least 64 KiB) for as long as it stayed open, ~100 KiB an
open in all; 2000 handles on 2000 small archives peaked the daemon at 270 MiB with an 8 MiB
cache. A local zip now drops that tail once its central directory is parsed (169 MiB).
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import tifffile

from vfs.decant import MANIFEST_KEY
from vfs.decant.packer import pack_file
from vfs.decant.store import ZipArchiveStore

KiB = 1 << 10


def test_an_open_local_zip_keeps_no_copy_of_its_tail(tmp_path: Path) -> None:
    tif = tmp_path / "small.tif"
    pixels = np.random.default_rng(0).integers(0, 60000, (4, 256, 256), np.uint16)
    tifffile.imwrite(tif, pixels)
    archive = tmp_path / "small.tif.zarr.zip"
    pack_file(tif, archive)
    assert archive.stat().st_size > 64 * KiB  # zipfile read its last 64 KiB
    ZipArchiveStore(archive).close()  # imports and first-use caches outside the count
    tracemalloc.start()
    try:
        stores = [ZipArchiveStore(archive) for _ in range(50)]
        kept = tracemalloc.get_traced_memory()[0] // len(stores)
    finally:
        tracemalloc.stop()
    for store in stores:
        assert store.get(MANIFEST_KEY, 1 << 20)  # reads still work without the tail
        store.close()
    assert kept < 48 * KiB, f"{kept // KiB} KiB kept by each open archive"
