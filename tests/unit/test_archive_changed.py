"""A zip archive written in place under a reader opened before it (`cp` of another archive
over it: same inode). A reader opened before served planes it had decoded joined with blocks of
the new version (red team 45: 44 of 200 reads were neither version, with no error). Now a read
that reaches the disk after the write fails (ArchiveChangedError, EIO through the mount); what
was decoded before still serves the old version; an open made now reads the new one. What
moves only the archive's ctime (a rename over it, `chmod`) leaves its readers reading."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import tifffile

from vfs.cache import PageCache
from vfs.decant.packer import PackOptions, pack_file
from vfs.decant.reader import DecantArchive
from vfs.errors import ArchiveChangedError


def two_versions(folder: Path) -> tuple[Path, bytes, Path, bytes]:
    """Archives of two TIFFs named alike, of one shape and random pixels (stored as they are:
    both archives the same size), and the TIFFs' bytes."""
    out = []
    for seed in (1, 2):
        tiff = folder / f"v{seed}" / "X.tif"
        tiff.parent.mkdir(parents=True)
        pixels = np.random.default_rng(seed).integers(0, 65535, (3, 256, 256), dtype=np.uint16)
        tifffile.imwrite(tiff, pixels, rowsperstrip=32, photometric="minisblack")
        os.utime(tiff, ns=(10**18, 10**18))
        archive = tiff.with_name("X.tif.zarr.zip")
        pack_file(tiff, archive, PackOptions())
        out += [archive, tiff.read_bytes()]
    assert out[0].stat().st_size == out[2].stat().st_size
    return out[0], out[1], out[2], out[3]


def rewrite_in_place(target: Path, source: Path) -> None:
    """What `cp source target` does to an existing target: same inode, a new mtime."""
    st = target.stat()
    with open(target, "r+b") as fh:
        fh.write(source.read_bytes())
    assert target.stat().st_ino == st.st_ino and target.stat().st_mtime_ns != st.st_mtime_ns


def placed(tmp_path: Path) -> tuple[Path, bytes, Path, bytes]:
    """(SRC's archive, holding the first version, its TIFF's bytes, the second's archive and
    TIFF's bytes)."""
    old, old_tiff, new, new_tiff = two_versions(tmp_path)
    target = tmp_path / "src" / "X.tif.zarr.zip"
    target.parent.mkdir()
    shutil.copy2(old, target)
    return target, old_tiff, new, new_tiff


def test_a_reader_opened_before_an_in_place_rewrite_serves_the_old_bytes_or_fails(
    tmp_path: Path,
) -> None:
    target, old_tiff, new, new_tiff = placed(tmp_path)
    with DecantArchive.open(target) as archive:
        reader = archive.open_original("X.tif", PageCache(64 << 20))
        for offset in range(200_000, len(old_tiff), 131_072):  # every plane: offsets known
            assert reader.read(offset, 4096) == old_tiff[offset : offset + 4096]
        rewrite_in_place(target, new)
        refused = 0
        for offset in range(0, len(old_tiff), 50_000):
            try:
                got = reader.read(offset, 4096)
            except ArchiveChangedError as exc:
                assert "written since the archive was opened" in str(exc)
                refused += 1
                continue
            assert got == old_tiff[offset : offset + 4096], offset  # what it decoded before
        assert refused > 0
        reader.close()
    with DecantArchive.open(target) as archive:  # opened now: the new version, whole
        reader = archive.open_original("X.tif", PageCache(64 << 20))
        assert reader.read(0, len(new_tiff)) == new_tiff
        reader.close()


def test_a_rename_over_the_archive_or_a_chmod_of_it_leaves_its_readers_reading(
    tmp_path: Path,
) -> None:
    """Both move the archive's ctime, not its bytes: the write side replaces an archive by a
    rename over it while readers of the old version read on (a check of the ctime failed
    them, and a `chmod` by the archive's owner failed everyone reading it)."""
    target, old_tiff, new, _new_tiff = placed(tmp_path)
    with DecantArchive.open(target) as archive:
        reader = archive.open_original("X.tif", PageCache(64 << 20))
        assert reader.read(0, 4096) == old_tiff[:4096]
        target.chmod(0o600)
        os.link(target, target.with_name("another name"))
        shutil.copy2(new, target.with_name("incoming"))
        os.rename(target.with_name("incoming"), target)  # the old file: unlinked, open here
        assert reader.read(0, len(old_tiff)) == old_tiff
        reader.close()
