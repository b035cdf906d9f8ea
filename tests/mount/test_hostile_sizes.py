"""Sizes an unprivileged user declares for free, in SRC or through a writable root mount
(`-o allow_other`): a sparse file costs its maker no disk, so the daemon must not read it whole.
The daemon's peak RSS (VmHWM) stays near its cache budget and it keeps serving."""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import time
import tracemalloc
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tests.mount.conftest import SYSTEM_PYTHON, Mount, User, open_tmp
from tests.mount.test_write_side import wait_status
from tests.toolbox import proc_status, zip_of_many
from vfs.cache import PageCache
from vfs.decant.digestmap import MAX_MAP_CHUNKS
from vfs.decant.packer import pack_file
from vfs.decant.reader import DecantArchive

GIB = 1 << 30
CACHE = "64M"


def peak_rss(pid: int) -> int:
    return proc_status(pid, "VmHWM")


@pytest.fixture
def mount(tmp_path_factory: pytest.TempPathFactory, unprivileged: User) -> Iterator[Mount]:
    base = open_tmp(tmp_path_factory, "hostile-sizes")
    src = base / "src"
    (src / "userdir").mkdir(parents=True)
    src.chmod(0o755)
    os.chown(src / "userdir", unprivileged.uid, unprivileged.gid)
    (src / "notes.txt").write_bytes(b"still served\n")
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    m.start("-o", "allow_other", "--settle", "0.3", "--cache-size", CACHE)
    try:
        yield m
    finally:
        m.stop()


def test_a_sparse_collection_document_is_not_read_whole(mount: Mount, unprivileged: User) -> None:
    """`truncate -s 1G coll/acqstore/collection.json` in the user's folder of SRC: the AcqStore
    view is refused, naming the file, without reading a GiB (before: VmHWM 1.4 GB). (Made
    through the mount it is the same file once published; made here, the first listing of
    `coll` tries the view at once.)"""
    coll = mount.src / "userdir" / "coll"
    made = unprivileged.run("sh", "-c", f"mkdir -p {coll}/acqstore && "
                            f"truncate -s {GIB} {coll}/acqstore/collection.json")  # fmt: skip
    assert made.returncode == 0, made.stderr
    shown = mount.mnt / "userdir" / "coll"
    assert os.listdir(shown) == ["acqstore"]  # the first look at the folder tries the view
    deadline = time.monotonic() + 20
    while "no acqstore view" not in mount.log_text():
        assert time.monotonic() < deadline, mount.log_text()[-2000:]
        time.sleep(0.2)
    assert "larger than" in mount.log_text()
    assert mount.proc is not None
    assert peak_rss(mount.proc.pid) < 512 << 20
    assert (mount.mnt / "notes.txt").read_bytes() == b"still served\n"


def test_a_zip_of_many_entries_costs_its_tables_not_zipfiles(
    mount: Mount, unprivileged: User
) -> None:
    """400,000 one-byte entries in a 37 MB zip, dropped in the user's folder of SRC: the first
    listing opens it (it is then refused: no manifest). zipfile's directory cost the daemon
    ~250 MB of peak RSS for it; the compact directory ~50 MB."""
    count = 400_000
    many = zip_of_many(mount.src / "userdir" / "many.tif.zarr.zip", count)
    os.chown(many, unprivileged.uid, unprivileged.gid)
    assert mount.proc is not None
    before = peak_rss(mount.proc.pid)
    assert os.listdir(mount.mnt / "userdir") == ["many.tif.zarr.zip"]  # shown as the raw file
    deadline = time.monotonic() + 60
    while "many.tif.zarr.zip: not a decant archive" not in mount.log_text():
        assert time.monotonic() < deadline, mount.log_text()[-2000:]
        time.sleep(0.2)
    grown = peak_rss(mount.proc.pid) - before
    assert grown < 128 << 20, f"peak RSS grew {grown >> 20} MiB opening {count} entries"
    assert (mount.mnt / "notes.txt").read_bytes() == b"still served\n"


def test_more_chunks_than_a_digest_map_holds_verify_without_one(
    mount: Mount, unprivileged: User, tmp_path: Path
) -> None:
    """An archive that verifies, holding junk chunk keys past MAX_MAP_CHUNKS: a map of them
    would be parsed at each open of the archive (~100 bytes a digest). It gets none, keeps its
    CRC-32 checks, and is served as before."""
    original = tmp_path / "j.tif"
    tifffile.imwrite(original, np.arange(3 * 64 * 64, dtype=np.uint16).reshape(3, 64, 64))
    archive = mount.src / "userdir" / "j.tif.zarr.zip"
    pack_file(original, archive)
    with zipfile.ZipFile(archive, "a") as zf:
        for n in range(MAX_MAP_CHUNKS + 1):
            zf.writestr(f"junk/0.{n}", b"x")
    os.chown(archive, unprivileged.uid, unprivileged.gid)
    shown = mount.mnt / "userdir" / "j.tif"
    assert shown.read_bytes() == original.read_bytes()  # a whole read verifies it
    wait_status(mount.mnt, lambda doc: doc["daemon"]["verified"] == 1)
    with contextlib.closing(sqlite3.connect(mount.index / "index.sqlite")) as db:
        assert db.execute("SELECT count(*) FROM chunk_digests").fetchone() == (0,)
    assert os.getxattr(shown, "user.decant.verified") == b"yes"
    assert shown.read_bytes() == original.read_bytes()


