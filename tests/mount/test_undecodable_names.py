"""Names that are not UTF-8 (a file name is bytes of its maker's choice): one such archive name
made its whole folder EIO for every user (the index keys names as UTF-8 text), and one such
name anywhere in SRC stopped the folder watcher for good (watchfiles cannot name it)."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

import numpy as np
import tifffile

from tests.mount.conftest import Mount
from tests.mount.test_write_side import FAST, wait_drained
from vfs.decant.packer import pack_file

ODD_ARCHIVE = b"w\xff.tif.zarr.zip"


def _listed(folder: Path) -> set[bytes]:
    return set(os.listdir(os.fsencode(folder)))


def _wait_listed(m: Mount, folder: Path, name: bytes, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while name not in _listed(folder):
        assert time.monotonic() < deadline, m.log_text()[-2000:]
        time.sleep(0.1)


def test_an_archive_named_in_no_encoding_leaves_its_folder_served(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
) -> None:
    """An archive dropped in SRC under such a name, and a TIFF so named copied through a
    writable mount: the folder lists, a neighbour's file reads, both serve the original, before
    and after a restart (the second start answers from the index)."""
    work, src = tmp_path / "work", tmp_path / "src"
    (src / "shared").mkdir(parents=True), work.mkdir()
    (src / "shared" / "other.txt").write_bytes(b"a neighbour's file\n")
    original = work / "w.tif"
    tifffile.imwrite(original, np.arange(2 * 32 * 32, dtype=np.uint16).reshape(2, 32, 32))
    pack_file(original, work / "w.tif.zarr.zip")
    shutil.copyfile(work / "w.tif.zarr.zip", os.fsencode(src / "shared") + b"/" + ODD_ARCHIVE)
    want = hashlib.sha256(original.read_bytes()).hexdigest()

    m = make_mount(src, *FAST)
    shared = m.mnt / "shared"
    through = os.fsencode(shared) + b"/" + b"t\xfe.tif"  # a TIFF published through the mount
    with open(original, "rb") as fh, open(through, "wb") as out:
        shutil.copyfileobj(fh, out)
    wait_drained(m.mnt, src)
    for restart in (False, True):
        if restart:
            m.stop()
            m.start(*FAST)
        names = _listed(shared)
        # The archive shows the name its manifest records; the TIFF whose name no manifest can
        # record (JSON text is UTF-8) is published as it is, a plain file.
        assert {b"other.txt", b"w.tif", b"t\xfe.tif"} <= names, (names, m.log_text())
        assert (shared / "other.txt").read_bytes() == b"a neighbour's file\n"
        for shown in (b"w.tif", b"t\xfe.tif"):
            with open(os.fsencode(shared) + b"/" + shown, "rb") as fh:
                assert hashlib.sha256(fh.read()).hexdigest() == want, shown
    assert "unexpected error" not in m.log_text()


def test_the_watcher_outlives_a_name_it_cannot_decode(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
) -> None:
    """inotify reports the new name; watchfiles cannot hand it over as text and raised, which
    ended watching for the daemon's life. Now every watched folder is checked and the watch
    starts again: a later change still shows at once, with no fall-back to mtime checks."""
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    m = make_mount(src)
    assert _listed(m.mnt / "d") == set()
    with open(os.fsencode(src / "d") + b"/bad\xff.txt", "wb") as fh:
        fh.write(b"x")
    _wait_listed(m, m.mnt / "d", b"bad\xff.txt")
    (src / "d" / "later.txt").write_bytes(b"y")
    _wait_listed(m, m.mnt / "d", b"later.txt")
    log = m.log_text()
    assert "is not UTF-8" in log
    assert f"watching {src} failed" not in log, log
