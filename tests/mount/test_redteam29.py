"""Red-team round 29: archives replaced under the mount (in place, by rename) and what the mount
keeps trusting of the version it verified."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tests.mount.helpers import edit_manifest, rewrite_zip
from vfs.decant.packer import pack_file


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _two_stacks(work: Path) -> tuple[Path, Path]:
    """Two originals named scan.tif whose archives have the same size: the same planes, the
    first and last swapped (their chunks trade places, the zip keeps its length)."""
    planes = np.random.default_rng(29).integers(0, 60000, (4, 64, 48), dtype=np.uint16)
    (work / "a").mkdir(parents=True)
    (work / "b").mkdir()
    tifffile.imwrite(work / "a" / "scan.tif", planes, photometric="minisblack")
    tifffile.imwrite(work / "b" / "scan.tif", planes[[3, 1, 2, 0]], photometric="minisblack")
    return work / "a" / "scan.tif", work / "b" / "scan.tif"


def _cat(path: Path) -> bytes | None:
    """The file as `cat` reads it; None when the read fails."""
    done = subprocess.run(["cat", str(path)], capture_output=True, check=False, timeout=15)
    return done.stdout if done.returncode == 0 else None


@pytest.mark.parametrize("extra", [(), ("--no-watch",)], ids=["watch", "no-watch"])
def test_a_verified_archive_rewritten_in_place_with_its_mtime_restored_is_not_served_stale(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
    extra: tuple[str, ...],
) -> None:
    """`cp -p backup.zarr.zip scan.tif.zarr.zip` (or cp, then `touch -r`) rewrites a verified
    archive in place: same inode, same size, same mtime; only its ctime tells. The mount kept
    the version it had verified (node key and page-cache key of inode, size and mtime), so
    every later reader got the OLD original's bytes, still `verified: yes`, for as long as the
    daemon ran, while SRC held another archive (a remount would serve the new one)."""
    src = tmp_path / "src"
    src.mkdir()
    old, new = _two_stacks(tmp_path / "work")
    archive, replacement = src / "scan.tif.zarr.zip", tmp_path / "new.zarr.zip"
    pack_file(old, archive)
    pack_file(new, replacement)
    assert archive.stat().st_size == replacement.stat().st_size
    m = make_mount(src, *extra)
    shown = m.mnt / "scan.tif"
    assert _cat(shown) == old.read_bytes()
    assert os.getxattr(shown, "user.decant.verified") == b"yes"

    before = archive.stat()
    shutil.copyfile(replacement, archive)
    os.utime(archive, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = archive.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino, before.st_size, before.st_mtime_ns
    )  # fmt: skip

    served: list[bytes | None] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        served.append(_cat(shown))
        if served[-1] == new.read_bytes():
            break
        time.sleep(0.2)
    # Every read gives whole bytes of one version (or fails), and the new one shows.
    assert all(got in (None, old.read_bytes(), new.read_bytes()) for got in served)
    assert served[-1] == new.read_bytes(), m.log_text()[-1500:]


def test_an_archive_renamed_over_one_being_verified_does_not_inherit_its_verdict(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
) -> None:
    """A reader reads an archive whole; before its last read, another archive is renamed over
    it (rsync of a "restored" copy: temp name, then rename) whose manifest claims the same
    sha256 but whose planes hold other bytes (a damaged or doctored copy). The reader's bytes
    were the first archive's and hash right; the verdict was recorded under the stamp of
    whatever the path named by then, with the chunk digests read from it: the copy counted as
    verified, and every later reader got its wrong bytes without an error."""
    src, side = tmp_path / "src", tmp_path / "side"
    src.mkdir()
    side.mkdir()
    old, new = _two_stacks(tmp_path / "work")
    archive = src / "scan.tif.zarr.zip"
    pack_file(old, archive)
    pack_file(new, side / "packed.zarr.zip")
    claimed = _sha(old.read_bytes())
    rewrite_zip(side / "packed.zarr.zip", side / "copy.zarr.zip",
                edit_manifest(lambda doc: doc.update(original_sha256=claimed)))  # fmt: skip
    m = make_mount(src)
    shown = m.mnt / "scan.tif"
    size = old.stat().st_size
    fd = os.open(shown, os.O_RDONLY)
    try:
        head = os.pread(fd, size - 100, 0)
        os.rename(side / "copy.zarr.zip", archive)
        tail = os.pread(fd, 200, size - 100)
    finally:
        os.close(fd)
    assert head + tail == old.read_bytes()  # the open file kept the archive it opened

    served: list[bytes | None] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        served.append(_cat(shown))
        if served[-1] != old.read_bytes():
            break
        time.sleep(0.2)
    # The copy's bytes do not hash to what its manifest claims: never served without an error.
    assert new.read_bytes() not in served, m.log_text()[-1500:]
    assert served[-1] is None


def test_a_collection_view_does_not_vouch_for_an_archive_swapped_under_it(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
) -> None:
    """An AcqStore view shows a decant archive of the collection as its member's TIFF. Its
    verified state was keyed by the collection folder's stamp and the view's description: an
    archive renamed over the member's (by whoever may write the collection's images/ folder)
    whose manifest claims the same name, size and sha256 but holds other pixels changes
    neither, so the view kept serving it as verified, unhashed: its wrong bytes without an
    error, while the same archive mirrored at images/scan.tif failed with EIO as it must."""
    from tests.toolbox import load_tool

    src, side = tmp_path / "src", tmp_path / "side"
    src.mkdir()
    side.mkdir()
    old, new = _two_stacks(tmp_path / "work")
    pack_file(old, side / "scan.tif.zarr.zip")
    load_tool("make_acqstore_corpus").make_collection(
        src / "coll", decant_archive=side / "scan.tif.zarr.zip"
    )
    pack_file(new, side / "packed.zarr.zip")
    claimed = _sha(old.read_bytes())
    rewrite_zip(side / "packed.zarr.zip", side / "copy.zarr.zip",
                edit_manifest(lambda doc: doc.update(original_sha256=claimed)))  # fmt: skip
    m = make_mount(src)
    view = m.mnt / "coll" / "members" / "Kymograph 1" / "Kymograph 1.tif"
    mirrored = m.mnt / "coll" / "images" / "scan.tif"
    assert _cat(view) == old.read_bytes()
    assert os.getxattr(view, "user.decant.verified") == b"yes"

    os.rename(side / "copy.zarr.zip", src / "coll" / "images" / "scan.tif.zarr.zip")
    deadline = time.monotonic() + 10
    while _cat(mirrored) is not None:  # the mount has seen the swap: the mirror hashes it
        assert time.monotonic() < deadline, m.log_text()[-1500:]
        time.sleep(0.2)
    served = [_cat(view) for _ in range(3)]
    assert new.read_bytes() not in served, m.log_text()[-2000:]
    assert served[-1] is None


def test_a_chmod_through_the_mount_keeps_the_archive_served_as_it_was(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
) -> None:
    """A chmod (or chown, or touch) of an original through the mount is applied to its archive,
    which changes the archive's ctime. Since the ctime is part of an archive's version, the
    mount took its own chmod for a rewrite: the next open failed with ESTALE (EIO for `cat`)
    and the original came back under a new inode number. The daemon's own change keeps the
    version: same bytes, same inode."""
    src = tmp_path / "src"
    src.mkdir()
    old, _new = _two_stacks(tmp_path / "work")
    pack_file(old, src / "scan.tif.zarr.zip")
    m = make_mount(src)
    shown = m.mnt / "scan.tif"
    assert _cat(shown) == old.read_bytes()
    ino = shown.stat().st_ino
    for change in (lambda: os.chmod(shown, 0o600), lambda: os.utime(shown, ns=(10**18, 10**18)),
                   lambda: os.chown(shown, 0, 0)):  # fmt: skip
        before = (src / "scan.tif.zarr.zip").stat().st_ctime_ns
        time.sleep(0.01)
        change()
        assert (src / "scan.tif.zarr.zip").stat().st_ctime_ns != before  # it reached the archive
        assert _cat(shown) == old.read_bytes()
        assert shown.stat().st_ino == ino
    assert (src / "scan.tif.zarr.zip").stat().st_mode & 0o777 == 0o600
