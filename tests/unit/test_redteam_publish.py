"""Publishing builds a file at a temp name, then gives it the spooled file's mode, owner and
mtime (`apply_metadata`). With the spool's staging folder on another filesystem than the target
folder, that temp name sits in the target folder, which its owner (the writer) may rename
entries of: swapped for a symlink between the copy and `apply_metadata`, the daemon (root)
would chmod and chown the link's target to the writer. It must act on the file, never a link."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from vfs.ingest.publish import apply_metadata, publish, sync_placed
from vfs.ingest.spool import Spool


def test_apply_metadata_never_follows_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's\n")
    victim.chmod(0o600)
    before = victim.stat()
    spooled = tmp_path / "spooled"
    spooled.write_bytes(b"the writer's\n")
    spooled.chmod(0o666)
    os.utime(spooled, ns=(1, 1))
    staged = tmp_path / ".decant-tmp-staged"
    staged.symlink_to(victim)  # swapped in by the folder's owner
    with pytest.raises(OSError):
        apply_metadata(staged, spooled.stat())
    after = victim.stat()
    assert stat.S_IMODE(after.st_mode) == 0o600
    assert after.st_mtime_ns == before.st_mtime_ns


def test_apply_metadata_never_changes_a_hard_link_of_another_file(tmp_path: Path) -> None:
    """The writer, owning the folder, swaps the copy for a hard link of another file (where
    fs.protected_hardlinks allows it): the file made there is the daemon's, of one name."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's\n")
    victim.chmod(0o600)
    spooled = tmp_path / "spooled"
    spooled.write_bytes(b"the writer's\n")
    spooled.chmod(0o666)
    staged = tmp_path / ".decant-tmp-staged"
    os.link(victim, staged)
    with pytest.raises(OSError, match="not the file made here"):
        apply_metadata(staged, spooled.stat())
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600


def test_apply_metadata_sets_a_regular_file(tmp_path: Path) -> None:
    spooled = tmp_path / "spooled"
    spooled.write_bytes(b"x")
    spooled.chmod(0o640)
    os.utime(spooled, ns=(10**18, 2 * 10**18))
    staged = tmp_path / "staged"
    staged.write_bytes(b"x")
    apply_metadata(staged, spooled.stat())
    st = staged.stat()
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_mtime_ns == 2 * 10**18


def _spool(tmp_path: Path) -> Spool:
    src = tmp_path / "src"
    src.mkdir()
    return Spool(src, src / ".decant-spool" / "files")


