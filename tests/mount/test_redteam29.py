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
import tifffile

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


def test_a_verified_archive_rewritten_in_place_with_its_mtime_restored_is_not_served_stale(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
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
    m = make_mount(src)
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
