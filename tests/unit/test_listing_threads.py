"""Another user's new archives are described in that user's listing threads, not the folder owner's.

Each folder owner's listings share a few worker threads (LISTING_THREADS), so that one user's
slow listings do not take the daemon's whole pool. A listing described every archive new in its
folder in them, whoever's the archive: one user's slow archives dropped into four of root's
shared folders held root's four threads while they were described, and every listing of every
folder of root's, a calm one too, waited behind them (red team 102 F3). The listing now hands
another user's new archives to that user's threads and scans again once they are in the index.
Here the slow archives' descriptions are held on a gate: before, the calm folder's listing
waited on it.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from tests.unit.inprocess import InProcessMount, fake_session
from tests.unit.test_lookup_while_listed import GATE_SECONDS, _archive
from vfs.mount.ops import LISTING_THREADS
from vfs.mount.tree import Deferred

ATTACKER, VICTIM = 1001, 1002


def _described(m: InProcessMount, slow: Callable[[], object] | None = None) -> list[str]:
    """The names of the archives `m` describes afresh from now on, in order (the list fills
    as it goes); `slow()` runs before each whose name starts with "slow"."""
    names: list[str] = []
    fresh = m.tree._describe_fresh

    def counted(backend: object, path: Path, listed: object = None) -> object:
        names.append(path.name)
        if slow is not None and path.name.startswith("slow"):
            slow()
        return fresh(backend, path, listed)  # type: ignore[arg-type]

    m.tree._describe_fresh = counted  # type: ignore[method-assign]
    return names


@pytest.mark.parametrize(
    ("use_index", "folders_of", "archives_of"),
    [(True, 0, ATTACKER), (False, 0, ATTACKER), (True, ATTACKER, 0)],
    ids=["their-archives-in-root-s-folders", "same-no-index", "root-s-archives-in-theirs"],
)
def test_others_new_archives_do_not_hold_the_folder_owner_s_listing_threads(
    tmp_path: Path, use_index: bool, folders_of: int, archives_of: int
) -> None:
    """The slow archives of one user in another's folders take neither's own threads: not
    the folder owner's (red team 102 F3), nor the archive owner's (root's slow archive
    linked into a user's 48 folders, listed at once: tests/mount/test_redteam30.py)."""
    src = tmp_path / "src"
    slow_folders = [f"s{n}" for n in range(LISTING_THREADS)]
    for name in [*slow_folders, "calm"]:
        (src / name).mkdir(parents=True)
        (src / name).chmod(0o1777)
    for n, name in enumerate(slow_folders):
        os.chown(src / name, folders_of, folders_of)
        made, _ = _archive(tmp_path, f"{name}/slow{n}.tif", n)
        os.rename(made, src / name / made.name)
        os.chown(src / name / made.name, archives_of, archives_of)
    (src / "calm" / "v.txt").write_bytes(b"victim")
    os.chown(src / "calm" / "v.txt", VICTIM, VICTIM)
    with fake_session():
        m = InProcessMount(src, tmp_path, use_index=use_index)
        gate = threading.Event()
        held = _described(m, lambda: gate.wait(GATE_SECONDS))

        async def go() -> None:
            async with trio.open_nursery() as nursery:
                for name in slow_folders:
                    nursery.start_soon(m.listdir, name)
                while len(held) < LISTING_THREADS:  # every slow archive being described
                    await trio.sleep(0.01)
                with trio.fail_after(GATE_SECONDS / 2):
                    assert await m.listdir("calm") == ["v.txt"]
                assert not gate.is_set()
                gate.set()
            for n, name in enumerate(slow_folders):
                assert await m.listdir(name) == [f"slow{n}.tif"]
                assert len(await m.read_file(f"{name}/slow{n}.tif")) > 0

        try:
            m.run(go)
        finally:
            gate.set()
        assert sorted(held) == sorted(f"slow{n}.tif.zarr.zip" for n in range(LISTING_THREADS))


def test_a_deferring_scan_describes_none_of_another_user_s_new_archives(tmp_path: Path) -> None:
    """`scan(defer=uid)` hands over exactly the other users' archives the index does not
    hold, having described none; once `describe_each` put them in the index, it lists.
    (`leave_out`, which `_scan`'s last round asks for, leaves out such an archive instead:
    here none is, the index holding it.)"""
    src = tmp_path / "src"
    src.mkdir()
    own, _ = _archive(tmp_path, "own.tif", 1)
    theirs, theirs_bytes = _archive(tmp_path, "theirs.tif", 2)
    os.rename(own, src / own.name)
    os.rename(theirs, src / theirs.name)
    os.chown(src / theirs.name, ATTACKER, ATTACKER)
    (src / "plain.txt").write_bytes(b"x")
    m = InProcessMount(src, tmp_path, use_index=True)
    described = _described(m)
    try:
        m.tree.scan(src, defer=os.getuid())
    except Deferred as deferred:
        assert [a[0] for a in deferred.archives] == [theirs.name]
        assert described == [own.name]
        m.tree.describe_each(src, deferred.archives)
    else:
        raise AssertionError("another user's new archive was not handed over")
    assert described == [own.name, theirs.name]
    assert "theirs.tif" in m.tree.scan(src, defer=os.getuid(), handed={}, leave_out=True)
    listed = m.tree.scan(src, defer=os.getuid())
    assert set(listed) == {"own.tif", "theirs.tif", "plain.txt"}
    assert listed["theirs.tif"].size == len(theirs_bytes)
    assert described == [own.name, theirs.name]  # from the index, not described again


def test_a_scan_takes_what_was_handed_to_it_for_the_version_described(tmp_path: Path) -> None:
    """With no index, what `describe_each` made is handed to the next scan, for the archive's
    version it was made of: rewritten since, it is deferred again, or at the last round left
    out, never described in the folder owner's threads."""
    src = tmp_path / "src"
    src.mkdir()
    theirs, _ = _archive(tmp_path, "theirs.tif", 2)
    os.rename(theirs, src / theirs.name)
    os.chown(src / theirs.name, ATTACKER, ATTACKER)
    m = InProcessMount(src, tmp_path)
    try:
        m.tree.scan(src, defer=os.getuid())
    except Deferred as deferred:
        handed, _done = m.tree.describe_each(src, deferred.archives)
    else:
        raise AssertionError("another user's new archive was not handed over")
    assert "theirs.tif" in m.tree.scan(src, defer=os.getuid(), handed=handed)
    os.utime(src / theirs.name, ns=(1, 1))  # another version now
    try:
        m.tree.scan(src, defer=os.getuid(), handed=handed)
    except Deferred:
        pass
    else:
        raise AssertionError("a description of another version was taken")
    left = m.tree.scan(src, defer=os.getuid(), handed=handed, leave_out=True)
    assert "theirs.tif" not in left and theirs.name not in left


def test_links_of_an_archive_that_fails_are_parsed_once(tmp_path: Path) -> None:
    """Red team 103 F3: a user linked one broken archive 150 times into a shared folder; each
    link was parsed (each fails alone), and again at each listing after each new `ln`, which
    moves every link's ctime: 80-110 s a listing. A file's failure is known by its inode."""
    src = tmp_path / "src"
    src.mkdir()
    broken = src / "b0.zarr.zip"
    broken.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: no manifest, never served
    for n in range(1, 5):
        os.link(broken, src / f"b{n}.zarr.zip")
    m = InProcessMount(src, tmp_path)
    parsed = _described(m)
    assert len(m.tree.scan(src)) == 5  # all shown raw
    assert len(parsed) == 1
    os.link(broken, src / "b5.zarr.zip")
    assert len(m.tree.scan(src)) == 6
    assert len(parsed) == 1
    broken.write_bytes(b"PK\x05\x06" + bytes(18) + b"changed")  # another version: parsed
    assert len(m.tree.scan(src)) == 6
    assert len(parsed) == 2


def test_a_failure_known_by_inode_is_not_another_owner_s(tmp_path: Path) -> None:
    """Red team 104 F2: a user's junk file of the size and mtime of another's archive, linked
    twice, failed and was deleted; the other's `cp -p` of the archive (with a backup link)
    got the freed inode number and was shown raw. The owner is part of what is known."""
    src = tmp_path / "src"
    src.mkdir()
    m = InProcessMount(src, tmp_path)
    backend = m.tree.backends[0]
    junk = os.stat_result((0o100644, 4242, 7, 2, ATTACKER, ATTACKER, 1000, 1, 1, 1))
    m.tree._note_failed(backend, src / "junk.zarr.zip", junk)
    theirs = os.stat_result((0o100644, 4242, 7, 2, VICTIM, VICTIM, 1000, 1, 1, 2))
    assert not m.tree._known_failed(backend, src / "vscan.tif.zarr.zip", theirs)
    link = os.stat_result((0o100644, 4242, 7, 3, ATTACKER, ATTACKER, 1000, 1, 1, 3))
    assert m.tree._known_failed(backend, src / "another-link.zarr.zip", link)  # its own links


def test_a_folder_s_one_archive_does_not_wait_for_other_folders_many(tmp_path: Path) -> None:
    """Red team 104 F1: the archives of one user in all of root's folders share one pool of
    threads; a folder holding one small archive of theirs waited until four folders of thirty
    slow ones each were described (65-130 s). Threads are taken an archive (a quarter second)
    at a time, and a free one goes to the waiting folder holding fewest: the calm folder is
    listed before any of the slow ones."""
    src = tmp_path / "src"
    slow_folders = [f"s{n}" for n in range(LISTING_THREADS)]
    made, _ = _archive(tmp_path, "slow.tif", 1)
    small, small_bytes = _archive(tmp_path, "small.tif", 2)
    for name in [*slow_folders, "calm"]:
        (src / name).mkdir(parents=True)
        (src / name).chmod(0o1777)
    for name in slow_folders:
        for n in range(8):
            copy = src / name / f"slow{n}.zarr.zip"
            shutil.copyfile(made, copy)
            os.chown(copy, ATTACKER, ATTACKER)
    os.rename(small, src / "calm" / small.name)
    os.chown(src / "calm" / small.name, ATTACKER, ATTACKER)
    with fake_session():
        m = InProcessMount(src, tmp_path, use_index=True)
        _described(m, lambda: time.sleep(0.2))
        order: list[str] = []

        async def listed(name: str) -> None:
            await m.listdir(name)
            order.append(name)

        async def go() -> None:
            async with trio.open_nursery() as nursery:
                for name in slow_folders:
                    nursery.start_soon(listed, name)
                await trio.sleep(0.3)  # every slow folder's archives being described
                nursery.start_soon(listed, "calm")
            assert await m.read_file("calm/small.tif") == small_bytes

        m.run(go)
        assert order[0] == "calm", order
