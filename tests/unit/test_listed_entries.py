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
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.unit.inprocess import InProcessMount, Session, fake_session
from tests.unit.test_inodes import real
from vfs.mount.inodes import ROOT_INODE, Folder, InodeTable

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


def test_a_folder_whose_listing_went_has_its_file_entries_dropped_when_it_changed(
    mount: InProcessMount, session: Session
) -> None:
    """A change the watcher cannot name (its catch-up after a new watch, a name that is not
    UTF-8): a listed folder is rescanned; one whose listing went has the kernel's entries of
    its files dropped, once per change of the folder, not at every catch-up."""
    m = mount

    async def run() -> None:
        folder = await m.resolve("d0")
        for d in range(1, FOLDERS):
            await m.listdir(f"d{d}")
        await m.resolve("d0/f002")  # the kernel holds these two (d0 listed again behind them)
        await m.resolve("d0/f003")
        while m.ops._relisting:
            await trio.sleep(0.01)
        m.ops.inodes.listed_entries = FILES + 10  # room for one listing and these entries
        await m.listdir("d1")  # d0's listing goes again; its entries stay with the kernel
        assert folder not in m.ops.inodes.folders
        held = set(m.ops.inodes.file_entries_in(m.config.src / "d0"))
        assert held == {(folder, "f002"), (folder, "f003")}
        session.invalidated.clear()
        await m.ops.on_changed({m.config.src / "d0"})
        assert session.invalidated == []  # nothing changed since its listing went
        (m.config.src / "d0" / "f001").unlink()
        os.utime(m.config.src / "d0", ns=(1, 1))
        await m.ops.on_changed({m.config.src / "d0"})
        assert {(p, os.fsdecode(n)) for p, n in session.invalidated} == held
        session.invalidated.clear()
        await m.ops.on_changed({m.config.src / "d0"})
        assert session.invalidated == []

    m.run(run)


def test_a_listing_read_again_before_the_watcher_speaks_drops_what_changed_meanwhile(
    mount: InProcessMount, session: Session
) -> None:
    """Red team 81 F2: a name looked up missing (the kernel remembers that 10 s), its folder's
    listing let go, the name made in SRC, and the listing read again before the watcher's word
    came: the fresh listing had the name, the watcher's event then found nothing changed, and
    the name stayed missing through the mount for 9 s. Likewise a file the kernel held that
    went meanwhile. Now the names new since the listing went, and the held files gone or
    replaced, are dropped from the kernel when it is read again."""
    m = mount

    async def run() -> None:
        folder = await m.resolve("d0")
        with pytest.raises(pyfuse3.FUSEError):
            await m.lookup(folder, "new")
        await m.resolve("d0/f005")  # the kernel holds it
        for d in range(1, FOLDERS):  # listings that push d0's out; their names forgotten
            listed = await m.readdir(await m.resolve(f"d{d}"))
            await m.forget([(attrs.st_ino, 1) for _name, attrs in listed])
        assert folder not in m.ops.inodes.folders
        (m.config.src / "d0" / "new").write_bytes(b"made in SRC")
        (m.config.src / "d0" / "f005").unlink()
        session.invalidated.clear()
        names = await m.listdir("d0")  # read again before any word of the watcher
        assert "new" in names and "f005" not in names
        assert {(folder, b"new"), (folder, b"f005")} <= set(session.invalidated)
        assert len(session.invalidated) == 2  # not every name of the folder

    m.run(run)


# -- the table's budgets as a state machine: what is in use is never let go ---------------------

DIRS = [f"d{i}" for i in range(6)]


