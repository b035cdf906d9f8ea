"""A change made through the mount in a folder whose listing is read does not wait for it.

Red team 95 F2: every create, rename, unlink or mkdir through the mount read the folder's
whole listing under its lock, describing every archive new in it (a second or two each), and
the kernel holds the folder for the change meanwhile, so one `touch` by anyone made every
user's lookups there wait too: 32 s behind forty archives of 25,000 members. A change now
reads only its own names, and a listing is read before the folder's lock is taken. Here the
new archive's description is held on a gate: before, each change waited on it.
"""

from __future__ import annotations

import os
import stat
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyfuse3
import trio

from tests.unit.inprocess import InProcessMount, Token, fake_session
from tests.unit.test_lookup_while_listed import (
    GATE_SECONDS,
    _dropped,
    _hold_describe,
    _listed_then_changed,
    _victim_and_slow,
)
from vfs.mount.inodes import ROOT_INODE


@dataclass
class _Held:
    """A mount whose description of one archive is held on a gate (`_hold_describe`)."""

    m: InProcessMount
    session: Any
    gate: threading.Event
    entered: threading.Event
    waited_out: threading.Event


def _with_held(src: Path, tmp_path: Path, name: str,
               go: Callable[[_Held], Awaitable[None]]) -> None:  # fmt: skip
    """`go` run in an in-process mount of `src` whose description of `name` is held."""
    with fake_session() as session:
        m = InProcessMount(src, tmp_path)
        gate, entered, waited_out = _hold_describe(m, name)
        try:
            m.run(go, _Held(m, session, gate, entered, waited_out))
        finally:
            gate.set()


def test_changes_through_the_mount_do_not_wait_for_a_new_archive_s_description(
    tmp_path: Path,
) -> None:
    src, victim_bytes, slow, slow_bytes = _victim_and_slow(tmp_path)
    (src / "old.txt").write_bytes(b"old")
    (src / "gone.txt").write_bytes(b"gone")

    async def go(h: _Held) -> None:
        m, session, gate, entered, waited_out = h.m, h.session, h.gate, h.entered, h.waited_out
        await _listed_then_changed(m, session, src, slow)
        # Each change finds the listing due (SRC changed since it was read).
        fh, _ino = await m.create(ROOT_INODE, "new.txt")
        assert await m.ops.write(fh, 0, b"new") == 3
        await m.ops.release(fh)
        session.clock.advance(5)
        await m.mkdir("made")
        session.clock.advance(5)
        await m.rename("old.txt", "renamed.txt")
        session.clock.advance(5)
        await m.unlink("gone.txt")
        assert not waited_out.is_set(), "a change waited for the new archive's description"
        assert await m.read_file("victim.tif") == victim_bytes
        assert await m.read_file("new.txt") == b"new"
        assert await m.read_file("renamed.txt") == b"old"
        gate.set()
        while ROOT_INODE in m.ops._relisting:  # the listing read behind them
            await trio.sleep(0.01)
        names = {name for name, _ in await m.readdir(ROOT_INODE)}
        assert names == {"victim.tif", "slow.tif", "new.txt", "made", "renamed.txt"}
        assert await m.read_file("slow.tif") == slow_bytes
        assert entered.is_set(), "the new archive was never described"

    _with_held(src, tmp_path, slow.name, go)


def test_a_change_does_not_wait_for_a_listing_being_read(tmp_path: Path) -> None:
    """A readdir's listing describes the new archive before the folder's lock is taken: a
    create meanwhile takes the lock at once, and the listing read before it is taken with
    the new file as the create put it."""
    src, _, slow, _ = _victim_and_slow(tmp_path)

    async def go(h: _Held) -> None:
        m, session, gate, entered, waited_out = h.m, h.session, h.gate, h.entered, h.waited_out
        await _listed_then_changed(m, session, src, slow)
        listed: list[set[str]] = []

        async def list_all() -> None:
            listed.append({name for name, _ in await m.readdir(ROOT_INODE)})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(list_all)
            await trio.to_thread.run_sync(entered.wait, GATE_SECONDS)
            assert entered.is_set(), "the readdir never described the new archive"
            fh, _ino = await m.create(ROOT_INODE, "during.txt")
            await m.ops.release(fh)
            assert not waited_out.is_set(), "the create waited for the readdir's listing"
            gate.set()
        assert listed == [{"victim.tif", "slow.tif", "during.txt"}]
        assert "during.txt" in m.ops.inodes.folders[ROOT_INODE].children

    _with_held(src, tmp_path, slow.name, go)


