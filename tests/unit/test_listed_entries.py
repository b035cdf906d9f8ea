"""The names the daemon keeps of SRC's folders, bounded (`--listed-entries`), in-process.

Every name a listing hands the kernel (readdirplus) kept its node and table rows until the
kernel forgot it, and every listing of SRC's folders was kept while the kernel held the folder:
a user's five folders of 200,000 empty files, listed once, held the daemon at 890 MiB (red
team 71). Past the budget the oldest kernel entries are asked to go and the oldest listings are
let go; what is let go is read again, and never at the cost of a name shown twice or missed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyfuse3
import pytest
import trio.testing

from tests.unit.inprocess import InProcessMount, Session, fake_session
from vfs.mount.inodes import ROOT_INODE

FOLDERS, FILES, BUDGET = 5, 60, 100


@pytest.fixture
def session() -> Iterator[Session]:
    with fake_session() as s:
        yield s


@pytest.fixture
def mount(tmp_path: Path, session: Session) -> InProcessMount:
    src = tmp_path / "src"
    for d in range(FOLDERS):
        (src / f"d{d}").mkdir(parents=True)
        for i in range(FILES):
            (src / f"d{d}" / f"f{i:03d}").write_bytes(f"{d}/{i}".encode())
    m = InProcessMount(src, tmp_path / "work", read_only=True)
    m.ops.inodes.listed_entries = BUDGET
    return m


def src_listings(m: InProcessMount) -> dict[int, int]:
    return {i: len(f.children) for i, f in m.ops.inodes.folders.items() if i != ROOT_INODE}


async def forget_invalidated(m: InProcessMount, session: Session, shown: dict) -> int:
    """What the kernel does with the entries it is asked to drop: forgets their inodes."""
    for _ in range(400):  # the LetGo task has run, its batches too
        await trio.testing.wait_all_tasks_blocked()
        if not m.ops.let_go.busy and not m.ops.inodes.overflowing():
            break
        await trio.sleep(0.005)
    gone = [(shown[at], m.kernel.refs[shown[at]]) for at in session.invalidated if at in shown]
    session.invalidated.clear()
    await m.forget([(ino, n) for ino, n in gone if n])
    return len(gone)


def test_kernel_entries_past_the_budget_are_asked_to_go_and_forgotten(
    mount: InProcessMount, session: Session
) -> None:
    m = mount

    async def run() -> None:
        shown: dict[tuple[int, bytes], int] = {}
        for d in range(FOLDERS):
            folder = await m.resolve(f"d{d}")
            shown[(ROOT_INODE, f"d{d}".encode())] = folder
            for name, attrs in await m.readdir(folder, room=25):
                shown[(folder, os.fsencode(name))] = attrs.st_ino
            assert await forget_invalidated(m, session, shown) or d == 0
        table = m.ops.inodes
        assert len(table) <= BUDGET + FOLDERS + 1, len(table)  # 306 kept before
        held = src_listings(m)
        assert sum(held.values()) <= BUDGET or len(held) == 1, held
        # What went is served again, looked up afresh.
        for d in range(FOLDERS):
            assert await m.read_file(f"d{d}/f007") == f"{d}/7".encode()

    m.run(run)


def test_a_listing_half_read_is_kept_and_every_name_comes_once(
    mount: InProcessMount, session: Session
) -> None:
    """A listing read again numbers its names anew: one let go while a reader is half way
    through it would skip or repeat names. An open directory handle keeps it."""
    m = mount

    async def run() -> None:
        first = await m.resolve("d0")
        others = iter([f"d{d}" for d in range(1, FOLDERS)])

        async def list_another() -> None:
            other = next(others, None)
            if other is not None:
                await m.listdir(other)
            assert first in m.ops.inodes.folders  # kept: its reader is half way

        names = [name for name, _ in await m.readdir(first, room=7, between=list_another)]
        assert sorted(names) == [f"f{i:03d}" for i in range(FILES)], names  # each once
        await m.listdir("d4")  # the handle closed: now it may go
        assert first not in m.ops.inodes.folders
        assert ROOT_INODE in m.ops.inodes.folders  # the root's listing is always kept

    m.run(run)


def test_a_name_made_in_a_folder_whose_listing_went_is_dropped_from_the_kernel(
    mount: InProcessMount, session: Session
) -> None:
    """The kernel may remember that a name is missing (a negative entry, 10 s): the watcher's
    word that it appeared must reach the kernel without a listing to rescan."""
    m = mount

    async def run() -> None:
        folder = await m.resolve("d0")
        with pytest.raises(pyfuse3.FUSEError):
            await m.lookup(folder, "new")  # negative: the kernel keeps it
        for d in range(1, FOLDERS):
            await m.listdir(f"d{d}")
        assert folder not in m.ops.inodes.folders
        session.invalidated.clear()
        (m.config.src / "d0" / "new").write_bytes(b"made in SRC")
        await m.ops.on_names_changed({m.config.src / "d0": {"new"}})
        assert (folder, b"new") in session.invalidated
        assert await m.read_file("d0/new") == b"made in SRC"

    m.run(run)