class Budgets(RuleBasedStateMachine):
    """Folders listed (each a few names handed to the kernel as readdirplus does), directory
    handles opened and closed, files pinned, entries asked to go and forgotten as the kernel
    would: a listing with an open handle, the root's, and an open file's entry never go; the
    listings and entries left fit their budget whenever nothing in use holds them over it."""

    def __init__(self) -> None:
        super().__init__()
        self.table = InodeTable(real("", is_dir=True), listed_entries=12)
        self.folder_ino: dict[str, int] = {}
        self.kernel: dict[int, int] = {}  # the kernel's references
        self.at: dict[tuple[int, str], int] = {}  # the kernel's entries
        self.open_dirs: dict[int, int] = {}
        self.pinned: set[int] = set()

    def _take(self, ino: int, at: tuple[int, str]) -> None:
        self.kernel[ino] = self.kernel.get(ino, 0) + 1
        self.at[at] = ino

    @rule(d=st.sampled_from(DIRS), n=st.integers(0, 8))
    def list_folder(self, d: str, n: int) -> None:
        t = self.table
        folder_ino = t.hand_out(real(d, is_dir=True), (ROOT_INODE, d))
        self._take(folder_ino, (ROOT_INODE, d))
        self.folder_ino[d] = folder_ino
        listing = Folder()
        listing.merge({f"f{i}": real(f"{d}/f{i}") for i in range(n)})
        t.keep_listing(folder_ino, listing)
        for _cookie, name, node in listing.after(0):
            ino = t.assign(node)
            t.count(ino, (folder_ino, name))
            self._take(ino, (folder_ino, name))

    @rule(d=st.sampled_from(DIRS))
    def open_dir(self, d: str) -> None:
        ino = self.folder_ino.get(d)
        if ino is not None and ino in self.kernel:
            if ino not in self.table.folders:  # opendir reads a listing let go again
                self.table.keep_listing(ino, Folder())
            self.table.opened_dir(ino)
            self.open_dirs[ino] = self.open_dirs.get(ino, 0) + 1

    @precondition(lambda self: self.open_dirs)
    @rule(data=st.data())
    def release_dir(self, data: st.DataObject) -> None:
        ino = data.draw(st.sampled_from(sorted(self.open_dirs)))
        self.table.released_dir(ino)
        self.open_dirs[ino] -= 1
        if not self.open_dirs[ino]:
            del self.open_dirs[ino]

    @precondition(lambda self: self.kernel)
    @rule(data=st.data())
    def pin_one(self, data: st.DataObject) -> None:
        ino = data.draw(st.sampled_from(sorted(self.kernel)))
        if ino not in self.pinned:
            self.table.pin(ino)
            self.pinned.add(ino)

    @precondition(lambda self: self.pinned)
    @rule(data=st.data())
    def unpin_one(self, data: st.DataObject) -> None:
        ino = data.draw(st.sampled_from(sorted(self.pinned)))
        self.table.unpin(ino)
        self.pinned.discard(ino)
        if ino not in self.kernel:
            assert self.table.get(ino) is None

    @rule(most=st.integers(1, 20))
    def let_go(self, most: int) -> None:
        """What LetGo does, and the kernel after it: each entry dropped forgets its inode,
        unless a directory handle or an open file holds it (then the kernel keeps it)."""
        for at in self.table.overflow(most):
            ino = self.at.pop(at, None)
            assert ino is not None, f"asked to drop {at}, which the kernel never held"
            assert ino not in self.pinned and ino not in self.open_dirs, "an entry in use"
            n = self.kernel.pop(ino)
            self.table.forget(ino, n)

    @invariant()
    def in_use_is_kept(self) -> None:
        t = self.table
        for ino in self.open_dirs:
            assert t.get(ino) is not None and ino in t.folders, "a listing being read went"
        for ino in self.pinned:
            assert t.get(ino) is not None

    @invariant()
    def listings_fit_or_are_held(self) -> None:
        t = self.table
        held = {i: len(f.children) for i, f in t.folders.items() if i != ROOT_INODE}
        free = [i for i in held if i not in self.open_dirs]
        # Over the budget only with listings in use, and the newest (kept: just read).
        assert sum(held.values()) <= t.listed_entries or len(free) <= 1, (held, self.open_dirs)

    @invariant()
    def the_kernel_s_entries_are_known(self) -> None:
        for ino in self.kernel:
            assert self.table.get(ino) is not None


TestBudgets = Budgets.TestCase
TestBudgets.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
