"""Red team, round 38b: a folder archive (`NAME.zarr/`) in a local SRC overwritten in place
(`cp -r B.tif.zarr/. x.tif.zarr/`) while mounted.

Expected bytes come from the arrays handed to tifffile, never from vfs. Each test failed before
the fix its docstring names.
"""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tests.mount.conftest import HAVE_FUSE, Mount, open_tmp
from tests.mount.helpers import folder_archive, read_through

pytestmark = pytest.mark.skipif(not HAVE_FUSE, reason="needs /dev/fuse and fusermount3")


def _folder_archive(base: Path, name: str, seed: int, shape: tuple[int, ...], dest: Path) -> bytes:
    """`dest` (a `NAME.zarr/`, presented as `name`): the archive of a random uint16 stack,
    packed and unzipped, every entry readable by all; returns the TIFF's bytes as written."""
    pixels = np.random.default_rng(seed).integers(0, 4000, shape).astype(np.uint16)
    (base / str(seed)).mkdir()
    tif = base / str(seed) / name
    tifffile.imwrite(tif, pixels)
    return folder_archive(tif, dest)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _size_becomes(path: Path, size: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while os.stat(path).st_size != size:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _read_old(fd: int, size: int) -> bytes | int:
    """What a handle opened before the rewrite reads of the whole file (an errno: refused)."""
    parts = []
    try:
        for off in range(0, size, 65536):
            parts.append(os.pread(fd, 65536, off))
    except OSError as exc:
        return exc.errno or -1
    return b"".join(parts)


@pytest.mark.parametrize("shape", [(4, 256, 256), (3, 200, 320)], ids=["same-layout", "other"])
@pytest.mark.parametrize("watch", [True, False], ids=["watched", "no-watch"])
@pytest.mark.parametrize("held", [True, False], ids=["held", "closed"])
def test_a_folder_archive_overwritten_in_place_is_described_anew(
    tmp_path_factory: pytest.TempPathFactory, shape: tuple[int, ...], watch: bool, held: bool
) -> None:
    """`x.tif.zarr/` is overwritten in place with another archive's files (`cp -r`): the same
    folder inode, and its own stat unchanged when only files inside it change. The mount kept
    the old description of `x.tif` (size, layout), and every read of it failed with EIO until
    the folder's own stat changed. Fixed: a folder archive's version (node key, index rows,
    open-archive sharing, page-cache key) folds in its manifest's stat, so the rewrite is a new
    version, listed anew: `x.tif` reads as B's TIFF. A handle opened before it serves the old
    bytes whole, or refuses, never a mix. With that handle still open (`held`), a new open
    joined the old open archive and read the old TIFF's bytes whole."""
    base = open_tmp(tmp_path_factory, "rt38b-rewrite")
    src = base / "src"
    src.mkdir(mode=0o755)
    old = _folder_archive(base, "x.tif", 1, (4, 256, 256), src / "x.tif.zarr")
    new = _folder_archive(base, "x.tif", 2, shape, base / "b.tif.zarr")
    assert old != new
    archive = src / "x.tif.zarr"
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("--read-only", "--cache-size", "1M", *(() if watch else ("--no-watch",)))
        shown = m.mnt / "x.tif"
        assert shown.read_bytes() == old, m.log_text()
        fd = os.open(shown, os.O_RDONLY)
        try:
            assert os.pread(fd, 4096, 0) == old[:4096]
            if not held:  # no open archive for a new open to share
                os.close(fd)
                fd = -1
            before = os.stat(archive)
            subprocess.run(["cp", "-r", f"{base / 'b.tif.zarr'}/.", f"{archive}/"], check=True)
            after = os.stat(archive)
            assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)
            if watch and len(new) != len(old):  # the watcher relists it: no open needed
                assert _size_becomes(shown, len(new), timeout=3.0), "x.tif keeps its old size"
            got = read_through(shown, timeout=4.0)
            assert got != old, "the old archive's bytes served for the rewritten one"
            assert isinstance(got, bytes), f"errno {got} reading the rewritten archive"
            assert _sha(got) == _sha(new)
            assert os.stat(shown).st_size == len(new)
            if fd >= 0:
                stale = _read_old(fd, len(old))
                assert stale == old or stale in (errno.EIO, errno.ESTALE), "mixed bytes served"
        finally:
            if fd >= 0:
                os.close(fd)
    finally:
        m.stop()


def test_a_handle_opened_before_the_rewrite_serves_no_mix_before_it_verified(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A handle opened (4 KiB read, not verified yet) before `x.tif.zarr/` was overwritten in
    place went on decoding the new chunk files by the old manifest: 8 reads of 64 KiB served
    bytes of neither TIFF before the read completing it got EIO from its hash. Fixed: a folder
    store refuses reads once its manifest is not the one it read (EIO at once). Not covered:
    a chunk read while the copy runs, rewritten before the manifest is (the hash's verdict,
    or a verified archive's chunk digests, still refuse it)."""
    base = open_tmp(tmp_path_factory, "rt38b-unverified")
    src = base / "src"
    src.mkdir(mode=0o755)
    old = _folder_archive(base, "x.tif", 1, (8, 256, 256), src / "x.tif.zarr")
    _folder_archive(base, "x.tif", 2, (8, 256, 256), base / "b.tif.zarr")
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("--read-only", "--cache-size", "1M", "--no-watch")
        fd = os.open(m.mnt / "x.tif", os.O_RDONLY)
        try:
            assert os.pread(fd, 4096, 0) == old[:4096]
            # The read-ahead that read started is let finish first: a chunk decoded while the
            # copy runs, rewritten before the manifest is, is not refused (see _still_as_opened).
            time.sleep(1.0)
            subprocess.run(["cp", "-r", f"{base / 'b.tif.zarr'}/.", f"{src / 'x.tif.zarr'}/"],
                           check=True)  # fmt: skip
            off = 4096
            while off < len(old):
                try:
                    data = os.pread(fd, 65536, off)
                except OSError as exc:
                    assert exc.errno == errno.EIO
                    break
                assert data == old[off : off + len(data)], f"mixed bytes served at {off}"
                off += len(data)
        finally:
            os.close(fd)
    finally:
        m.stop()
