"""Red-team round 29b: a hostile local user against the write side and `.decant-status`, through
a real mount run by root with `-o allow_other` (see test_access_control.py for the set-up)."""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mount.conftest import Mount, User, open_tmp

SLACK = 64 << 20  # what other writers on this machine may change meanwhile


@pytest.fixture
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Mount]]:
    """SRC a sticky folder anyone may write (like /tmp), mounted with allow_other."""
    base = open_tmp(tmp_path_factory, "rt29b")
    src = base / "src"
    src.mkdir()
    src.chmod(0o1777)
    m = Mount(src, base / "mnt", base / "mnt.log", base / "index")
    m.start("--settle", "0.5", "-o", "allow_other")
    try:
        yield src, m
    finally:
        m.stop()


def test_status_shows_the_free_space_there_is_before_anything_was_written(
    shared: tuple[Path, Mount], unprivileged: User
) -> None:
    """`.decant-status` promises free space read at every call (vfs/mount/status.py). It showed
    the write gate's estimate instead: 0 until the first write asked the filesystem, so an
    operator (or a user deciding whether to copy in) read "free: 0" on a disk with gigabytes
    free, next to "refusing_writes": false; and after a write, the estimate of then."""
    src, m = shared
    before = os.statvfs(src)
    done = unprivileged.run("/usr/bin/cat", str(m.mnt / ".decant-status"))
    after = os.statvfs(src)
    assert done.returncode == 0, done.stderr
    space = json.loads(done.stdout)["space"]
    low = min(before.f_bavail * before.f_frsize, after.f_bavail * after.f_frsize)
    high = max(before.f_bavail * before.f_frsize, after.f_bavail * after.f_frsize)
    assert low - SLACK <= space["free"] <= high + SLACK, (space, low, high)


def _failed_paths(text: str) -> list[str]:
    return [e["path"] for e in json.loads(text).get("failed", [])]


def test_status_names_no_folder_the_reader_may_not_enter(
    shared: tuple[Path, Mount], unprivileged: User
) -> None:
    """`.decant-status` names a reader's own failed files only, and "never names from folders it
    may not list" (vfs/mount/status.py); the filter looked at the spooled file's owner alone. A
    user's file that cannot be published, in a shared folder another user then moves into their
    own 0700 folder under a new name, showed that user the folder's new name and where it lies."""
    src, m = shared
    (m.mnt / "drop").mkdir(mode=0o777)
    (m.mnt / "drop").chmod(0o1777)
    done = unprivileged.run("/usr/bin/cp", "/etc/hostname", str(m.mnt / "drop" / "mine.txt"))
    assert done.returncode == 0, done.stderr
    (src / "drop" / "mine.txt").mkdir()  # its name taken in SRC: it can never be published
    (m.mnt / "private").mkdir(mode=0o700)
    os.rename(m.mnt / "drop", m.mnt / "private" / "carol-layoffs")  # the other user (root here)
    want = "private/carol-layoffs/mine.txt"
    for _ in range(200):  # root sees every name: wait until it is reported failed again
        if want in _failed_paths((m.mnt / ".decant-status").read_text()):
            break
        time.sleep(0.1)
    else:
        raise AssertionError("never reported as failed")
    assert unprivileged.errno_of("os.listdir(p)", p=m.mnt / "private") == errno.EACCES  # control
    seen = unprivileged.run("/usr/bin/cat", str(m.mnt / ".decant-status"))
    assert seen.returncode == 0, seen.stderr
    assert "carol-layoffs" not in seen.stdout, seen.stdout
