"""Red team, round 36a: the write side through a real mount, as clients and local users.

Each test fails on the daemon before its fix; see the commit that added it.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.mount.conftest import Mount, User, open_tmp
from tests.mount.helpers import settled, tiff, wait_for

FAST = ("-o", "allow_other", "--settle", "0.3")


@pytest.fixture
def mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mount]:
    """A root mount (`allow_other`, short settle) of a SRC whose folder `drop` any user may
    add to (sticky, as /tmp), in a folder other users may reach."""
    base = open_tmp(tmp_path_factory, "rt36a")
    src = base / "src"
    (src / "drop").mkdir(parents=True)
    (src / "drop").chmod(0o1777)
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    m.start(*FAST)
    try:
        yield m
    finally:
        m.stop()


# -- the same bytes again, with a narrower mode and another mtime -----------------------------


def test_a_tiff_copied_again_with_the_same_bytes_takes_its_new_mode_and_mtime(
    mount: Mount, unprivileged: User
) -> None:
    """`rsync -a` of a TIFF whose bytes are already archived but whose mode (now 0600) and
    mtime changed: rsync writes a temp file, gives it the mode and mtime, renames it over the
    name. Publishing found an archive holding those very bytes and took it for the new file's
    own ("already"), leaving the old archive's mode 0644 and its mtime: other users kept
    reading a file its owner had just made private, and every later `rsync -a` copied it again."""
    m, shared = mount, mount.src
    data = tiff(1)
    dst = m.mnt / "drop" / "scan.tif"
    dst.write_bytes(data)
    dst.chmod(0o644)
    archive = shared / "drop" / "scan.tif.zarr.zip"
    wait_for("published", lambda: archive.exists() and settled(m))
    assert unprivileged.errno_of("read(p)", p=dst) == 0
    tmp = m.mnt / "drop" / ".scan.tif.Ab12Cd"
    tmp.write_bytes(data)
    tmp.chmod(0o600)
    os.utime(tmp, ns=(1_500_000_000_000_000_000, 1_500_000_000_000_000_000))
    os.rename(tmp, dst)
    wait_for("published again", lambda: settled(m))
    st = archive.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_mtime_ns) == (0o600, 1_500_000_000_000_000_000)
    assert dst.read_bytes() == data
    assert dst.stat().st_mtime_ns == 1_500_000_000_000_000_000
    assert unprivileged.errno_of("read(p)", p=dst) == 13


# -- an archive copied in through the mount -----------------------------------------------------


def test_an_archive_copied_in_keeps_its_name_once_published(mount: Mount, tmp_path: Path) -> None:
    """`cp x.tif.zarr.zip MNT/` (an archive copied back from elsewhere): published as it was,
    SRC presented it as `x.tif`; the mount looked only its own name up after the publish, so
    the name left the listing and `x.tif` never came (until a remount): a file the client was
    told was copied was gone. Red team 56 (F6) found the other half: presented as `x.tif`, the
    name written gives ENOENT and `rsync -a` sends it again at each run. A file written under
    an archive's name is packed verbatim, and reads back under that name, byte for byte."""
    from vfs.decant.packer import pack_file

    (tmp_path / "x.tif").write_bytes(tiff(2))
    pack_file(tmp_path / "x.tif", tmp_path / "x.tif.zarr.zip")
    archive = (tmp_path / "x.tif.zarr.zip").read_bytes()
    drop = mount.mnt / "drop"
    (drop / "x.tif.zarr.zip").write_bytes(archive)
    wait_for("published", lambda: settled(mount))
    assert (mount.src / "drop" / "x.tif.zarr.zip.zarr.zip").is_file()
    assert sorted(os.listdir(drop)) == ["x.tif.zarr.zip"]
    assert (drop / "x.tif.zarr.zip").read_bytes() == archive


# -- touch -d of a published TIFF ---------------------------------------------------------------


