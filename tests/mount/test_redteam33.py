"""Red team, round 33: the write side (ingest) through a real mount.

Each test fails on the daemon before its fix; see the commit that added it.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.mount.conftest import Mount

MakeMount = Callable[..., Mount]
SLOW = ("--settle", "600")  # files stay spooled while the test acts on them
SPOOL = Path(".decant-spool") / "files"


def status(mnt: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((mnt / ".decant-status").read_text())
    return doc


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {what} after {timeout:.0f} s")
        time.sleep(0.1)


def files_of(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and SPOOL.parts[0] not in p.relative_to(folder).parts
    }


@pytest.fixture
def src(tmp_path: Path) -> Path:
    folder = tmp_path / "src"
    folder.mkdir()
    return folder


# -- a folder renamed over a folder whose files are all still spooled -----------------------


@pytest.mark.parametrize("first", ["spooled", "published"])
def test_a_folder_is_not_renamed_over_one_holding_spooled_files(
    src: Path, make_mount: MakeMount, first: str
) -> None:
    """`mv -T a b` where the mount shows `b/` holding a file (spooled, not yet published, so
    SRC's `b/` is empty) must fail with ENOTEMPTY and change nothing, as on any filesystem.
    The rename used to be made in SRC first: with `a/`'s files spooled too, the caller got
    ENOTEMPTY but SRC's `b/` (its mode) was gone and `a/` reappeared at the next publish as a
    root 0755 folder; with `a/`'s files published, the rename succeeded and merged the two
    folders (`b/`'s pending file went into `a/`'s folder, whoever owned it)."""
    if first == "published":  # a's file is in SRC itself
        (src / "a").mkdir(mode=0o700)
        (src / "a" / "x").write_bytes(b"a's file\n")
    mnt = make_mount(src, *SLOW).mnt
    if first == "spooled":
        (mnt / "a").mkdir(mode=0o700)
        (mnt / "a" / "x").write_bytes(b"a's file\n")
    (mnt / "b").mkdir(mode=0o750)
    (mnt / "b" / "y").write_bytes(b"b's file\n")
    before = files_of(mnt)
    with pytest.raises(OSError) as caught:
        os.rename(mnt / "a", mnt / "b")
    assert caught.value.errno in (errno.ENOTEMPTY, errno.EEXIST), caught.value
    assert files_of(mnt) == before
    assert sorted(os.listdir(src)) == [".decant-spool", "a", "b"], "SRC changed by a failed rename"
    assert (src / "a").stat().st_mode & 0o777 == 0o700
    assert (src / "b").stat().st_mode & 0o777 == 0o750


# -- a file spooled deeper than the spool's walks go ----------------------------------------


def test_a_file_written_deeper_than_the_walks_go_is_still_published(
    src: Path, make_mount: MakeMount
) -> None:
    """Walks of the spool stop 256 folders deep (vfs/walk.py). A file written through the mount
    below that was taken by the next walk (every 5 s) for one deleted behind the queue's back
    and dropped from it: it stayed spooled for good, never published, and `.decant-status`
    no longer counted it. Here it settles after that walk has run."""
    mnt = make_mount(src, "--settle", "7").mnt
    deep = Path(*(["d"] * 260))
    (mnt / deep).mkdir(parents=True)
    (mnt / deep / "f").write_bytes(b"deep data\n")
    published = src / deep / "f"
    wait_for(f"published at {published}", published.exists, timeout=25)
    assert published.read_bytes() == b"deep data\n"
    wait_for("unspooled", lambda: not (src / SPOOL / deep / "f").exists())
    assert (mnt / deep / "f").read_bytes() == b"deep data\n"
