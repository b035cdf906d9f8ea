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


@pytest.mark.parametrize("taken_by", ["file", "folder", "empty folder", "gone"])
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
        elif taken_by == "empty folder":  # another user's, in a sticky folder: rename replaced it
            real.mkdir()
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
    if taken_by == "empty folder":  # what holds the name now is never replaced (NOREPLACE)
        assert real.is_dir() and list(real.iterdir()) == []


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


# -- a copy staged beside its target, when the spool is on another filesystem than SRC -------

ALICE, BOB = 1234, 4321


def small_tiff() -> bytes:
    import io

    import numpy as np
    import tifffile

    buf = io.BytesIO()
    data = np.arange(2 * 24 * 16, dtype=np.uint16).reshape(2, 24, 16)
    tifffile.imwrite(buf, data, photometric="minisblack")
    return buf.getvalue()


@pytest.mark.parametrize("name", ["x.conf", "z.tif"])
@pytest.mark.parametrize("moment", ["named", "copied"])
def test_a_folder_swapped_for_a_link_while_staging_a_copy_creates_nothing_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, moment: str
) -> None:
    """With the spool on another filesystem, a file (or its archive) is copied to a temp name
    beside its target, in alice's folder, and that copy was then created, chmod/chown-ed,
    compared, renamed and removed by path. Alice swaps her folder for a link to bob's just
    after the name is chosen ("named") or just after the copy is made, with a file of bob's at
    that name ("copied"), and swaps it back before it is placed: root created her bytes in
    bob's folder, hers and 0644, and left them there (the rename then found nothing), or
    chmod/chown-ed bob's file to her and then deleted it (an archive's: deleted it). Now
    every step goes through one descriptor of her folder, reached without links: bob's folder
    is left as it was, and her file is published (or stays spooled and published next try)."""
    src, spool, mine, theirs = two_users(tmp_path, monkeypatch)
    rel = f"alice/d/{name}"
    data = small_tiff() if name.endswith(".tif") else b"alice's\n"
    fd = spool.create(rel, 0o644, ALICE, ALICE)
    os.write(fd, data)
    os.close(fd)
    bobs = b"bob's own\n"
    before = listing(theirs)
    staged, copy_sparse, place = publish_mod._staged, publish_mod.copy_sparse, publish_mod.place

    swapped: list[str] = []

    def swap(at: str) -> None:
        if not swapped:  # once
            swapped.append(at)
            swap_for_link(mine, theirs)
            if moment == "copied":  # bob's file at the name alice saw in her folder
                (theirs / at).write_bytes(bobs)
                os.chown(theirs / at, BOB, BOB)
                os.chmod(theirs / at, 0o600)
                before.append(at)
                before.sort()

    def then_swap(*args: Any) -> Path:
        out = staged(*args)
        if moment == "named" and out.parent == mine:
            swap(out.name)
        return out

    def copied_then_swap(source: Path, dest: Path, *args: Any) -> None:
        copy_sparse(source, dest, *args)
        if moment == "copied" and dest.parent == mine:
            swap(dest.name)

    def swap_back() -> None:
        if mine.is_symlink():
            mine.unlink()
            (src / "alice" / "d.real").rename(mine)

    def swapped_back_then_place(*args: Any, **kw: Any) -> tuple[int, int]:
        swap_back()
        return place(*args, **kw)

    monkeypatch.setattr(publish_mod, "_staged", then_swap)
    monkeypatch.setattr(publish_mod, "copy_sparse", copied_then_swap)
    monkeypatch.setattr(publish_mod, "place", swapped_back_then_place)
    try:
        spool.publish(rel, False, None)
    except OSError:  # the folder was a link when reached: tried again later, unhindered
        swap_back()
        assert spool.path(rel).read_bytes() == data
        for hooked, was in (("_staged", staged), ("copy_sparse", copy_sparse), ("place", place)):
            monkeypatch.setattr(publish_mod, hooked, was)
        spool.publish(rel, False, None)
    assert swapped
    assert listing(theirs) == before, "created or left in bob's folder"
    for entry in theirs.rglob("*"):
        held = entry.lstat()
        assert held.st_uid != ALICE, f"{entry} given to alice"
    if moment == "copied":
        (planted,) = [p for p in theirs.iterdir() if p.name.startswith(TEMP_PREFIX)]
        held = planted.stat()
        assert (held.st_uid, held.st_mode & 0o777, planted.read_bytes()) == (BOB, 0o600, bobs)
    target = mine / (f"{name}.zarr.zip" if name.endswith(".tif") else name)
    assert target.is_file() and target.stat().st_uid == ALICE
    if not name.endswith(".tif"):
        assert target.read_bytes() == data
    assert not [p for p in mine.iterdir() if p.name.startswith(TEMP_PREFIX)]