def test_touch_of_an_archived_original_shows_its_new_mtime(mount: Mount) -> None:
    """`touch -d` of a TIFF once it is archived: the archive took the mtime (a remount showed
    it) but the mount kept serving the old one, so `rsync -a` copied the file again."""
    path = mount.mnt / "drop" / "a.tif"
    path.write_bytes(tiff(3))
    archive = mount.src / "drop" / "a.tif.zarr.zip"
    wait_for("published", lambda: archive.exists() and settled(mount))
    when = 1_600_000_000_000_000_000
    os.utime(path, ns=(when, when))
    assert archive.stat().st_mtime_ns == when
    assert os.stat(path).st_mtime_ns == when
    os.chmod(path, 0o640)  # a chmod after it keeps it (and the file still opens)
    assert (os.stat(path).st_mtime_ns, stat.S_IMODE(os.stat(path).st_mode)) == (when, 0o640)
    assert path.read_bytes() == tiff(3)


# -- a published file renamed over an archived original ----------------------------------------


def test_a_published_file_renamed_over_an_archived_tiff_replaces_its_archive(
    mount: Mount,
) -> None:
    """`mv notes.txt scan.tif` where both are published (`scan.tif` as its archive): the
    rename put `scan.tif` into SRC beside `scan.tif.zarr.zip`, which stayed. The mount then
    listed a `scan.tif.zarr.zip` nobody made, a later `rm scan.tif` (--allow-delete) brought
    the old TIFF back under the name, and `scan.tif` written again was never published (the
    leftover archive was no entry it could replace: failed, retried for ever)."""
    drop, src = mount.mnt / "drop", mount.src / "drop"
    (drop / "scan.tif").write_bytes(tiff(4))
    (drop / "notes.txt").write_bytes(b"notes\n")
    wait_for("published", lambda: (src / "scan.tif.zarr.zip").exists() and settled(mount))
    os.rename(drop / "notes.txt", drop / "scan.tif")
    assert sorted(os.listdir(drop)) == ["scan.tif"]
    assert sorted(os.listdir(src)) == ["scan.tif"]
    with open(drop / "scan.tif", "ab") as fh:  # moved back into the spool, published anew
        fh.write(b"more\n")
    wait_for("published again", lambda: settled(mount))
    assert (drop / "scan.tif").read_bytes() == b"notes\nmore\n"
    assert sorted(os.listdir(src)) == ["scan.tif"]


# -- a write to a file in the instant after its publish -----------------------------------------


def test_a_file_written_while_its_spooled_name_goes_stays_whole(tmp_path: Path) -> None:
    """A plain file is published as a hard link; the mount switches to it, and only then does
    its spooled name go. A client opening it for writing in between (the mount moves a
    published file back into the spool to write it) renamed one link of the file over the
    other: rename() does nothing then, the file stayed in SRC, the spooled name went, and the
    mount's node pointed at nothing (ENOENT at open and stat of a file that is there, seen
    through a real mount by appending to 60 files as they publish). Here the three steps run
    in that order, without the mount: the write side's adopt, then the queue's removal."""
    from vfs.ingest.publish import placing_lock
    from vfs.ingest.queue import Item, PackQueue
    from vfs.ingest.spool import Spool

    src = tmp_path / "src"
    (src / "drop").mkdir(parents=True)
    spool = Spool(src, src / ".decant-spool" / "files")
    rel = "drop/notes.txt"
    fd = spool.create(rel, 0o644, os.getuid(), os.getgid())
    os.write(fd, b"notes\n")
    os.close(fd)
    published = spool.publish(rel, False, None)
    assert published.mode == "plain" and (src / rel).read_bytes() == b"notes\n"
    with placing_lock():  # WriteSide.open_for_write of the published file
        spool.adopt(src / rel, rel, src)
    fd = os.open(spool.path(rel), os.O_WRONLY | os.O_APPEND)
    try:
        assert PackQueue._remove_spooled([(Item(spool, rel), published)]) == [False]
        os.write(fd, b"more\n")
    finally:
        os.close(fd)
    assert spool.path(rel).read_bytes() == b"notes\nmore\n"  # spooled, to be published anew
    assert not (src / rel).exists()


# -- a published archive renamed away before its batch is made durable ---------------------------


