"""A lookup in a folder not listed yet does not wait for the archives its first listing describes.

A folder's first listing (after a mount, or once its listing was let go) describes every archive
in it the index does not hold: a second or two each for a big one, and every time for one that
fails to describe. Every user's first lookup there waited for all of it: 30 s behind forty slow
archives another user dropped into a shared folder, after each mount. An entry the lstats of the
name find is answered now, and the listing is read behind; the kernel is told where the listing
then answers otherwise. Here one archive's description is held on a gate until the lookups are
done: before, the first lookup read the listing itself and waited on the gate.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pyfuse3
import pytest
import trio

from tests.unit.inprocess import InProcessMount, fake_session
from tests.unit.test_lookup_while_listed import GATE_SECONDS, _archive, _hold_describe
from vfs.mount import tree as tree_module

VICTIM, ATTACKER = 1002, 1001


def _shared(tmp_path: Path, owner: int) -> tuple[Path, Path]:
    """SRC, and its folder `shared` of `owner`'s, mode 1777 (anyone adds, as in /tmp)."""
    src = tmp_path / "src"
    shared = src / "shared"
    shared.mkdir(parents=True)
    os.chown(shared, owner, owner)
    shared.chmod(0o1777)
    return src, shared


def _put(archive: Path, where: Path, uid: int) -> Path:
    os.rename(archive, where)
    os.chown(where, uid, uid)
    return where


async def _quickly(m: InProcessMount, here: int, name: str) -> pyfuse3.EntryAttributes:
    """`name` looked up while the slow archive's description is held."""
    return await m.lookup(here, name)


async def _waits(m: InProcessMount, here: int, name: str) -> list[BaseException | object]:
    """Starts a lookup of `name` and says, after a moment, that it has not been answered."""
    out: list[BaseException | object] = []

    async def look() -> None:
        try:
            out.append(await m.lookup(here, name))
        except pyfuse3.FUSEError as exc:
            out.append(exc)

    m.ops.nursery.start_soon(look)  # type: ignore[union-attr]
    await trio.sleep(0.2)
    assert not out, f"{name} was answered before the listing was read"
    return out


def test_first_lookups_are_answered_while_the_first_listing_describes(tmp_path: Path) -> None:
    src, shared = _shared(tmp_path, 0)
    victim, victim_bytes = _archive(tmp_path, "victim.tif", 1)
    slow, _ = _archive(tmp_path, "slow.tif", 2)
    _put(victim, shared / victim.name, VICTIM)
    _put(slow, shared / slow.name, ATTACKER)
    (shared / "notes.txt").write_bytes(b"plain")
    (shared / "sub").mkdir()
    with fake_session():
        m = InProcessMount(src, tmp_path)
        gate, entered, waited_out = _hold_describe(m, slow.name)

        async def go() -> None:
            here = await m.resolve("shared")
            assert (await _quickly(m, here, "victim.tif")).st_size == len(victim_bytes)
            assert here not in m.ops.inodes.folders, "answered from a listing"
            await trio.to_thread.run_sync(entered.wait, GATE_SECONDS)
            assert entered.is_set(), "no listing went to describe the slow archive"
            assert await m.read_file("shared/victim.tif") == victim_bytes
            assert (await _quickly(m, here, "notes.txt")).st_size == 5
            assert (await _quickly(m, here, "sub")).st_mode & 0o040000
            missing = await _waits(m, here, "not-there.txt")  # an archive may present it
            assert not waited_out.is_set(), "a first lookup waited for the first listing"
            gate.set()
            while not missing:
                await trio.sleep(0.01)
            assert isinstance(missing[0], pyfuse3.FUSEError)
            assert missing[0].errno == errno.ENOENT
            names = set(await m.listdir("shared"))
            assert names == {"victim.tif", "slow.tif", "notes.txt", "sub"}

        try:
            m.run(go)
        finally:
            gate.set()


def test_another_user_s_entry_is_read_with_the_folder_owner_s_archives(tmp_path: Path) -> None:
    """Red team 95 F1 before any listing: the victim's `batch.zarr.zip` presents `scan.tif` in
    the victim's folder, and the attacker's `scan.tif.zarr.zip` there must not stand in for it.
    With no listing to name the victim's archive, the folder owner's archives are read with
    the lstats of another user's entry."""
    src, shared = _shared(tmp_path, VICTIM)
    scan, scan_bytes = _archive(tmp_path, "scan.tif", 1)
    spoof, spoof_bytes = _archive(tmp_path, "spoof/scan.tif", 4)
    slow, _ = _archive(tmp_path, "slow.tif", 2)
    _put(scan, shared / "batch.zarr.zip", VICTIM)
    _put(spoof, shared / "scan.tif.zarr.zip", ATTACKER)
    _put(slow, shared / slow.name, ATTACKER)
    with fake_session():
        m = InProcessMount(src, tmp_path)
        gate, _entered, waited_out = _hold_describe(m, slow.name)

        async def go() -> None:
            here = await m.resolve("shared")
            quick = await _quickly(m, here, "scan.tif")
            assert here not in m.ops.inodes.folders, "answered from a listing"
            assert not waited_out.is_set(), "the lookup waited for the first listing"
            assert (quick.st_uid, quick.st_size) == (VICTIM, len(scan_bytes))
            assert await m.read_file("shared/scan.tif") == scan_bytes
            gate.set()
            listed = set(await m.listdir("shared"))
            assert {"scan.tif", "scan.tif.zarr.zip", "slow.tif"} <= listed
            assert await m.read_file("shared/scan.tif") == scan_bytes
            # the attacker's, under its own archive name
            assert await m.read_file("shared/scan.tif.zarr.zip") == spoof_bytes

        try:
            m.run(go)
        finally:
            gate.set()


