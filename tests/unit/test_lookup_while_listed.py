"""A lookup in a folder whose listing is read again does not wait for the new archives in it.

Red team 87 F4: forty archives of 25,000 members each renamed into a shared folder took the
folder's next listing ~2 s an archive to describe, and every other user's lookup there (`stat
mnt/v2`, opening their own file) waited for all of it: 78 s. A name found by a few lstats is
answered while the listing goes on in the background. Here the new archive's description is
held on a gate until the lookups are done: before, the first lookup after the change read the
listing itself and waited on the gate.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyfuse3
import pytest
import tifffile
import trio

from tests.unit.inprocess import InProcessMount, fake_session
from vfs.decant.packer import PackOptions, pack_file
from vfs.mount.inodes import ROOT_INODE

GATE_SECONDS = 5.0  # how long a held description waits before going on by itself


def _archive(tmp_path: Path, name: str, seed: int) -> tuple[Path, bytes]:
    tiff = tmp_path / "made" / name
    tiff.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 4096, (16, 24), dtype=np.uint16)
    tifffile.imwrite(tiff, pixels)
    archive = tmp_path / "made" / f"{name}.zarr.zip"
    pack_file(tiff, archive, PackOptions())
    return archive, tiff.read_bytes()


def _victim_and_slow(tmp_path: Path) -> tuple[Path, bytes, Path, bytes]:
    """SRC holding the victim's `victim.tif.zarr.zip`; the archive of `slow.tif`, made aside
    to be dropped in (and its original's bytes)."""
    src = tmp_path / "src"
    src.mkdir()
    victim, victim_bytes = _archive(tmp_path, "victim.tif", 1)
    slow, slow_bytes = _archive(tmp_path, "slow.tif", 2)
    os.rename(victim, src / victim.name)
    return src, victim_bytes, slow, slow_bytes


def _dropped(folder: Path, archive: Path, name: str) -> None:
    """`archive` renamed into `folder` as `name`, the folder's mtime surely moved on."""
    before = os.stat(folder).st_mtime_ns
    os.rename(archive, folder / name)
    os.utime(folder, ns=(before + 10**9, before + 10**9))


async def _listed_then_changed(
    m: InProcessMount, session: Any, src: Path, slow: Path
) -> pyfuse3.EntryAttributes:
    """`victim.tif` looked up (the folder listed: behind it, `_unlisted`), then the slow
    archive dropped in and the listing let fall due: what the victim's first lookup gave."""
    attrs = await m.lookup(ROOT_INODE, "victim.tif")
    while ROOT_INODE in m.ops._relisting or ROOT_INODE not in m.ops.inodes.folders:
        await trio.sleep(0.01)
    _dropped(src, slow, slow.name)
    session.clock.advance(5)
    return attrs


def _hold_describe(
    m: InProcessMount, name: str
) -> tuple[threading.Event, threading.Event, threading.Event]:
    """The archive `name` is described only once the gate opens (or GATE_SECONDS pass):
    (gate, entered: its description began, waited_out: it went on without the gate)."""
    gate, entered, waited_out = threading.Event(), threading.Event(), threading.Event()
    described = m.tree._describe_fresh

    def held(backend: Any, path: Path, listed: Any = None) -> Any:
        if path.name == name:
            entered.set()
            if not gate.wait(GATE_SECONDS):
                waited_out.set()
        return described(backend, path, listed)

    m.tree._describe_fresh = held  # type: ignore[method-assign]
    return gate, entered, waited_out


def test_lookups_are_answered_while_a_new_archive_is_described(tmp_path: Path) -> None:
    src, victim_bytes, slow, slow_bytes = _victim_and_slow(tmp_path)
    (src / "v2").mkdir()
    (src / "notes.txt").write_bytes(b"plain")

    with fake_session() as session:
        m = InProcessMount(src, tmp_path)
        gate, entered, waited_out = _hold_describe(m, slow.name)

        async def go() -> None:
            attrs = await _listed_then_changed(m, session, src, slow)
            assert attrs.st_size == len(victim_bytes)

            assert (await m.lookup(ROOT_INODE, "v2")).st_mode & 0o040000
            await trio.to_thread.run_sync(entered.wait, GATE_SECONDS)
            assert entered.is_set(), "the listing never went to describe the new archive"
            # The listing is held on the new archive now: other names are answered anyway.
            session.clock.advance(5)
            assert (await m.lookup(ROOT_INODE, "notes.txt")).st_size == 5
            assert await m.read_file("victim.tif") == victim_bytes
            with pytest.raises(pyfuse3.FUSEError) as missing:  # what rsync asks before a create
                await m.lookup(ROOT_INODE, "not-there.txt")
            assert missing.value.errno == errno.ENOENT
            assert not waited_out.is_set(), "a lookup waited for the new archive's description"

            # The new archive's own name waits for its description; then it is there.
            async with trio.open_nursery() as nursery:
                found: list[pyfuse3.EntryAttributes] = []

                async def look() -> None:
                    found.append(await m.lookup(ROOT_INODE, "slow.tif"))

                nursery.start_soon(look)
                await trio.sleep(0.2)
                assert not found
                gate.set()
            assert found[0].st_size == len(slow_bytes)
            assert await m.read_file("slow.tif") == slow_bytes
            names = {name for name, _ in await m.readdir(ROOT_INODE)}
            assert {"victim.tif", "slow.tif", "v2", "notes.txt"} <= names

        try:
            m.run(go)
        finally:
            gate.set()


def test_lookups_are_answered_while_the_watcher_describes_new_archives(tmp_path: Path) -> None:
    """The watcher's word of new names takes the folder's lock to describe their archives:
    a lookup of another name does not wait for it either."""
    src, victim_bytes, slow, _ = _victim_and_slow(tmp_path)
    (src / "notes.txt").write_bytes(b"plain")
    with fake_session() as session:
        m = InProcessMount(src, tmp_path)
        gate, entered, waited_out = _hold_describe(m, slow.name)

        async def go() -> None:
            assert (await m.lookup(ROOT_INODE, "notes.txt")).st_size == 5
            _dropped(src, slow, slow.name)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(m.ops.on_names_changed, {src: {slow.name}})
                await trio.to_thread.run_sync(entered.wait, GATE_SECONDS)
                assert entered.is_set(), "the watcher's word never described the new archive"
                session.clock.advance(5)
                assert await m.read_file("victim.tif") == victim_bytes
                assert (await m.lookup(ROOT_INODE, "notes.txt")).st_size == 5
                assert not waited_out.is_set(), "a lookup waited for the watcher's describe"
                gate.set()
            assert "slow.tif" in {name for name, _ in await m.readdir(ROOT_INODE)}

        try:
            m.run(go)
        finally:
            gate.set()


def test_lookups_are_answered_while_a_readdir_describes_new_archives(tmp_path: Path) -> None:
    """Red team 93 F1: a listing a readdir started held the folder's lock while it described
    the new archives, and lookups waited for all of it (30 s)."""
    src, victim_bytes, slow, _ = _victim_and_slow(tmp_path)
    with fake_session() as session:
        m = InProcessMount(src, tmp_path)
        gate, entered, waited_out = _hold_describe(m, slow.name)

        async def go() -> None:
            first = await _listed_then_changed(m, session, src, slow)
            listed: list[set[str]] = []
            assert first.st_size == len(victim_bytes)

            async def list_all() -> None:
                listed.append({name for name, _ in await m.readdir(ROOT_INODE)})

            async with trio.open_nursery() as nursery:
                nursery.start_soon(list_all)
                await trio.to_thread.run_sync(entered.wait, GATE_SECONDS)
                assert entered.is_set(), "the readdir never described the new archive"
                assert await m.read_file("victim.tif") == victim_bytes
                with pytest.raises(pyfuse3.FUSEError):
                    await m.lookup(ROOT_INODE, "not-there.txt")
                assert not waited_out.is_set(), "a lookup waited for the readdir's listing"
                gate.set()
            assert listed == [{"victim.tif", "slow.tif"}]

        try:
            m.run(go)
        finally:
            gate.set()


def test_where_an_archive_presents_another_name_a_lookup_answers_as_the_listing_does(
    tmp_path: Path,
) -> None:
    """Red team 95 F1: the victim's `batch.zarr.zip` presents `scan.tif` in the victim's
    folder; the attacker drops its own `scan.tif.zarr.zip` there while slow archives keep the
    listing busy. The lstats found only the attacker's archive, the lookup answered it, and
    the kernel kept it for every user (the listing, which gives the name to the victim's
    archive, had nothing to invalidate). The archive the last listing gave the name to is now
    read with the lstats: each name is answered at once, as the listing then answers it
    (red team 93 F2: before, every lookup in such a folder waited for the listing)."""
    victim_uid, attacker_uid = 1002, 1001
    src = tmp_path / "src"
    shared = src / "shared"
    shared.mkdir(parents=True)
    os.chown(shared, victim_uid, victim_uid)
    shared.chmod(0o1777)
    scan, scan_bytes = _archive(tmp_path, "scan.tif", 1)
    spoof, _ = _archive(tmp_path, "spoof/scan.tif", 4)
    slow, _ = _archive(tmp_path, "slow.tif", 2)
    os.rename(scan, shared / "batch.zarr.zip")
    os.chown(shared / "batch.zarr.zip", victim_uid, victim_uid)
    (shared / "notes.txt").write_bytes(b"plain")
    names = ["scan.tif", "scan.tif.zarr.zip", "batch.zarr.zip", "notes.txt", "nothing.txt"]
    with fake_session() as session:
        m = InProcessMount(src, tmp_path)
        gate, entered, waited_out = _hold_describe(m, slow.name)

        async def answers(here: int) -> dict[str, tuple[int, int, int] | None]:
            out: dict[str, tuple[int, int, int] | None] = {}
            for name in names:
                try:
                    a = await m.lookup(here, name)
                except pyfuse3.FUSEError as exc:
                    assert exc.errno == errno.ENOENT
                    out[name] = None
                else:
                    out[name] = (a.st_uid, a.st_size, a.st_mode)
            return out

        async def go() -> None:
            here = await m.resolve("shared")
            assert (await m.lookup(here, "scan.tif")).st_uid == victim_uid
            before = os.stat(shared).st_mtime_ns
            os.rename(slow, shared / slow.name)
            os.rename(spoof, shared / "scan.tif.zarr.zip")
            os.chown(shared / "scan.tif.zarr.zip", attacker_uid, attacker_uid)
            os.utime(shared, ns=(before + 10**9, before + 10**9))
            session.clock.advance(5)
            await m.lookup(here, "notes.txt")  # the listing goes on behind it
            await trio.to_thread.run_sync(entered.wait, GATE_SECONDS)
            assert entered.is_set(), "the listing never went to describe the new archive"
            quick = await answers(here)
            assert not waited_out.is_set(), "a lookup in such a folder waited for the listing"
            gate.set()
            while here in m.ops._relisting:
                await trio.sleep(0.01)
            session.clock.advance(5)
            listed = await answers(here)
            assert quick == listed
            assert quick["scan.tif.zarr.zip"] is not None
            assert quick["scan.tif.zarr.zip"][0] == attacker_uid
            assert quick["scan.tif"] is not None and quick["scan.tif"][0] == victim_uid
            assert await m.read_file("shared/scan.tif") == scan_bytes

        try:
            m.run(go)
        finally:
            gate.set()


def test_an_answer_the_listing_does_not_change_is_dropped_from_the_kernel(
    tmp_path: Path,
) -> None:
    """A lookup answered by lstats otherwise than the listing read before it, where the
    listing read after it answers as before: nothing in the listing changed, so only the
    record of the answer tells the kernel to drop it. (Here the lstats are made to miss an
    existing name, as a presenting archive unknown to them would.)"""
    src, victim_bytes, slow, _ = _victim_and_slow(tmp_path)
    with fake_session() as session:
        m = InProcessMount(src, tmp_path)
        real = m.tree.entries_of_listed

        def missing_once(folder: Path, names: Any, listed: Any, quick: bool = False,
                         also: Any = ()) -> Any:  # fmt: skip
            m.tree.entries_of_listed = real  # type: ignore[method-assign]
            return {name: None for name in names}, True

        async def go() -> None:
            await _listed_then_changed(m, session, src, slow)
            session.invalidated.clear()
            m.tree.entries_of_listed = missing_once  # type: ignore[method-assign]
            with pytest.raises(pyfuse3.FUSEError):
                await m.lookup(ROOT_INODE, "victim.tif")
            while ROOT_INODE in m.ops._relisting:
                await trio.sleep(0.01)
            assert (ROOT_INODE, b"victim.tif") in session.invalidated
            assert await m.read_file("victim.tif") == victim_bytes

        m.run(go)


def test_a_name_shown_only_by_the_listing_appears_once_it_is_read(tmp_path: Path) -> None:
    """An archive presenting a name other than its own (packed from `a.tif`, renamed to
    `b.zarr.zip`) shows that name only in the listing. In a folder whose last listing had no
    such archive, a lookup not found by lstats is answered ENOENT at once; the listing read
    behind it tells the kernel the name is there now, and it is found."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "notes.txt").write_bytes(b"plain")
    archive, data = _archive(tmp_path, "a.tif", 3)
    with fake_session() as session:
        m = InProcessMount(src, tmp_path)

        async def go() -> None:
            assert (await m.lookup(ROOT_INODE, "notes.txt")).st_size == 5
            _dropped(src, archive, "b.zarr.zip")
            session.clock.advance(5)
            session.invalidated.clear()
            try:
                await m.lookup(ROOT_INODE, "a.tif")
            except pyfuse3.FUSEError as exc:
                assert exc.errno == errno.ENOENT
                while ROOT_INODE in m.ops._relisting:  # the listing behind it
                    await trio.sleep(0.01)
                assert (ROOT_INODE, b"a.tif") in session.invalidated
            attrs = await m.lookup(ROOT_INODE, "a.tif")
            assert attrs.st_size == len(data)
            assert await m.read_file("a.tif") == data

        m.run(go)


def test_a_new_entry_not_the_folder_owner_s_is_read_with_the_owner_s_new_archives(
    tmp_path: Path,
) -> None:
    """Red team 100 R2: in the victim's folder, the victim's new `vb2.zarr.zip` presents
    `vscan.tif`, and the attacker drops a plain `vscan.tif` at once, while slow archives keep
    the listing busy. The lstats of `vscan.tif` found only the attacker's file (the new
    archive is named otherwise), and the victim's `sha256sum` read the attacker's bytes until
    the listing, which gives the name to the folder owner's archive, was done (30 s). Such a
    lookup now reads the folder owner's archives new since the listing with it, and does not
    wait for the listing (red team 101 F1: waiting, a user's lookups of their own new files
    held every request task of the mount, 63 s)."""
    victim_uid, attacker_uid = 1002, 1001
    src = tmp_path / "src"
    mine = src / "vown"
    mine.mkdir(parents=True)
    os.chown(mine, victim_uid, victim_uid)
    mine.chmod(0o1777)
    (mine / "notes.txt").write_bytes(b"plain")
    vscan, vscan_bytes = _archive(tmp_path, "vscan.tif", 5)
    slow, _ = _archive(tmp_path, "slow.tif", 2)
    with fake_session() as session:
        m = InProcessMount(src, tmp_path)
        gate, entered, waited_out = _hold_describe(m, slow.name)

        async def go() -> None:
            here = await m.resolve("vown")
            assert (await m.lookup(here, "notes.txt")).st_uid == 0
            before = os.stat(mine).st_mtime_ns
            os.rename(slow, mine / slow.name)
            os.rename(vscan, mine / "vb2.zarr.zip")
            os.chown(mine / "vb2.zarr.zip", victim_uid, victim_uid)
            (mine / "vscan.tif").write_bytes(b"the attacker's bytes")
            os.chown(mine / "vscan.tif", attacker_uid, attacker_uid)
            os.utime(mine, ns=(before + 10**9, before + 10**9))
            session.clock.advance(5)
            async with trio.open_nursery() as nursery:
                found: list[pyfuse3.EntryAttributes] = []

                async def look() -> None:
                    found.append(await m.lookup(here, "vscan.tif"))

                nursery.start_soon(look)
                await trio.to_thread.run_sync(entered.wait, GATE_SECONDS)
                with trio.fail_after(GATE_SECONDS / 2):
                    while not found:
                        await trio.sleep(0.01)
                gate.set()
            assert not waited_out.is_set(), "the lookup waited for the listing"
            assert found[0].st_uid == victim_uid
            assert await m.read_file("vown/vscan.tif") == vscan_bytes

        try:
            m.run(go)
        finally:
            gate.set()