def test_an_archive_renamed_away_before_its_batch_syncs_fails_no_one_s_files(
    tmp_path: Path,
) -> None:
    """A worker publishes a batch, then fsyncs its archives at once before their spooled copies
    go. A folder renamed through the mount meanwhile (seen in a real mount, renaming folders
    while files publish) took an archive of the batch away: the fsync raised, the whole batch
    failed, and every file in it, of every user, was reported failed and retried only 30 s
    later (doubling each time); the folder's owner could do it at will. Now that one file is
    tried again soon (its spooled copy stays), and the others are published."""
    from vfs.ingest.publish import placing_lock
    from vfs.ingest.queue import Item, PackQueue
    from vfs.ingest.spool import Spool

    src = tmp_path / "src"
    (src / "mine").mkdir(parents=True)
    spool = Spool(src, src / ".decant-spool" / "files")
    for rel, seed in (("mine/a.tif", 5), ("b.tif", 6)):
        fd = spool.create(rel, 0o644, os.getuid(), os.getgid())
        os.write(fd, tiff(seed))
        os.close(fd)
    attempt = spool.attempt

    def renamed_first(relpath: str, *args: Any) -> Any:
        if relpath == "b.tif":  # `mv mine theirs` through the mount, after a.tif was placed
            with placing_lock():
                os.rename(src / "mine", src / "theirs")
                spool.rename("mine", "theirs")
        return attempt(relpath, *args)

    spool.attempt = renamed_first  # type: ignore[method-assign]
    queue = PackQueue([spool], settle=0.0, options=None)
    out = queue._work([Item(spool, "mine/a.tif"), Item(spool, "b.tif")])
    assert [(o.relpath, o.kind) for o in out] == [
        ("mine/a.tif", "unsettled"),
        ("b.tif", "published"),
    ]
    assert (src / "theirs" / "a.tif.zarr.zip").is_file()
    assert spool.path("theirs/a.tif").read_bytes() == tiff(5)


def test_a_file_published_as_its_folder_is_renamed_is_not_refused_its_own_archive(
    tmp_path: Path,
) -> None:
    """Its archive placed, its spooled copy not yet gone, the file's folder renamed through the
    mount (SRC's folder and the spool's move together): publishing it again under its new
    path found its own archive there but knew it only under the old path, refused it as an
    entry "put there after" the file was written, and the file failed for good (retried
    30 s later, doubling, never published)."""
    from vfs.ingest.publish import placing_lock
    from vfs.ingest.spool import Spool

    src = tmp_path / "src"
    (src / "mine").mkdir(parents=True)
    spool = Spool(src, src / ".decant-spool" / "files")
    fd = spool.create("mine/a.tif", 0o644, os.getuid(), os.getgid())
    os.write(fd, tiff(5))
    os.close(fd)
    spool.allow_replacing("mine/a.tif", frozenset())  # created through the mount
    assert spool.publish("mine/a.tif", False, None).mode == "byte-exact"
    with placing_lock():  # WriteSide.rename of the folder
        os.rename(src / "mine", src / "theirs")
        spool.rename("mine", "theirs")
    outcome = spool.attempt("theirs/a.tif", False, None, 0.0)
    assert (outcome.kind, outcome.reason) == ("published", "")


# -- two pack workers and one name ---------------------------------------------------------------


def test_two_workers_never_publish_one_name_at_once(tmp_path: Path) -> None:
    """`--pack-workers 2`: a TIFF still being packed by one worker, a new version renamed over
    it (rsync), which settled and went to the other worker. Seen through a real mount (25
    large TIFFs overwritten as they were packed): the first placed its archive, the second
    found it holding the spooled bytes ("already") and deleted the spooled copy, and the
    first, its item replaced, withdrew the archive as a file removed while publishing. Both
    versions were gone. An item whose name a worker holds now waits for it."""
    from vfs.ingest.queue import GATHER, PackQueue
    from vfs.ingest.spool import Spool

    src = tmp_path / "src"
    src.mkdir()
    spool = Spool(src, src / ".decant-spool" / "files")
    queue = PackQueue([spool], settle=0.0, options=None, workers=2)
    started: list[list[Any]] = []

    class Nursery:  # records what would run, runs nothing
        def start_soon(self, _fn: Any, batch: list[Any]) -> None:
            started.append(batch)

    queue.touch("scan.tif")
    time.sleep(GATHER + 0.05)
    queue._dispatch(Nursery())  # type: ignore[arg-type]
    assert [[i.relpath for i in b] for b in started] == [["scan.tif"]]
    queue.renamed(".scan.tif.Ab12Cd", "scan.tif")  # rsync's rename of the new version
    time.sleep(GATHER + 0.05)
    queue._dispatch(Nursery())  # type: ignore[arg-type]
    assert len(started) == 1  # the new version waits for the worker holding the name
