"""A folder archive's original is shown with its files' permission bits, never its folder's
execute bits: on a folder, x means "search". A writable mount showed a 0755 folder archive of
0644 files as `-rwxr-xr-x` (red team 49), a read-only one as `-r--r--r--` all along."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import tifffile

from vfs.decant.packer import pack_file


def _folder_archive(src: Path, work: Path) -> bytes:
    original = work / "a.tif"
    tifffile.imwrite(original, np.arange(96 * 80, dtype=np.uint16).reshape(96, 80))
    archive = src / "a.tif.zarr"
    pack_file(original, archive)
    for folder, dirs, files in os.walk(archive):
        for name in files:
            os.chmod(Path(folder) / name, 0o644)
        for name in dirs:
            os.chmod(Path(folder) / name, 0o755)
    archive.chmod(0o755)
    return original.read_bytes()


@pytest.mark.parametrize("extra", [(), ("--read-only",)], ids=["writable", "read-only"])
def test_a_folder_archive_s_original_has_no_execute_bit(
    tmp_path: Path, make_mount, extra: tuple[str, ...]
) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "src"
    src.mkdir()
    want = _folder_archive(src, tmp_path)
    mnt = make_mount(src, *extra).mnt
    st = os.stat(mnt / "a.tif")
    assert stat.S_IMODE(st.st_mode) & 0o111 == 0, oct(st.st_mode)
    assert stat.S_IMODE(st.st_mode) & 0o444 == 0o444  # its files' read bits are kept
    got = (mnt / "a.tif").read_bytes()
    assert hashlib.sha256(got).digest() == hashlib.sha256(want).digest()
