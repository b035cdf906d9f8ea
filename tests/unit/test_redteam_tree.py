"""A user who may write a folder of SRC fills it with files named like archives that are not
(a few bytes each) and then touches the folder every second: every rescan must not open and
parse every one of them again (CPU the whole mount shares), as long as none of them changed."""

from __future__ import annotations

import os
from pathlib import Path

from vfs.backends.decant import DecantBackend
from vfs.cache import PageCache
from vfs.mount.tree import SourceTree


class Counting(DecantBackend):
    def __init__(self) -> None:
        super().__init__(PageCache(1 << 20))
        self.described = 0

    def describe(self, path: Path):  # type: ignore[no-untyped-def]
        self.described += 1
        return super().describe(path)

    def describe_listed(self, path: Path, listed):  # type: ignore[no-untyped-def]
        self.described += 1  # what a listing describes: the archive it found, by its version
        return super().describe_listed(path, listed)


def test_a_broken_archive_is_not_described_again_until_it_changes(tmp_path: Path) -> None:
    for i in range(50):
        (tmp_path / f"junk{i}.tif.zarr.zip").write_bytes(b"not a zip")
    backend = Counting()
    tree = SourceTree(tmp_path, [backend])
    first = tree.scan(tmp_path)
    assert backend.described == 50 and len(first) == 50  # shown raw, each described once
    (tmp_path / "touch").write_bytes(b"")  # the folder changed: the mount rescans it
    assert set(tree.scan(tmp_path)) == set(first) | {"touch"}
    assert backend.described == 50, "unchanged broken archives were described again"
    changed = tmp_path / "junk0.tif.zarr.zip"
    changed.write_bytes(b"still not a zip, but new")
    os.utime(changed, ns=(1, 1))
    tree.scan(tmp_path)
    assert backend.described == 51  # a changed one is looked at again


# -- red team 80 F1: another user's archive does not hide an entry of the name it presents ----

VICTIM, ATTACKER = 1002, 1001


def _archive(tmp: Path, at: Path, name: str, data: bytes, uid: int) -> None:
    from vfs.decant.packer import PackOptions, pack_file

    original = tmp / name
    original.write_bytes(data)
    pack_file(original, at, PackOptions(mode="verbatim"))
    os.chown(at, uid, uid)


def _shared(tmp: Path, owner: int) -> Path:
    """A sticky folder anyone may add to, as a site's drop folder, with the victim's
    `notes.txt` and folder `data/`, and the attacker's archives presenting both names."""
    src = tmp / "src"
    shared = src / "shared"
    shared.mkdir(parents=True)
    os.chown(shared, owner, owner)
    shared.chmod(0o1777)
    (shared / "notes.txt").write_bytes(b"the victim's notes\n")
    (shared / "data").mkdir()
    (shared / "data" / "inner.txt").write_bytes(b"inner\n")
    for path in (shared / "notes.txt", shared / "data", shared / "data" / "inner.txt"):
        os.chown(path, VICTIM, VICTIM)
    made = tmp / "made"
    made.mkdir()
    _archive(made, shared / "notes.txt.zarr.zip", "notes.txt", b"ATTACKER\n", ATTACKER)
    _archive(made, shared / "data.zarr.zip", "data", b"ATTACKER\n", ATTACKER)
    return shared


def test_another_user_s_archive_hides_no_entry_in_a_folder_it_does_not_own(
    tmp_path: Path,
) -> None:
    """In root's 1777 folder the attacker's archives presented `notes.txt` and `data`, which
    the victim's file and folder hold: the victim's entries were not shown, the attacker's
    bytes were served under their names. Now both keep their names; the archives are shown
    under their own (the rule for two users' archives presenting one name)."""
    shared = _shared(tmp_path, owner=0)
    shown = SourceTree(tmp_path / "src", [DecantBackend(PageCache(1 << 20))]).scan(shared)
    assert shown["notes.txt"].uid == VICTIM and shown["notes.txt"].backend is None
    assert shown["data"].uid == VICTIM and shown["data"].is_dir and shown["data"].backend is None
    assert shown["notes.txt.zarr.zip"].backend is not None  # the attacker's, named as it is
    assert shown["data.zarr.zip"].backend is not None


