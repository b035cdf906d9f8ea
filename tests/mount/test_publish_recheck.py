"""A name taken in SRC after a file was created through a root mount (`-o allow_other`), before
it is published: publishing re-checks what WriteSide._check_free checked at create time.

A user creates two TIFFs and two plain files through the mount in a sticky folder. Their
names, and their archive names, are free then. Before they settle another user (here root,
writing in SRC directly) puts its own files where publishing goes: at `scan.tif.zarr.zip` (the
user's archive), `notes.txt` (the user's plain file), `img.tif` (a plain file an archive of
`img.tif` sets aside) and `memo.txt.zarr.zip` (an archive a plain `memo.txt` sets aside). The
mount never showed those to the user, and at create time it would have refused (EEXIST) to
replace them. Publishing used to replace or delete them all as root; now none is touched, the
user's files stay spooled, and the log and the user's `.decant-status` name each entry."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tests.mount.conftest import SYSTEM_PYTHON, Mount, User, open_tmp
from vfs.decant.packer import pack_file

SPOOL = ".decant-spool/files"
# What the user creates through the mount -> root's entry, put in SRC before it is published.
USER = {
    "scan.tif": "scan.tif.zarr.zip",  # where its archive goes
    "notes.txt": "notes.txt",  # where the plain file goes
    "img.tif": "img.tif",  # a plain file of the name: its archive sets that aside
    "memo.txt": "memo.txt.zarr.zip",  # an archive of the name: the plain file sets it aside
}


@dataclass(frozen=True)
class Shared:
    m: Mount
    drop: Path  # SRC's sticky (1777) folder
    work: Path  # TIFFs and archives made outside SRC


@pytest.fixture
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    base = open_tmp(tmp_path_factory, "publish-recheck")
    src, work = base / "src", base / "work"
    drop = src / "drop"
    drop.mkdir(parents=True)
    drop.chmod(0o1777)
    work.mkdir()
    for seed, name in enumerate(("scan.tif", "other.tif")):
        data = np.random.default_rng(seed).integers(0, 60000, (2, 24, 16), dtype=np.uint16)
        tifffile.imwrite(work / name, data, photometric="minisblack")
    (work / "scan.tif").chmod(0o644)
    pack_file(work / "other.tif", work / "other.tif.zarr.zip")
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    # Long enough for root's files to arrive first (the test waits on the log, not on time).
    m.start("-o", "allow_other", "--settle", "3")
    try:
        yield Shared(m, drop, work)
    finally:
        m.stop()


def digest(path: Path) -> tuple[int, int, str] | None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None  # set aside
    return st.st_ino, st.st_uid, hashlib.sha256(path.read_bytes()).hexdigest()


def test_publishing_replaces_nothing_put_in_its_way_after_create(
    shared: Shared, unprivileged: User
) -> None:
    mnt = shared.m.mnt / "drop"
    code = (
        "import sys\n"
        "tiff, mnt = open(sys.argv[1], 'rb').read(), sys.argv[2]\n"
        "open(mnt + '/scan.tif', 'wb').write(tiff)\n"
        "open(mnt + '/img.tif', 'wb').write(tiff)\n"
        "open(mnt + '/notes.txt', 'wb').write(b'the user s notes\\n')\n"
        "open(mnt + '/memo.txt', 'wb').write(b'the user s memo\\n')\n"
    )
    done = unprivileged.run(str(SYSTEM_PYTHON), "-I", "-c", code, str(shared.work / "scan.tif"),
                            str(mnt))  # fmt: skip
    assert done.returncode == 0, done.stderr
    # Root's own files, at the names publishing will use, while the user's are still spooled.
    spooled = shared.drop.parent / SPOOL / "drop"
    assert set(USER) <= set(os.listdir(spooled))
    rooted = {name: shared.drop / name for name in USER.values()}
    other = (shared.work / "other.tif.zarr.zip").read_bytes()  # presents other.tif
    rooted["scan.tif.zarr.zip"].write_bytes(other)
    rooted["memo.txt.zarr.zip"].write_bytes(other)
    rooted["notes.txt"].write_bytes(b"root's notes\n")
    rooted["img.tif"].write_bytes(b"root's img.tif, not a TIFF\n")
    before = {name: digest(p) for name, p in rooted.items()}

    deadline = time.monotonic() + 30  # until each was tried: published, or not
    while not all(
        f"drop/{n}: not published" in log or f"drop/{n}: published as" in log
        for n in USER
        for log in [shared.m.log_text()]
    ):
        assert time.monotonic() < deadline, shared.m.log_text()[-3000:]
        time.sleep(0.2)

    assert {name: digest(p) for name, p in rooted.items()} == before  # untouched, root's
    assert set(USER) <= set(os.listdir(spooled))  # the user's stay spooled
    log = shared.m.log_text()
    for name in USER.values():
        lines = [line for line in log.splitlines() if f"drop/{name}: holds an entry" in line]
        assert any("written through the mount; not replaced" in line for line in lines), log
    status = json.loads(unprivileged.value_of("open(p).read()", p=shared.m.mnt / ".decant-status"))
    failed = {item["path"]: item["reason"] for item in status["failed"]}
    assert set(failed) == {f"drop/{name}" for name in USER}, status
    assert all("not replaced" in reason for reason in failed.values()), failed
    # What the user sees: its own files, under their names, with their bytes.
    assert (mnt / "scan.tif").read_bytes() == (shared.work / "scan.tif").read_bytes()
    assert (mnt / "notes.txt").read_bytes() == b"the user s notes\n"


def test_an_archive_of_the_same_bytes_put_in_the_way_does_not_cost_the_spooled_copy(
    shared: Shared, unprivileged: User
) -> None:
    """Someone who may read the user's spooled TIFF (0644) packs the same bytes and drops the
    archive at its archive name before it settles. Taken for the user's own ("already
    published"), it used to cost the spooled copy: the only copy was then the other's archive,
    which its owner may delete. Now it is refused like any entry put in the way."""
    mnt = shared.m.mnt / "drop"
    scan = shared.work / "scan.tif"
    code = "import sys\nopen(sys.argv[2] + '/scan.tif', 'wb').write(open(sys.argv[1], 'rb').read())"
    done = unprivileged.run(str(SYSTEM_PYTHON), "-I", "-c", code, str(scan), str(mnt))
    assert done.returncode == 0, done.stderr
    spooled = shared.drop.parent / SPOOL / "drop"
    assert "scan.tif" in os.listdir(spooled)
    theirs = shared.drop / "scan.tif.zarr.zip"
    pack_file(scan, shared.work / "theirs.zarr.zip")  # the same bytes, someone else's archive
    (shared.work / "theirs.zarr.zip").rename(theirs)
    before = digest(theirs)

    deadline = time.monotonic() + 30
    while "drop/scan.tif: not published" not in shared.m.log_text():
        assert "drop/scan.tif: published as" not in shared.m.log_text(), shared.m.log_text()
        assert time.monotonic() < deadline, shared.m.log_text()[-3000:]
        time.sleep(0.2)
    assert digest(theirs) == before
    assert "scan.tif" in os.listdir(spooled)  # the user's copy stays
    assert "not replaced" in shared.m.log_text()
    theirs.unlink()  # its owner takes it away again: the user's file is still there
    assert (spooled / "scan.tif").read_bytes() == scan.read_bytes()
    assert unprivileged.value_of("open(p, 'rb').read().hex()", p=mnt / "scan.tif") == (
        scan.read_bytes().hex()
    )
