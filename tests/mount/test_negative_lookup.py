"""Absent names inside an archive's folder: ENOENT the kernel may remember (st_ino 0), which
must never hide a name the archive gains when it is re-packed (new archive, new inodes)."""

from __future__ import annotations

import errno
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile

from vfs.decant.series import PackOptions, pack_series


def _tiff(path: Path, seed: int) -> Path:
    data = np.random.default_rng(seed).integers(0, 60000, (2, 20, 16), dtype=np.uint16)
    tifffile.imwrite(path, data, photometric="minisblack")
    return path


def test_a_missing_member_stays_missing_until_the_archive_gains_it(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
) -> None:
    run, src = tmp_path / "run", tmp_path / "src"
    run.mkdir()
    src.mkdir()
    _tiff(run / "a.tif", 1)
    pack_series(run, src / "run.zarr.zip", PackOptions())
    m = make_mount(src)
    folder = m.mnt / "run"
    for _ in range(3):  # the second and third may be answered by the kernel alone
        with pytest.raises(FileNotFoundError) as info:
            os.stat(folder / "b.tif")
        assert info.value.errno == errno.ENOENT
    assert (folder / "a.tif").read_bytes() == (run / "a.tif").read_bytes()

    b = _tiff(run / "b.tif", 2)
    staged = tmp_path / "staged.zarr.zip"
    pack_series(run, staged, PackOptions())
    shutil.move(staged, src / "run.zarr.zip")  # replaced by rename, as packers publish
    deadline = time.monotonic() + 15
    while not (folder / "b.tif").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (folder / "b.tif").read_bytes() == b.read_bytes()
