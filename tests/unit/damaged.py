"""An original and two archives of it, one with a pixel changed: what a small read of a damaged,
unverified archive serves (tests of `--verify-first`, in process and through a real mount)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numcodecs
import numpy as np
import tifffile

from vfs.cache import PageCache
from vfs.decant.packer import pack_file
from vfs.decant.reader import DecantArchive


def good_and_bad(src: Path, work: Path) -> tuple[bytes, int]:
    """`src`/good.tif.zarr.zip and `src`/bad.tif.zarr.zip, archives of the same 3-plane stack
    (named good.tif and bad.tif), bad's first plane with one pixel changed and its chunk
    encoded again (so it decodes and its zip CRC is right). Returns the original's bytes and
    the file offset of the byte changed."""
    pixels = np.random.default_rng(7).integers(0, 4000, (3, 96, 128), np.uint16)
    for name in ("good.tif", "bad.tif"):  # an archive presents its original's name
        tif = work / name
        tifffile.imwrite(tif, pixels, photometric="minisblack")
        archive = pack_file(tif, src / f"{name}.zarr.zip").archive
    damaged = archive.with_suffix(".tmp")
    at = _pixel_flipped(archive, damaged)
    damaged.replace(archive)
    return tif.read_bytes(), at


def _pixel_flipped(good: Path, dest: Path) -> int:
    """`good` with one pixel of the first plane changed and its chunk encoded again (so it
    decodes, and its zip CRC is right): the file offset of the byte changed in the original."""
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as zout:
        codec = numcodecs.get_codec(json.loads(zin.read("0/.zarray"))["compressor"])
        first = min(n for n in zin.namelist() if n.startswith("0/") and "/." not in n)
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename == first:
                plane = bytearray(codec.decode(data))
                plane[len(plane) // 2] ^= 0x01
                data = bytes(codec.encode(np.frombuffer(bytes(plane), dtype=np.uint8)))
                middle = len(plane) // 2
            zout.writestr(info, data)
    with DecantArchive.open(dest) as archive:
        (info,) = archive.originals()
        reader = archive.open_original(info.relpath, PageCache(0))
        for r in reader.regions:
            if r.page == 0 and r.pos <= middle < r.pos + r.length:
                return int(r.start + middle - r.pos)
    raise AssertionError("the first plane has no such byte")