def test_another_user_s_entry_waits_where_the_owner_has_more_archives_than_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the folder owner has more archives than a lookup reads, one of the others may
    present the name: another user's entry waits for the listing."""
    monkeypatch.setattr(tree_module, "NEW_ARCHIVES_READ", 1)
    src, shared = _shared(tmp_path, VICTIM)
    for n in (1, 2):
        made, _ = _archive(tmp_path, f"own{n}.tif", 10 + n)
        _put(made, shared / made.name, VICTIM)
    slow, _ = _archive(tmp_path, "slow.tif", 2)
    _put(slow, shared / slow.name, ATTACKER)
    (shared / "theirs.txt").write_bytes(b"attacker")
    os.chown(shared / "theirs.txt", ATTACKER, ATTACKER)
    with fake_session():
        m = InProcessMount(src, tmp_path)
        gate, _entered, waited_out = _hold_describe(m, slow.name)

        async def go() -> None:
            here = await m.resolve("shared")
            assert (await _quickly(m, here, "own1.tif")).st_uid == VICTIM  # the owner's
            assert not waited_out.is_set(), "the owner's entry waited for the first listing"
            theirs = await _waits(m, here, "theirs.txt")
            gate.set()
            while not theirs:
                await trio.sleep(0.01)
            assert getattr(theirs[0], "st_size", None) == len(b"attacker")

        try:
            m.run(go)
        finally:
            gate.set()


def test_an_answer_the_first_listing_gives_otherwise_is_dropped_from_the_kernel(
    tmp_path: Path,
) -> None:
    """Each answer given before the first listing is kept, and dropped from the kernel when the
    listing answers otherwise: with no listing before it, the listing's own changes tell the
    kernel nothing. (The rules that decide a name give the lstats' answer where the folder
    holds still; here the listing is made to leave the name out, as a change racing it can.)"""
    src, shared = _shared(tmp_path, 0)
    data, data_bytes = _archive(tmp_path, "data.tif", 1)
    slow, _ = _archive(tmp_path, "slow.tif", 2)
    _put(data, shared / data.name, VICTIM)
    _put(slow, shared / slow.name, ATTACKER)
    with fake_session() as session:
        m = InProcessMount(src, tmp_path)
        gate, _entered, waited_out = _hold_describe(m, slow.name)
        scan = m.tree.scan

        def racing(folder: Path, *args: Any, **kwargs: Any) -> dict[str, Any]:
            out = scan(folder, *args, **kwargs)
            if folder == shared:
                out.pop("data.tif", None)
            return out

        m.tree.scan = racing  # type: ignore[method-assign]

        async def go() -> None:
            here = await m.resolve("shared")
            assert (await _quickly(m, here, "data.tif")).st_size == len(data_bytes)
            assert here not in m.ops.inodes.folders, "answered from a listing"
            assert not waited_out.is_set(), "the lookup waited for the first listing"
            assert (here, b"data.tif") not in session.invalidated
            gate.set()
            while here in m.ops._relisting:
                await trio.sleep(0.01)
            assert (here, b"data.tif") in session.invalidated
            assert here not in m.ops._answered
            assert "data.tif" not in m.ops.inodes.folders[here].children  # listed, without it

        try:
            m.run(go)
        finally:
            gate.set()


def test_past_the_listings_read_behind_a_first_lookup_reads_the_listing_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """First listings read behind lookups are bounded (UNLISTED_BEHIND): past it a first
    lookup waits for the listing, as every one did before, not queue one more behind."""
    from vfs.mount import ops as ops_module

    monkeypatch.setattr(ops_module, "UNLISTED_BEHIND", 0)
    src, shared = _shared(tmp_path, 0)
    victim, victim_bytes = _archive(tmp_path, "victim.tif", 1)
    slow, _ = _archive(tmp_path, "slow.tif", 2)
    _put(victim, shared / victim.name, VICTIM)
    _put(slow, shared / slow.name, ATTACKER)
    with fake_session():
        m = InProcessMount(src, tmp_path)
        gate, _entered, _ = _hold_describe(m, slow.name)

        async def go() -> None:
            here = await m.resolve("shared")
            found = await _waits(m, here, "victim.tif")
            assert not m.ops._relisting, "a listing was queued behind past the bound"
            gate.set()
            while not found:
                await trio.sleep(0.01)
            assert getattr(found[0], "st_size", None) == len(victim_bytes)

        try:
            m.run(go)
        finally:
            gate.set()
