"""Red team, round 44: the write side across a restart, on an `allow_other` mount.
Each test fails on the daemon before its fix; see the commit that added it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.mount.conftest import Mount, User, open_tmp
from vfs.decant.packer import pack_file


def _sticky_src(factory: pytest.TempPathFactory, name: str) -> tuple[Path, Path, Path]:
    """(base, SRC, SRC/shared): `shared/` is root's, 1777, as /tmp is."""
    base = open_tmp(factory, name)
    src, shared = base / "src", base / "src" / "shared"
    for folder in (src, shared):
        folder.mkdir()
    src.chmod(0o755)
    shared.chmod(0o1777)
    return base, src, shared


def _until(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_file_spooled_before_a_restart_does_not_replace_another_user_s_file(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User
) -> None:
    """USER writes `shared/report.txt` and `shared/mine.txt` through the mount, in a sticky
    folder; before they are published the daemon stops. Meanwhile another user (root) puts
    their own `report.txt` there in SRC, and USER keeps an older `mine.txt` of their own there.
    What the mount showed under a name when it was written was kept in memory only, so the
    next daemon published every spooled file over whatever it found: root's file was replaced
    by USER's, with no copy kept (the running daemon refused it). Now a file spooled before
    a restart replaces only what its writer could replace by a rename of their own: USER's
    older `mine.txt`, not root's `report.txt`, which stays, while USER's stays spooled."""
    u = unprivileged
    base, src, shared = _sticky_src(tmp_path_factory, "rt44-restart")
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--settle", "600")  # nothing is published before the stop
        for name, data in (("report.txt", "USER WAS HERE"), ("mine.txt", "USER's new notes")):
            assert u.value_of("write(p, d.encode())", p=m.mnt / "shared" / name, d=data)
        m.stop()
        (shared / "report.txt").write_text("root's precious data")  # root's, 0644
        older = shared / "mine.txt"
        older.write_text("USER's old notes")
        os.chown(older, u.uid, u.gid)
        m.start("-o", "allow_other", "--settle", "1")
        _until(lambda: (shared / "mine.txt").read_text() == "USER's new notes")
        _until(lambda: "may not replace (spooled before a restart)" in m.log_text())
        assert (shared / "report.txt").read_text() == "root's precious data"
        assert (shared / "report.txt").stat().st_uid == 0
        spooled = src / ".decant-spool" / "files" / "shared" / "report.txt"
        assert spooled.read_text() == "USER WAS HERE"  # kept, failed, not lost
    finally:
        m.stop()


def test_a_tiff_spooled_before_a_restart_does_not_replace_another_user_s_archive(
    tmp_path_factory: pytest.TempPathFactory, unprivileged: User, mount_corpus: tuple[Path, Path]
) -> None:
    """The same for a TIFF: root's `scan.tif.zarr.zip` put in the sticky folder while the
    daemon was down was replaced by USER's spooled `scan.tif` at the next start."""
    u = unprivileged
    base, src, shared = _sticky_src(tmp_path_factory, "rt44-restart-tif")
    corpus = mount_corpus[0]
    tiffs = sorted(corpus.glob("*.tif"))
    mine, roots = tiffs[0], tiffs[1]
    readable = base / "mine.tif"
    readable.write_bytes(mine.read_bytes())
    readable.chmod(0o644)
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    try:
        m.start("-o", "allow_other", "--settle", "600")
        assert u.value_of("write(p, open(t, 'rb').read())", p=m.mnt / "shared" / "scan.tif",
                          t=readable)  # fmt: skip
        m.stop()
        archive = shared / "scan.tif.zarr.zip"
        pack_file(roots, archive)  # root's, 0644
        before = archive.read_bytes()
        m.start("-o", "allow_other", "--settle", "1")
        _until(lambda: "may not replace (spooled before a restart)" in m.log_text())
        assert archive.read_bytes() == before
        assert archive.stat().st_uid == 0
        spooled = src / ".decant-spool" / "files" / "shared" / "scan.tif"
        assert spooled.read_bytes() == mine.read_bytes()
    finally:
        m.stop()
