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
from vfs.ingest import publish as publish_mod
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


# -- set aside beside its target, when the spool is on another filesystem than SRC ------------


def two_users(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Spool, Path, Path]:
    """SRC with alice's folder `alice/d` (holding `old.txt`, to be set aside) and bob's folder
    `bob/p` (two files and a folder of his), with the staging folder on "another filesystem":
    what is set aside waits beside its target, in alice's folder."""
    src = tmp_path / "src"
    mine, theirs = src / "alice" / "d", src / "bob" / "p"
    for folder in (mine, theirs / "keep"):
        folder.mkdir(parents=True)
    (mine / "old.txt").write_bytes(b"old\n")
    for name in ("a.txt", "keep/b.txt"):
        (theirs / name).write_bytes(b"bob's\n")
    monkeypatch.setattr(publish_mod, "_same_fs", lambda a, b: False)
    return src, Spool(src, src / ".decant-spool" / "files"), mine, theirs


def swap_for_link(folder: Path, to: Path) -> None:
    """What alice can do to her own folder at any moment: move it away, a link in its place."""
    folder.rename(folder.with_name("d.real"))
    folder.symlink_to(to)


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_folder_swapped_for_a_link_after_set_aside_deletes_nothing_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`remove_tree` deletes a set-aside entry by its path, `alice/d/<temp name>`: alice's
    folder swapped for a link to bob's in between makes it delete `bob/p/<temp name>`, and
    only that. The name is a fresh random one of the daemon's, which no file of bob's holds
    (and, with the set-aside itself reached without links, no entry of alice's either): bob's
    files stay. (This held before the fix below too: the suspicion is refuted.)"""
    _src, spool, mine, theirs = two_users(tmp_path, monkeypatch)
    before = listing(theirs)
    with placing_lock():
        doomed = publish_mod.set_aside(spool, mine / "old.txt")
    assert doomed is not None and doomed.parent == mine
    swap_for_link(mine, theirs)
    publish_mod.remove_tree(doomed)
    assert listing(theirs) == before


@pytest.mark.parametrize("step", ["set_aside", "keep_older"])
def test_a_folder_swapped_for_a_link_while_setting_aside_moves_nothing_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """Setting aside (a replaced or deleted entry; an older file about to be replaced) reached
    the entry's folder without links, but gave it its temp name beside the target by path:
    alice's folder swapped for a link to bob's just then made root move (or hard-link) her
    entry into bob's folder, which she may not write (on SRC's filesystem: /etc, when SRC is
    on the root filesystem); she swaps it back and it stays there. Now the temp name is given
    in the folder the descriptor holds."""
    src, spool, mine, theirs = two_users(tmp_path, monkeypatch)
    before = listing(theirs)
    staged = publish_mod._staged

    def then_swap(*args: Any) -> Path:
        out = staged(*args)
        swap_for_link(mine, theirs)
        return out

    monkeypatch.setattr(publish_mod, "_staged", then_swap)
    dfd = os.open(mine, os.O_PATH | os.O_DIRECTORY)
    try:
        with placing_lock():
            if step == "set_aside":
                doomed = publish_mod.set_aside(spool, mine / "old.txt", dfd)
            else:
                doomed = publish_mod._keep_older(spool, mine / "old.txt", dfd)
    finally:
        os.close(dfd)
    assert listing(theirs) == before
    assert doomed is not None
    assert [p.name for p in (src / "alice" / "d.real").iterdir() if p.name != "old.txt"] == [
        doomed.name
    ]