HOLD = """
import os, sys
path, count = sys.argv[1], int(sys.argv[2])
fds = [os.open(path, os.O_RDONLY) for _ in range(count)]
print(len({os.pread(fd, 4096, 0) for fd in fds}))
for fd in fds:
    os.close(fd)
"""


def kept_by_one_open(archive: Path) -> int:
    """Bytes of Python objects one more reader of the original keeps while open, in-process."""
    with DecantArchive.open(archive) as opened:
        tracemalloc.start()
        try:
            reader = opened.open_original("", PageCache(0))
            kept = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        reader.close()
    return kept


def test_handles_of_a_stack_of_many_pages_share_its_plan(
    mount: Mount, unprivileged: User, tmp_path: Path
) -> None:
    """A stack of 8,192 pages of 4×4 planes (a 3.4 MB archive, the user's to make), opened 24
    times at once by the user. Each open built its own page table, region index and page order
    and ran every check again, outside --cache-size: ~5.6 MiB an open here, the peak grew 133
    MiB (65,536 pages: ~55 MiB and 4-12 s of daemon CPU an open; 8 handles peaked the daemon
    at 604 MiB). Handles of one archive version now share one plan: the peak grew 1.2 MiB."""
    pages, handles = 8192, 24
    tif = tmp_path / "many.tif"
    planes = (np.arange(pages * 16, dtype=np.uint32) % 251).astype(np.uint8)
    tifffile.imwrite(tif, planes.reshape(pages, 4, 4), photometric="minisblack")
    archive = mount.src / "userdir" / "many.tif.zarr.zip"
    pack_file(tif, archive)
    os.chown(archive, unprivileged.uid, unprivileged.gid)
    one = kept_by_one_open(archive)
    assert one > 2 << 20  # what the test is about: a plan of this stack is not small
    shown = mount.mnt / "userdir" / "many.tif"
    assert shown.read_bytes() == tif.read_bytes()  # described, read whole and verified
    wait_status(mount.mnt, lambda doc: doc["daemon"]["verified"] == 1)
    assert mount.proc is not None
    before = peak_rss(mount.proc.pid)
    done = unprivileged.run(str(SYSTEM_PYTHON), "-I", "-c", HOLD, str(shown), str(handles),
                            timeout=120)  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "1\n"), done.stderr
    grown = peak_rss(mount.proc.pid) - before
    assert grown < handles * one // 4, (
        f"peak RSS grew {grown >> 20} MiB for {handles} handles; one open keeps {one >> 20} MiB"
    )
    assert (mount.mnt / "notes.txt").read_bytes() == b"still served\n"


def test_an_archive_its_owner_cuts_short_under_an_open_handle_gives_eio(
    mount: Mount, unprivileged: User, tmp_path: Path
) -> None:
    """Chunks of MiBs (read past the page cache, O_DIRECT): the owner truncates the archive in
    SRC while the original is open through the mount. A read of the last plane (past the cut,
    and past the three planes read ahead) is EIO, never a short or stale buffer's bytes; the
    log names the archive and the entry; the mount stays up."""
    rng = np.random.default_rng(3)
    yy, xx = np.mgrid[0:2048, 0:2048]
    planes = np.stack([(yy + xx + k) % 4096 + rng.integers(0, 16, (2048, 2048)) for k in range(8)])
    tif = tmp_path / "cut.tif"
    tifffile.imwrite(tif, planes.astype(np.uint16), photometric="minisblack")
    original = tif.read_bytes()
    archive = mount.src / "userdir" / "cut.tif.zarr.zip"
    pack_file(tif, archive)
    os.chown(archive, unprivileged.uid, unprivileged.gid)
    with DecantArchive.open(archive) as arc:
        assert min(arc.store.entry_size(f"0/{k}.0.0") or 0 for k in range(8)) >= 1 << 20
    shown = mount.mnt / "userdir" / "cut.tif"
    fd = os.open(shown, os.O_RDONLY)
    try:
        assert os.pread(fd, 1 << 20, 0) == original[: 1 << 20]
        cut = unprivileged.run("truncate", "-s", str(archive.stat().st_size // 3), str(archive))
        assert cut.returncode == 0, cut.stderr
        with pytest.raises(OSError) as info:
            os.pread(fd, 1 << 20, len(original) - (1 << 20))
        assert info.value.errno == errno.EIO
    finally:
        os.close(fd)
    log = mount.log.read_text()
    assert f"{archive}: zip entry" in log, log[-2000:]
    assert "written since the archive was opened" in log, log[-2000:]  # cut short: its size
    assert (mount.mnt / "notes.txt").read_bytes() == b"still served\n"