def test_a_listing_read_before_the_lock_takes_what_was_changed_under_it_meanwhile(
    tmp_path: Path,
) -> None:
    """What is done under the folder's lock while a listing is read before it (here: a file
    published, which leaves the folder's mtime as it was) is newer than that read: taken as
    read, the listing would have dropped the file the publish showed."""
    src, _, slow, _ = _victim_and_slow(tmp_path)

    async def go(h: _Held) -> None:
        m, session, gate, entered, _ = h.m, h.session, h.gate, h.entered, h.waited_out
        await _listed_then_changed(m, session, src, slow)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(m.ops.rescan, ROOT_INODE)
            await trio.to_thread.run_sync(entered.wait, GATE_SECONDS)
            assert entered.is_set()
            stamp = os.stat(src)
            (src / "published.txt").write_bytes(b"p")
            os.utime(src, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
            await m.ops.published(["published.txt"])
            assert "published.txt" in m.ops.inodes.folders[ROOT_INODE].children
            gate.set()
        assert "published.txt" in m.ops.inodes.folders[ROOT_INODE].children
        assert "slow.tif" in m.ops.inodes.folders[ROOT_INODE].children

    _with_held(src, tmp_path, slow.name, go)


def test_a_readdir_of_a_handle_left_open_does_not_read_the_listing(tmp_path: Path) -> None:
    """A readdir runs while the kernel holds the folder (a change there waits for it, and
    lookups queue behind the change): a handle opened, left past the listing's age, then
    read, is answered from the listing as it is, which is read again in the background."""
    src, _, slow, _ = _victim_and_slow(tmp_path)

    async def go(h: _Held) -> None:
        m, session, gate, entered, waited_out = h.m, h.session, h.gate, h.entered, h.waited_out
        fh = await m.ops.opendir(ROOT_INODE, m.ctx)
        _dropped(src, slow, slow.name)
        session.clock.advance(5)
        token = Token(100)
        with trio.fail_after(GATE_SECONDS / 2):
            await m.ops.readdir(fh, 0, token)  # type: ignore[arg-type]
        assert [name for name, _, _ in token.entries] == ["victim.tif"]
        await m.ops.releasedir(fh)
        await trio.to_thread.run_sync(entered.wait, GATE_SECONDS)
        assert entered.is_set(), "the listing was not read again behind the readdir"
        gate.set()
        while ROOT_INODE in m.ops._relisting:
            await trio.sleep(0.01)
        assert "slow.tif" in {name for name, _ in await m.readdir(ROOT_INODE)}
        assert not waited_out.is_set()

    _with_held(src, tmp_path, slow.name, go)


def test_a_lookup_waits_for_a_change_not_for_the_listing(tmp_path: Path) -> None:
    """A lookup that comes while a change holds the folder's lock waits for that change,
    then is answered by lstats, not by reading the listing (which would describe the new
    archive)."""
    src, victim_bytes, slow, _ = _victim_and_slow(tmp_path)

    async def go(h: _Held) -> None:
        m, session, gate, _entered, waited_out = h.m, h.session, h.gate, h.entered, h.waited_out
        first = await _listed_then_changed(m, session, src, slow)
        assert first.st_size == len(victim_bytes)
        found: list[pyfuse3.EntryAttributes] = []

        async def look() -> None:
            found.append(await m.lookup(ROOT_INODE, "victim.tif"))

        async with trio.open_nursery() as nursery, m.ops.inodes.locked(ROOT_INODE):
            nursery.start_soon(look)  # while a change holds the lock
            await trio.sleep(0.1)
            assert not found
        assert found[0].st_size == len(victim_bytes)
        assert stat.S_ISREG(found[0].st_mode)
        assert not waited_out.is_set(), "the lookup read the listing"
        gate.set()

    _with_held(src, tmp_path, slow.name, go)


def test_a_change_does_not_wait_for_the_watcher_s_word_of_new_archives(tmp_path: Path) -> None:
    """The watcher's word of new names describes their archives before the folder's lock is
    taken: a create meanwhile does not wait for it, and both show."""
    src, _, slow, slow_bytes = _victim_and_slow(tmp_path)

    async def go(h: _Held) -> None:
        m, session, gate, entered, waited_out = h.m, h.session, h.gate, h.entered, h.waited_out
        await m.readdir(ROOT_INODE)  # listed
        _dropped(src, slow, slow.name)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(m.ops.on_names_changed, {src: {slow.name}})
            await trio.to_thread.run_sync(entered.wait, GATE_SECONDS)
            assert entered.is_set(), "the watcher's word never described the new archive"
            session.clock.advance(5)
            fh, _ino = await m.create(ROOT_INODE, "during.txt")
            await m.ops.release(fh)
            assert not waited_out.is_set(), "the create waited for the watcher's describe"
            gate.set()
        listing = m.ops.inodes.folders[ROOT_INODE].children
        assert {"victim.tif", "slow.tif", "during.txt"} <= set(listing)
        assert await m.read_file("slow.tif") == slow_bytes

    _with_held(src, tmp_path, slow.name, go)


def _irregular(tmp_path: Path) -> tuple[Path, Path]:
    """SRC whose folder `shared` holds `batch.zarr.zip` presenting `scan.tif` (an archive
    presenting a name other than its own); the slow archive made aside."""
    from tests.unit.test_lookup_while_listed import _archive

    src = tmp_path / "src"
    shared = src / "shared"
    shared.mkdir(parents=True)
    scan, _ = _archive(tmp_path, "scan.tif", 1)
    slow, _ = _archive(tmp_path, "slow.tif", 2)
    os.rename(scan, shared / "batch.zarr.zip")
    (shared / "old.txt").write_bytes(b"old")
    return src, slow


def test_where_an_archive_presents_another_name_a_change_does_not_wait_either(
    tmp_path: Path,
) -> None:
    """In a folder where an archive presents a name other than its own, a change through
    the mount reads its names with the archive the listing gave them to, not the whole
    listing; the watcher's word of a new archive there reads the whole listing, but before
    the folder's lock is taken."""
    src, slow = _irregular(tmp_path)
    shared = src / "shared"

    async def go(h: _Held) -> None:
        m, session, gate, entered, waited_out = h.m, h.session, h.gate, h.entered, h.waited_out
        here = await m.resolve("shared")
        assert (await m.lookup(here, "scan.tif")).st_size > 0
        _dropped(shared, slow, slow.name)
        session.clock.advance(5)
        fh, _ino = await m.create(here, "first.txt")  # the listing due: read behind
        await m.ops.release(fh)
        await m.rename("shared/old.txt", "shared/renamed.txt")
        # A spooled file's unlink asks what it hides (red team 101 F3: by a read of the
        # whole folder under its lock, the victim's create and unlink loop waited 37 s).
        fh, _ino = await m.create(here, "gone.txt")
        await m.ops.release(fh)
        await m.unlink("shared/gone.txt")
        assert not waited_out.is_set(), "a change waited for the listing"
        await trio.to_thread.run_sync(entered.wait, GATE_SECONDS)
        gate.set()
        while here in m.ops._relisting:
            await trio.sleep(0.01)
        # Now the watcher's word of another new archive.
        again, _ = _archive_aside(tmp_path, "again.tif")
        _dropped(shared, again, "again.tif.zarr.zip")
        _gate2, entered2, waited2 = _hold_describe(m, "again.tif.zarr.zip")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(m.ops.on_names_changed, {shared: {"again.tif.zarr.zip"}})
            await trio.to_thread.run_sync(entered2.wait, GATE_SECONDS)
            assert entered2.is_set(), "the watcher's word never described the archive"
            session.clock.advance(5)
            fh, _ino = await m.create(here, "second.txt")
            await m.ops.release(fh)
            assert not waited2.is_set(), "the create waited for the watcher's listing"
            _gate2.set()
        names = set(await m.listdir("shared"))
        assert {"scan.tif", "slow.tif", "again.tif", "first.txt", "second.txt",
                "renamed.txt"} <= names  # fmt: skip
        assert "old.txt" not in names

    _with_held(src, tmp_path, slow.name, go)


def _archive_aside(tmp_path: Path, name: str) -> tuple[Path, bytes]:
    from tests.unit.test_lookup_while_listed import _archive

    return _archive(tmp_path / "aside", name, 7)


def _count_describes(m: InProcessMount) -> Counter[str]:
    """How often each archive is described afresh (the mount here keeps no index)."""
    counts: Counter[str] = Counter()
    described = m.tree._describe_fresh

    def counted(backend: Any, path: Path, listed: Any = None) -> Any:
        counts[path.name] += 1
        return described(backend, path, listed)

    m.tree._describe_fresh = counted  # type: ignore[method-assign]
    return counts


def test_a_listing_read_before_the_lock_is_taken_after_changes_under_it(tmp_path: Path) -> None:
    """Red team 99 N1: a change through the mount while a listing was read before the lock
    voided the listing, which was read again under the lock, describing the new archives
    there; with archives trickling in, every create waited 8-13 s. Now the names changed
    under the lock are taken from the listing and the read is kept: each archive is
    described once."""
    src, _, slow, _ = _victim_and_slow(tmp_path)

    async def go(h: _Held) -> None:
        m, session, gate, entered, waited_out = h.m, h.session, h.gate, h.entered, h.waited_out
        counts = _count_describes(m)
        await _listed_then_changed(m, session, src, slow)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(m.ops.rescan, ROOT_INODE)
            await trio.to_thread.run_sync(entered.wait, GATE_SECONDS)
            fh, _ino = await m.create(ROOT_INODE, "during.txt")
            await m.ops.release(fh)
            gate.set()
        listing = m.ops.inodes.folders[ROOT_INODE].children
        assert {"victim.tif", "slow.tif", "during.txt"} <= set(listing)
        assert counts[slow.name] == 1, "the listing was read again under the lock"
        assert not waited_out.is_set()

    _with_held(src, tmp_path, slow.name, go)


def test_the_watcher_s_names_read_ahead_are_taken_after_changes_under_the_lock(
    tmp_path: Path,
) -> None:
    """The same for the watcher's word of new names: a create meanwhile does not make it
    describe them again under the lock."""
    src, _, slow, _ = _victim_and_slow(tmp_path)

    async def go(h: _Held) -> None:
        m, session, gate, entered, _ = h.m, h.session, h.gate, h.entered, h.waited_out
        counts = _count_describes(m)
        await m.readdir(ROOT_INODE)  # listed
        _dropped(src, slow, slow.name)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(m.ops.on_names_changed, {src: {slow.name}})
            await trio.to_thread.run_sync(entered.wait, GATE_SECONDS)
            session.clock.advance(5)
            fh, _ino = await m.create(ROOT_INODE, "during.txt")
            await m.ops.release(fh)
            gate.set()
        listing = m.ops.inodes.folders[ROOT_INODE].children
        assert {"victim.tif", "slow.tif", "during.txt"} <= set(listing)
        assert counts[slow.name] == 1, "the names were read again under the lock"

    _with_held(src, tmp_path, slow.name, go)


def test_a_listing_read_before_the_lock_is_taken_after_src_changed_meanwhile(
    tmp_path: Path,
) -> None:
    """Red team 99 N2: SRC changed every 0.2 s made each listing read before the lock void,
    and read again under it (46-84 s for a first listing instead of 36). Now it is taken
    with the folder's stamp from before it was read: the change shows at the next use."""
    src, _, slow, _ = _victim_and_slow(tmp_path)

    async def go(h: _Held) -> None:
        m, session, gate, entered, _ = h.m, h.session, h.gate, h.entered, h.waited_out
        counts = _count_describes(m)
        _dropped(src, slow, slow.name)
        listed: list[set[str]] = []

        async def list_all() -> None:
            listed.append({name for name, _ in await m.readdir(ROOT_INODE)})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(list_all)  # a first listing
            await trio.to_thread.run_sync(entered.wait, GATE_SECONDS)
            (src / "later.txt").write_bytes(b"later")  # the stamp moves on
            gate.set()
        assert listed == [{"victim.tif", "slow.tif"}]
        assert counts[slow.name] == 1, "the listing was read again under the lock"
        session.clock.advance(5)
        assert (await m.lookup(ROOT_INODE, "later.txt")).st_size == 5
        assert "later.txt" in {name for name, _ in await m.readdir(ROOT_INODE)}

    _with_held(src, tmp_path, slow.name, go)