def test_the_folder_owner_s_archive_keeps_its_name_over_another_user_s_entry(
    tmp_path: Path,
) -> None:
    """Red team 2 G still holds: in the archive owner's own shared folder another user's
    entry of the name the archive presents does not stand in for its original."""
    shared = _shared(tmp_path, owner=ATTACKER)  # the archives' owner owns the folder now
    shown = SourceTree(tmp_path / "src", [DecantBackend(PageCache(1 << 20))]).scan(shared)
    assert shown["notes.txt"].uid == ATTACKER and shown["notes.txt"].backend is not None
    assert "notes.txt.zarr.zip" not in shown


# -- red team 93: a copy of a user's archive under another name does not take its name away --


def _presenting(tmp: Path, owner: int, victim_as: str, copy_as: str) -> Path:
    """Root's (or `owner`'s) 1777 folder holding the victim's archive of `victim.tif` at
    `victim_as` and the attacker's copy of it at `copy_as`, both readable by all."""
    shared = tmp / "src" / "shared"
    shared.mkdir(parents=True)
    os.chown(shared, owner, owner)
    shared.chmod(0o1777)
    made = tmp / "made"
    made.mkdir()
    _archive(made, shared / victim_as, "victim.tif", b"the victim's image\n", VICTIM)
    (shared / copy_as).write_bytes((shared / victim_as).read_bytes())
    os.chown(shared / copy_as, ATTACKER, ATTACKER)
    for name in (victim_as, copy_as):
        (shared / name).chmod(0o644)
    return shared


def test_a_copy_under_another_name_does_not_take_the_name_from_its_owner(tmp_path: Path) -> None:
    """In root's shared folder the attacker's copy `zz.zarr.zip` presented `victim.tif` too:
    both archives lost the name (two users' archives presenting one), and the victim's every
    open of `victim.tif` got ENOENT. An archive named after the name keeps it; the copy is
    shown under its own name."""
    shared = _presenting(tmp_path, 0, "victim.tif.zarr.zip", "zz.zarr.zip")
    shown = SourceTree(tmp_path / "src", [DecantBackend(PageCache(1 << 20))]).scan(shared)
    assert shown["victim.tif"].uid == VICTIM and shown["victim.tif"].backend is not None
    assert shown["zz.zarr.zip"].uid == ATTACKER
    assert set(shown) == {"victim.tif", "zz.zarr.zip"}


def test_a_copy_sorted_first_does_not_take_the_name_from_a_folder_archive(tmp_path: Path) -> None:
    """Of a `victim.tif.zarr/` folder archive and a copy named `aaa.zarr.zip`, the one sorted
    first by name took the name: the one named after it goes first."""
    shared = _presenting(tmp_path, 0, "victim.tif.zarr.zip", "aaa.zarr.zip")
    folder = shared / "victim.tif.zarr"
    folder.mkdir()
    import zipfile

    with zipfile.ZipFile(shared / "victim.tif.zarr.zip") as zf:
        zf.extractall(folder)
    (shared / "victim.tif.zarr.zip").unlink()
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, VICTIM, VICTIM)
    shown = SourceTree(tmp_path / "src", [DecantBackend(PageCache(1 << 20))]).scan(shared)
    assert shown["victim.tif"].uid == VICTIM
    assert shown["aaa.zarr.zip"].uid == ATTACKER


def test_the_folder_owner_s_copy_under_another_name_still_contests(tmp_path: Path) -> None:
    """The folder owner's archive presenting a name keeps it over another user's named after
    it (tests/mount/test_hidden_names.py): the rule above is for other users' copies."""
    shared = _presenting(tmp_path, ATTACKER, "victim.tif.zarr.zip", "zz.zarr.zip")
    shown = SourceTree(tmp_path / "src", [DecantBackend(PageCache(1 << 20))]).scan(shared)
    assert shown["victim.tif"].uid == ATTACKER  # the folder's owner's copy
    assert shown["victim.tif.zarr.zip"].uid == VICTIM
