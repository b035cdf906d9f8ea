"""Red team, round 37d: races on the write side's moves between SRC and the spool.

Each test that names a fix fails on the daemon before it; see the commit that added it. The
races are driven in process, a hook standing in for the user between two of the daemon's steps.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import vfs
from vfs.decant import TEMP_PREFIX
from vfs.ingest import spool as spool_mod
from vfs.ingest.publish import placing_lock
from vfs.ingest.spool import Spool


def test_the_worktree_s_code_runs() -> None:
    assert Path(vfs.__file__).resolve().is_relative_to(Path(__file__).resolve().parents[2])


def published(tmp_path: Path, rel: str) -> tuple[Path, Spool]:
    """SRC with `rel` published as a plain file (a hard link of the spooled one, then
    unspooled), as the queue leaves it."""
    src = tmp_path / "src"
    (src / Path(rel).parent).mkdir(parents=True)
    spool = Spool(src, src / ".decant-spool" / "files")
    fd = spool.create(rel, 0o644, os.getuid(), os.getgid())
    os.write(fd, b"notes\n")
    os.close(fd)
    spool.publish(rel, False, None)
    spool.remove(rel)
    assert (src / rel).read_bytes() == b"notes\n" and not spool.path(rel).exists()
    return src, spool


@pytest.mark.parametrize("taken_by", ["file", "folder", "gone"])
def test_a_folder_swapped_in_while_adopting_goes_back_to_its_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken_by: str
) -> None:
    """A published file opened for writing through the mount is moved back into the spool
    (`Spool.adopt`). Its folder's owner swaps it for a folder of theirs just before that move,
    and puts something at the name just after: the move took their folder into root's 0700
    spool, putting it back failed (the name was taken), and so did the fallback (unlink of a
    folder: EISDIR). Their folder stayed in the spool as a spooled folder: its files were
    published as spooled files, and a descriptor they kept of it let them put links where
    the daemon works by path (`_set_spooled`'s chmod, `open_for_write`'s open). Now the
    folder goes back beside its name, whole (or, its folder removed, is kept where nothing
    walks), and the spool holds nothing of it."""
    rel = "alice/notes.txt"
    src, spool = published(tmp_path, rel)
    real = src / rel
    same_file, into_folder = spool_mod._same_file, spool_mod._into_folder

    def swap(*args: Any) -> bool:  # the owner, just before the daemon's rename
        real.unlink()
        real.mkdir()
        (real / "x").write_bytes(b"theirs\n")
        return same_file(*args)

    def then_take(target: Path, make: Callable[[], Any], source: Path | None = None) -> Any:
        out = into_folder(target, make, source)
        if taken_by == "file":
            real.write_bytes(b"new\n")
        elif taken_by == "gone":  # their folder, emptied by the move, removed
            real.parent.rmdir()
        else:
            real.mkdir()
            (real / "y").write_bytes(b"theirs too\n")
        return out

    monkeypatch.setattr(spool_mod, "_same_file", swap)
    monkeypatch.setattr(spool_mod, "_into_folder", then_take)
    with placing_lock(), pytest.raises(OSError):
        spool.adopt(real, rel, src)
    assert not os.path.lexists(spool.path(rel)), "left in root's spool"
    assert spool.walk() == {}
    beside = src / ".decant-spool" if taken_by == "gone" else src / "alice"
    (back,) = [p for p in beside.iterdir() if p.name.startswith(TEMP_PREFIX)]
    assert (back / "x").read_bytes() == b"theirs\n"
