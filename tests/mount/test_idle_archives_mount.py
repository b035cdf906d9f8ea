"""Archives kept open after their last handle (vfs/backends/idle.py), through a real mount run by
root with `-o allow_other`: kept, they change nothing a reader sees. A replaced archive reads as
the new one at the next open, a mode narrowed meanwhile denies another user, and the daemon lets
go of a deleted archive's descriptor within seconds. Expected bytes come from the TIFFs written
here, never from vfs."""

from __future__ import annotations

import errno
import hashlib
import os
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tests.mount.conftest import Mount, User, open_tmp
from vfs.decant.packer import pack_file

LINGER = 5.0  # vfs/mount/daemon.py LINGER_SECONDS


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def held_by(pid: int, name: str) -> bool:
    """Does the daemon hold a descriptor of a file named `name` (deleted or not)?"""
    fds = Path(f"/proc/{pid}/fd")
    for fd in os.listdir(fds):
        try:
            target = os.readlink(fds / fd)
        except OSError:
            continue
        if target.removesuffix(" (deleted)").endswith("/" + name):
            return True
    return False


def test_kept_archives_serve_the_current_version_to_the_users_allowed(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    base = open_tmp(tmp_path_factory, "idle")
    src, other = base / "src", base / "other"
    src.mkdir(mode=0o755)
    other.mkdir()
    src.chmod(0o755)
    tifs = []
    for seed in (1, 2):
        tif = base / f"t{seed}" / "a.tif"
        tif.parent.mkdir()
        tifffile.imwrite(tif, np.random.default_rng(seed).integers(0, 4000, (4, 64, 48), np.uint16))
        tifs.append(tif)
    archive = pack_file(tifs[0], src / "a.tif.zarr.zip").archive
    replacement = pack_file(tifs[1], other / "a.tif.zarr.zip").archive
    ago = time.time() - 3600  # settled: an archive written just before its open is not kept
    for path in (archive, replacement):
        os.utime(path, (ago, ago))
    archive.chmod(0o644)
    replacement.chmod(0o644)
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index").start("-o", "allow_other")
    try:
        assert m.proc is not None
        shown = m.mnt / "a.tif"
        assert sha256(shown) == sha256(tifs[0])
        assert held_by(m.proc.pid, archive.name)  # kept after the last handle closed

        # Replaced between a close and the next open: the next open reads the new version.
        os.replace(replacement, archive)
        deadline = time.monotonic() + 20
        while sha256(shown) != sha256(tifs[1]):
            assert time.monotonic() < deadline, "the replaced archive is still served"
            time.sleep(0.1)

        # Another user reads it (positive control), then the mode narrows while it is kept.
        assert unprivileged.value_of("read(p)", p=shown) == sha256(tifs[1])
        archive.chmod(0o600)
        deadline = time.monotonic() + 20
        while unprivileged.errno_of("read(p)", p=shown) != errno.EACCES:
            assert time.monotonic() < deadline, "a kept archive still read by another user"
            time.sleep(0.2)
        assert sha256(shown) == sha256(tifs[1])  # root still reads it

        # Deleted: the daemon lets go of its descriptor once the keeping time is over.
        assert held_by(m.proc.pid, archive.name)
        archive.unlink()
        deadline = time.monotonic() + LINGER + 10
        while held_by(m.proc.pid, archive.name):
            assert time.monotonic() < deadline, "a deleted archive's descriptor still held"
            time.sleep(0.2)
        assert "Traceback" not in m.log_text()
    finally:
        m.stop()
