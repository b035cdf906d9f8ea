"""Sizes an unprivileged user declares for free, in SRC or through a writable root mount
(`-o allow_other`): a sparse file costs its maker no disk, so the daemon must not read it whole.
The daemon's peak RSS (VmHWM) stays near its cache budget and it keeps serving."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from tests.mount.conftest import Mount, User, open_tmp
from tests.toolbox import proc_status, zip_of_many

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