def test_publish_makes_no_folder_through_a_link_in_src(tmp_path: Path) -> None:
    """A file dropped into an inbox's new subfolder `in/run/x`: SRC has no `in/run` yet, and a
    user who owns `in` made it a link to root's folder. Making `run` for the publish must not
    make it (as root) in the link's target, nor place the file there."""
    spool = _spool(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (spool.src / "in").symlink_to(outside)
    spooled = spool.path("in/run/x")
    spooled.parent.mkdir(parents=True)
    spooled.write_bytes(b"the user's\n")
    with pytest.raises(OSError):
        publish(spool, "in/run/x", False, None)
    assert os.listdir(outside) == []


def test_publish_makes_missing_folders_below_src(tmp_path: Path) -> None:
    spool = _spool(tmp_path)
    spooled = spool.path("a/b/x")
    spooled.parent.mkdir(parents=True)
    spooled.write_bytes(b"plain\n")
    published = publish(spool, "a/b/x", False, None)
    assert published.target == spool.src / "a/b/x"
    assert (spool.src / "a/b/x").read_bytes() == b"plain\n"


def test_sync_placed_opens_no_link(tmp_path: Path) -> None:
    """A placed archive renamed away and a link put in its place before the batch's fsync:
    the daemon must not open the link's target as root (a FIFO would hang the worker, a
    device would be opened)."""
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    outside = tmp_path / "root-only"
    outside.write_bytes(b"root's\n")
    (src / "d" / "x.zarr.zip").symlink_to(outside)
    # Not opened: reported as gone from its name (its spooled copy stays; round 36a: it
    # used to raise, failing the whole batch of everyone's files).
    assert sync_placed(src, [src / "d" / "x.zarr.zip"]) == {src / "d" / "x.zarr.zip"}
    (src / "d" / "x.zarr.zip").unlink()
    (src / "d" / "x.zarr.zip").write_bytes(b"placed")
    assert sync_placed(src, [src / "d" / "x.zarr.zip"]) == set()
    (src / "d").rename(src / "e")
    (src / "d").symlink_to(src / "e")  # a folder on the way swapped for a link
    assert sync_placed(src, [src / "d" / "x.zarr.zip"]) == {src / "d" / "x.zarr.zip"}


def _swapped(tmp_path: Path) -> tuple[Spool, bytes]:
    """A spooled `sub/inside.txt` whose folder its owner swapped for a link to root's folder
    holding a file of that name, after the queue found it (red team 2, finding B)."""
    spool = _spool(tmp_path)
    (spool.files / "sub").mkdir(parents=True)
    (spool.files / "sub" / "inside.txt").write_bytes(b"the user's\n")
    vault = tmp_path / "vault"
    vault.mkdir(mode=0o700)
    secret = b"root's file, in a 0700 folder\n"
    (vault / "inside.txt").write_bytes(secret)
    (spool.files / "sub").rename(spool.files / "sub.old")
    (spool.files / "sub").symlink_to(vault)
    (spool.src / "sub").mkdir()
    return spool, secret


def test_publish_reaches_the_spooled_file_without_links(tmp_path: Path) -> None:
    spool, _secret = _swapped(tmp_path)
    with pytest.raises(OSError):
        publish(spool, "sub/inside.txt", False, None)
    assert not (spool.src / "sub" / "inside.txt").exists()
    assert (tmp_path / "vault" / "inside.txt").stat().st_nlink == 1  # linked nowhere


def test_linking_into_place_follows_no_link_swapped_in_after_the_check(tmp_path: Path) -> None:
    """The swap lands between publish's check and the link: the link is made through the
    descriptor of the file found below the spool's root, never through the path."""
    from vfs.ingest.publish import _link_into_place

    spool, _secret = _swapped(tmp_path)
    final = spool.src / "sub" / "inside.txt"
    with pytest.raises(OSError):
        _link_into_place(spool, "sub/inside.txt", spool.path("sub/inside.txt"), final,
                         final.with_name("inside.txt.zarr.zip"))  # fmt: skip
    assert not final.exists()
    assert (tmp_path / "vault" / "inside.txt").stat().st_nlink == 1


def test_a_plain_file_is_linked_as_the_spooled_inode(tmp_path: Path) -> None:
    spool = _spool(tmp_path)
    (spool.files / "run").mkdir(parents=True)
    (spool.files / "run" / "x.csv").write_bytes(b"a,b\n")
    published = publish(spool, "run/x.csv", False, None)
    assert published.mode == "plain"
    assert os.path.samestat(os.stat(spool.src / "run" / "x.csv"), spool.path("run/x.csv").stat())


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
@pytest.mark.parametrize("name", ["x.csv", "z.tif.zarr.zip"])
def test_nothing_is_published_over_an_entry_the_mount_does_not_show(
    tmp_path: Path, corpus: dict[str, Path], kind: str, name: str
) -> None:
    """In a sticky folder a user creates, through the mount, a file under a name that holds
    root's symlink or FIFO (the mount shows neither, so the kernel let the create through):
    publishing it must not replace root's entry (plain files by link, archives by rename)."""
    spool = _spool(tmp_path)
    (spool.src / "run").mkdir()
    target = spool.src / "run" / name
    if kind == "symlink":
        target.symlink_to("/etc/hostname")
    else:
        os.mkfifo(target)
    (spool.files / "run").mkdir(parents=True)
    spooled = spool.files / "run" / name.removesuffix(".zarr.zip")
    if name.endswith(".zarr.zip"):
        spooled.write_bytes(corpus["zstack_u16.tif"].read_bytes())
    else:
        spooled.write_bytes(b"a,b\n")
    with pytest.raises(FileExistsError, match="does not show"):
        publish(spool, f"run/{spooled.name}", False, None)
    st = os.lstat(target)
    assert stat.S_ISLNK(st.st_mode) if kind == "symlink" else stat.S_ISFIFO(st.st_mode)
