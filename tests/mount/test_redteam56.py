"""Red team 56: hostile TIFFs written through the mount (the daemon packs them as root).

A page is one chunk, decoded whole to pack it and to read it: a TIFF of one 1 GiB strip took a
daemon with a 128 MiB cache to 3.4 GiB while it packed it, and to 800 MiB as it was read. The
write side archives pages larger than half its cache verbatim (read in blocks)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import tifffile

from tests.mount.test_redteam33 import MakeMount, wait_for


def test_a_page_larger_than_half_the_cache_is_archived_verbatim(
    tmp_path: Path, make_mount: MakeMount
) -> None:
    src, work = tmp_path / "src", tmp_path / "work"
    src.mkdir(), work.mkdir()
    rng = np.random.default_rng(56)
    big, small = work / "big.tif", work / "small.tif"
    tifffile.imwrite(big, rng.integers(0, 60000, (3072, 2048), dtype=np.uint16))  # 12 MiB
    tifffile.imwrite(small, rng.integers(0, 60000, (2, 1024, 1024), dtype=np.uint16))
    m = make_mount(src, "--settle", "0.3", "--cache-size", "16M")  # pages of 8 MiB at most
    for f in (big, small):
        (m.mnt / f.name).write_bytes(f.read_bytes())
    for f in (big, small):
        wait_for(f"{f.name} archived", (src / f"{f.name}.zarr.zip").exists)
        wait_for(f"{f.name} shown", lambda f=f: f"{f.name}: published as" in m.log_text())
        assert (m.mnt / f.name).read_bytes() == f.read_bytes()
    assert os.getxattr(m.mnt / "big.tif", "user.decant.mode") == b"verbatim"
    assert os.getxattr(m.mnt / "small.tif", "user.decant.mode") == b"byte-exact"
    why = r"big.tif: published as .* \(verbatim: page 0 is larger than the 8"
    assert re.search(why, m.log_text())


def test_an_archive_or_package_copied_in_reads_back_under_its_own_name(
    tmp_path: Path, make_mount: MakeMount
) -> None:
    """Red team 56 F6: a decant archive written in as `x.zarr.zip` was published as it was,
    then shown as its original (`x`), so the name written gave ENOENT and `rsync -a` sent it
    again at each run; a `.tar.c4gh` would be shown as a folder. Such names are packed
    verbatim: each reads back under its name, byte for byte, and nothing else appears."""
    src, work = tmp_path / "src", tmp_path / "work"
    src.mkdir(), work.mkdir()
    tifffile.imwrite(work / "x.tif", np.arange(64 * 64, dtype=np.uint16).reshape(64, 64))
    argv = ["-q", "pack", str(work / "x.tif"), "-o", str(work / "x.tif.zarr.zip")]
    pack = subprocess.run([sys.executable, "-m", "vfs.commands", *argv], capture_output=True,
                          text=True)  # fmt: skip
    assert pack.returncode == 0, pack.stderr
    written = {
        "x.zarr.zip": (work / "x.tif.zarr.zip").read_bytes(),
        "y.tar.c4gh": os.urandom(70_000),
    }
    m = make_mount(src, "--settle", "0.3")
    for name, data in written.items():
        (m.mnt / name).write_bytes(data)
    for name in written:
        wait_for(f"{name} published", lambda n=name: f"{n}: published as" in m.log_text())
    assert sorted(os.listdir(m.mnt)) == sorted(written)
    for name, data in written.items():
        assert (m.mnt / name).read_bytes() == data
        assert os.getxattr(m.mnt / name, "user.decant.mode") == b"verbatim"
    assert sorted(os.listdir(src)) == sorted([".decant-spool", *(f"{n}.zarr.zip" for n in written)])
