"""The mount's namespace as a state machine: DecantOperations driven in-process (no /dev/fuse)
through creates, rsync-style temp files renamed over real names, renames of files and folders,
unlinks, mkdir/rmdir, forgets, rescans, readdir in small batches while the folder changes, and
publishing by the pack queue, some of them at once in one trio nursery. After every step the
visible tree (readdir, lookup sizes, file bytes) must equal a plain-dict model.

Bugs it found, and the ones found before it, stay below as single scenarios."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

import pyfuse3
import pytest
import trio
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tests.unit.inprocess import InProcessMount, fake_session
from vfs.mount.inodes import ROOT_INODE

NAMES = ("a", "b", "c", "d")  # files and folders share them, so they collide
MAX_DEPTH = 2
TEMP_SUFFIXES = ("Ab12Cd", "x9Y8z7")  # rsync: .NAME.XXXXXX

payloads = st.one_of(st.just(b""), st.binary(min_size=0, max_size=2000).map(lambda b: b"x" + b))


def pick(data: st.DataObject, items: list[Any], label: str) -> Any:
    """One of `items`, drawn the same way whatever they are: which files the queue published
    while steps ran at once can differ between runs, and the draws must not (hypothesis)."""
    index = data.draw(st.integers(0, 1 << 16), label=label)
    return items[index % len(items)] if items else None


def join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def depth(path: str) -> int:
    return len(path.split("/")) if path else 0


def fails_with(m: InProcessMount, code: int, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
    with pytest.raises(pyfuse3.FUSEError) as caught:
        m.run(fn, *args)
    assert caught.value.errno == code, (os.strerror(caught.value.errno), os.strerror(code))


class MountMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._stack = ExitStack()
        work = Path(self._stack.enter_context(tempfile.TemporaryDirectory(prefix="state-")))
        self.session = self._stack.enter_context(fake_session())
        self.src = work / "src"
        self.src.mkdir()
        self.m = InProcessMount(self.src, work)
        self.files: dict[str, bytes] = {}
        self.dirs: set[str] = {""}
        self.trace: list[str] = []  # the steps so far, in every failure's message

    def run(self, what: str, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        self.trace.append(what)
        try:
            return self.m.run(fn, *args)
        except (AssertionError, pyfuse3.FUSEError, OSError, ExceptionGroup) as exc:
            steps = "\n  ".join(self.trace)
            raise AssertionError(f"{exc!r} after:\n  {steps}\n{self.disk()}") from exc

    def disk(self) -> str:
        """SRC and the spool as they are, for a failure's message."""
        real = {
            str(p.relative_to(self.src)): p.read_bytes() if p.is_file() else "dir"
            for p in sorted(self.src.rglob("*"))
            if ".decant-spool" not in p.parts
        }
        spooled = {rel: self.m.spool_path(rel).read_bytes() for rel in sorted(self.m.spooled())}
        return f"SRC {real}\nspool {spooled}\nmodel {self.files}"

    def teardown(self) -> None:
        self._stack.close()

    # -- the model -------------------------------------------------------------------------

    def kids(self, folder: str) -> set[str]:
        return {p.rpartition("/")[2] for p in [*self.files, *self.dirs]
                if p and p.rpartition("/")[0] == folder}  # fmt: skip

    def exists(self, path: str) -> bool:
        return path in self.files or path in self.dirs

    def file_targets(self, exclude: str = "") -> list[str]:
        return sorted(join(d, n) for d in self.dirs for n in NAMES
                      if join(d, n) not in self.dirs and join(d, n) != exclude)  # fmt: skip

    def spooled(self, path: str) -> bool:
        return self.m.spool_path(path).is_file()

    def movable_files(self) -> list[str]:
        return sorted(self.files)

    def model_rename(self, old: str, new: str) -> None:
        if old in self.files:
            self.files[new] = self.files.pop(old)
            return
        prefix = old + "/"
        self.dirs = {new + d[len(old):] if d == old or d.startswith(prefix) else d
                     for d in self.dirs}  # fmt: skip
        self.files = {new + p[len(old):] if p.startswith(prefix) else p: data
                      for p, data in self.files.items()}  # fmt: skip

    def subtree_depth(self, folder: str) -> int:
        prefix = folder + "/"
        return max(depth(d) for d in self.dirs if d == folder or d.startswith(prefix)) - depth(
            folder
        )

    # -- rules -----------------------------------------------------------------------------

    @rule(data=st.data(), payload=payloads)
    def write(self, data: st.DataObject, payload: bytes) -> None:
        path = pick(data, self.file_targets(), "path")
        if path is None:
            return
        self.run(f"write {path} {len(payload)}", self.write_file, path, payload)
        self.files[path] = payload

    async def write_file(self, path: str, payload: bytes) -> None:
        await self.m.write_file(path, payload)

    @rule(data=st.data(), payload=payloads, publish_between=st.booleans())
    def rsync_write(self, data: st.DataObject, payload: bytes, publish_between: bool) -> None:
        """rsync: write `.NAME.XXXXXX`, then rename it over NAME (which may exist)."""
        path = pick(data, self.file_targets(), "path")
        if path is None:
            return
        folder, _, name = path.rpartition("/")
        temp = join(folder, f".{name}.{data.draw(st.sampled_from(TEMP_SUFFIXES))}")

        async def go() -> None:
            await self.m.write_file(temp, payload)
            if publish_between:  # the queue took the temp file: a real file is renamed
                await self.m.publish_all()
            await self.m.rename(temp, path)

        self.run(f"rsync {temp} -> {path} {len(payload)} {publish_between}", go)
        self.files[path] = payload

    @rule(data=st.data())
    def rename_file(self, data: st.DataObject) -> None:
        pairs = [(o, n) for o in self.movable_files() for n in self.file_targets(exclude=o)]
        old, new = pick(data, pairs, "rename") or ("", "")
        if not old:
            return

        async def go() -> None:
            held = await self.m.resolve(old)
            await self.m.rename(old, new)
            parent = await self.m.resolve(new.rpartition("/")[0])
            attrs = await self.m.lookup(parent, new.rpartition("/")[2])
            assert attrs.st_ino == held, "a renamed file keeps its inode"
            assert await self.m.read_inode(held) == self.files[old]

        self.run(f"rename {old} {new}", go)
        self.model_rename(old, new)

    @rule(data=st.data())
    def unlink(self, data: st.DataObject) -> None:
        choices = self.movable_files()
        path = pick(data, choices, "unlink")
        if path is None:
            return
        self.run(f"unlink {path}", self.m.unlink, path)
        del self.files[path]

    @rule(data=st.data())
    def mkdir(self, data: st.DataObject) -> None:
        parents = sorted(d for d in self.dirs if depth(d) < MAX_DEPTH)
        path = join(pick(data, parents, "parent"), data.draw(st.sampled_from(NAMES)))
        if self.exists(path):
            self.trace.append(f"mkdir {path} (EEXIST)")
            fails_with(self.m, errno.EEXIST, self.m.mkdir, path)
            return
        self.run(f"mkdir {path}", self.m.mkdir, path)
        self.dirs.add(path)

    @rule(data=st.data())
    def rmdir(self, data: st.DataObject) -> None:
        path = pick(data, sorted(self.dirs - {""}), "rmdir")
        if path is None:
            return
        if self.kids(path):
            self.trace.append(f"rmdir {path} (ENOTEMPTY)")
            fails_with(self.m, errno.ENOTEMPTY, self.m.rmdir, path)
            return
        self.run(f"rmdir {path}", self.m.rmdir, path)
        self.dirs.discard(path)

    def folder_moves(self) -> list[tuple[str, str]]:
        moves = []
        for old in sorted(self.dirs - {""}):
            for parent in sorted(self.dirs):
                if parent == old or parent.startswith(old + "/"):
                    continue
                for name in NAMES:
                    new = join(parent, name)
                    if not self.exists(new) and depth(new) + self.subtree_depth(old) <= MAX_DEPTH:
                        moves.append((old, new))
        return moves

    @rule(data=st.data())
    def rename_folder(self, data: st.DataObject) -> None:
        """A folder moves with what is inside; its inode and its children's stay usable."""
        moves = self.folder_moves()
        old, new = pick(data, moves, "move") or ("", "")
        if not old:
            return
        inside = sorted(p for p in self.files if p.rpartition("/")[0] == old)

        async def go() -> None:
            held = await self.m.resolve(old)
            child = await self.m.resolve(inside[0]) if inside else None
            await self.m.rename(old, new)
            parent = await self.m.resolve(new.rpartition("/")[0])
            got = (await self.m.lookup(parent, new.rpartition("/")[2])).st_ino
            assert got == held, "a renamed folder keeps its inode"
            for path in inside:  # at once, under the new name and through the held inode
                name = path.rpartition("/")[2]
                attrs = await self.m.lookup(held, name)
                assert attrs.st_size == len(self.files[path])
                assert await self.m.read_inode(attrs.st_ino) == self.files[path]
            if child is not None:
                assert await self.m.read_inode(child) == self.files[inside[0]]

        self.run(f"rename folder {old} {new}", go)
        self.model_rename(old, new)

    @rule(data=st.data(), k=st.integers(1, 4))
    def forget(self, data: st.DataObject, k: int) -> None:
        refs = self.m.kernel.refs
        drawn = [
            (pick(data, sorted(refs), "inode"), data.draw(st.integers(0, 64))) for _ in range(k)
        ]
        counts = {ino: 1 + n % refs[ino] for ino, n in reversed(drawn) if ino is not None}
        pairs = sorted(counts.items())
        self.run(f"forget {pairs}", self.m.forget, pairs)

    @rule()
    def forget_all(self) -> None:
        self.run("forget all", self.m.forget_all)

    @rule(data=st.data(), how=st.sampled_from(["rescan", "on_changed", "on_names_changed"]))
    def rescan(self, data: st.DataObject, how: str) -> None:
        folder = pick(data, sorted(self.dirs), "folder")

        async def go() -> None:
            if how == "rescan":
                await self.m.ops.rescan(await self.m.resolve(folder), force=True)
            elif how == "on_changed":
                await self.m.ops.on_changed({self.src / folder})
            else:  # what the watcher reports: names of a folder, not the folder
                await self.m.ops.on_names_changed({self.src / folder: set(NAMES)})

        self.run(f"{how} {folder!r}", go)

    @rule()
    def time_passes(self) -> None:
        """Listings older than RESCAN_INTERVAL are checked against SRC again."""
        self.trace.append("time passes")
        self.session.clock.advance(2.0)

    @rule()
    def publish(self) -> None:
        self.run("publish", self.m.publish_all)
        assert not any(i.state == "failed" for i in self.m.queue.items.values()), (
            self.m.queue.status()
        )

    @rule(data=st.data(), room=st.integers(1, 3))
    def readdir_while_changing(self, data: st.DataObject, room: int) -> None:
        """Between batches the folder changes: names present throughout come exactly once."""
        folder = pick(data, sorted(self.dirs), "folder")
        changes = data.draw(st.lists(st.tuples(st.sampled_from(["write", "unlink", "rename"]),
                                               st.sampled_from(NAMES), st.sampled_from(NAMES),
                                               payloads), max_size=4))  # fmt: skip
        before = self.kids(folder)
        touched: set[str] = set()
        pending = list(changes)

        async def between() -> None:
            if not pending:
                return
            kind, name, other, payload = pending.pop(0)
            path, dest = join(folder, name), join(folder, other)
            if kind == "write" and path not in self.dirs:
                await self.write_file(path, payload)
                self.files[path] = payload
            elif kind == "unlink" and path in self.movable_files():
                await self.m.unlink(path)
                del self.files[path]
            elif (kind == "rename" and path in self.movable_files() and dest != path
                  and dest not in self.dirs):  # fmt: skip
                await self.m.rename(path, dest)
                self.model_rename(path, dest)
            else:
                return
            touched.update((name, other))

        async def go() -> None:
            listed = await self.m.readdir(await self.m.resolve(folder), room, between)
            names = [name for name, _ in listed]
            repeated = {name for name in names if names.count(name) > 1}
            assert not repeated - touched, f"repeated: {names}"  # a new file may come twice
            steady = (before - touched) & self.kids(folder)
            assert steady <= set(names), f"skipped {steady - set(names)} of {folder!r}: {names}"
            assert set(names) <= before | self.kids(folder) | touched

        self.run(f"readdir {folder!r} room {room} with {changes}", go)

    @rule(data=st.data(), publish=st.booleans())
    def concurrent_rename_and_rescans(self, data: st.DataObject, publish: bool) -> None:
        """A rename, rescans of both folders (and of a moved folder), a lookup and maybe the
        pack queue, all at once in one nursery."""
        moves = [(o, n) for o in self.movable_files() for n in self.file_targets(exclude=o)]
        moves += self.folder_moves()
        old, new = pick(data, moves, "move") or ("", "")
        if not old:
            return
        folders = {old.rpartition("/")[0], new.rpartition("/")[0]}
        bystanders = sorted(p for p in self.files if p != old and p != new
                            and not p.startswith(old + "/"))  # fmt: skip
        m = self.m

        async def go() -> None:
            inos = {f: await m.resolve(f) for f in folders}
            moved_ino = await m.resolve(old)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(m.rename, old, new)
                for folder, ino in inos.items():
                    nursery.start_soon(m.ops.rescan, ino, True)
                    nursery.start_soon(m.ops.on_changed, {self.src / folder})
                    names = {old.rpartition("/")[2], new.rpartition("/")[2]}
                    nursery.start_soon(m.ops.on_names_changed, {self.src / folder: names})
                if old in self.dirs:
                    nursery.start_soon(m.ops.on_changed, {self.src / old})
                    nursery.start_soon(self._rescan_quietly, moved_ino)
                if bystanders:
                    nursery.start_soon(m.read_file, bystanders[0])
                if publish:
                    nursery.start_soon(m.publish_all)

        self.run(f"at once: rename {old} {new}, rescans, publish {publish}", go)
        self.model_rename(old, new)

    @rule(data=st.data(), publish=st.booleans())
    def concurrent_unlink_and_rescans(self, data: st.DataObject, publish: bool) -> None:
        """An unlink, a rescan of its folder, the watcher's report of its name and maybe the
        pack queue, all at once: the unlink takes its own change of the folder's stamp only
        when nothing else changed the folder, and nothing it leaves may hide a name."""
        path = pick(data, self.movable_files(), "file")
        if path is None:
            return
        folder, _, name = path.rpartition("/")
        m = self.m

        async def go() -> None:
            ino = await m.resolve(folder)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(m.unlink, path)
                nursery.start_soon(m.ops.rescan, ino, False)
                nursery.start_soon(m.ops.on_names_changed, {self.src / folder: {name}})
                if publish:
                    nursery.start_soon(m.publish_all)

        self.run(f"at once: unlink {path}, rescans, publish {publish}", go)
        del self.files[path]

    async def _rescan_quietly(self, ino: int) -> None:
        """A rescan of a folder that is being moved may find its old path gone (ENOENT)."""
        with suppress(OSError, pyfuse3.FUSEError):
            await self.m.ops.rescan(ino, force=True)

    # -- what must hold after every step ---------------------------------------------------

    async def _check_attrs(self, path: str, attrs: pyfuse3.EntryAttributes) -> None:
        if path in self.dirs:
            assert stat.S_ISDIR(attrs.st_mode), path
            return
        assert stat.S_ISREG(attrs.st_mode), path
        assert attrs.st_size == len(self.files[path]), path

    @invariant()
    def tree_matches_model(self) -> None:
        self.run("check", self._check_tree)
        self.trace.pop()

    async def _check_tree(self) -> None:
        m = self.m
        for folder in sorted(self.dirs):
            ino = await m.resolve(folder)
            listed = await m.readdir(ino, room=3)
            names = [name for name, _ in listed]
            assert sorted(names) == sorted(self.kids(folder)), (folder, names)
            for name, attrs in listed:
                await self._check_attrs(join(folder, name), attrs)
            for name in sorted(self.kids(folder)):
                path = join(folder, name)
                attrs = await m.lookup(ino, name)
                await self._check_attrs(path, attrs)
                if path in self.files:
                    assert await m.read_inode(attrs.st_ino) == self.files[path], path
        for ino in m.kernel.refs:
            assert m.ops.inodes.get(ino) is not None, f"inode {ino} held by the kernel was freed"


MountMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("STATE_EXAMPLES", "50")),
    stateful_step_count=30,
    deadline=None,
    derandomize="STATE_RANDOM" not in os.environ,  # STATE_RANDOM=1: new examples each run
    # No shrinking: steps that run at once in threads need not replay alike, and every failure
    # already names the steps that led to it (MountMachine.trace).
    phases=[Phase.explicit, Phase.generate],
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_mount_state_machine = MountMachine.TestCase


# -- single scenarios ----------------------------------------------------------------------


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[InProcessMount]:
    with fake_session() as session:
        src = tmp_path / "src"
        src.mkdir()
        m = InProcessMount(src, tmp_path)
        m.session = session  # type: ignore[attr-defined]
        yield m


def test_a_renamed_folder_keeps_its_inode_and_a_new_folder_gets_another(
    mount: InProcessMount,
) -> None:
    async def go() -> None:
        await mount.mkdir("a")
        await mount.write_file("a/x", b"xx")
        held = await mount.resolve("a")
        await mount.rename("a", "b")
        assert (await mount.lookup(ROOT_INODE, "b")).st_ino == held
        assert await mount.mkdir("a") != held
        await mount.ops.rescan(held, force=True)
        assert [name for name, _ in await mount.readdir(held)] == ["x"]
        assert await mount.listdir("a") == []

    mount.run(go)


@pytest.mark.parametrize("published", [False, True])
def test_a_file_in_a_renamed_folder_reads_through_its_inode_at_once(
    mount: InProcessMount, published: bool
) -> None:
    async def go() -> None:
        await mount.mkdir("a")
        await mount.write_file("a/x", b"spooled or not")
        if published:
            assert await mount.publish_all() == 1
        held = await mount.resolve("a/x")
        await mount.rename("a", "b")
        assert await mount.read_inode(held) == b"spooled or not"
        attrs = await mount.lookup(await mount.resolve("b"), "x")
        assert attrs.st_ino == held
        assert await mount.ops.getattr(held, mount.ctx) is not None
        await mount.rename("b", "c")  # a second move follows the first
        assert await mount.read_file("c/x") == b"spooled or not"
        assert await mount.read_inode(held) == b"spooled or not"

    mount.run(go)


def test_readdir_of_a_subfolder_goes_on_across_a_rename_of_its_parent(
    mount: InProcessMount,
) -> None:
    names = [f"f{i}" for i in range(8)]

    async def go() -> list[str]:
        await mount.mkdir("a")
        await mount.mkdir("a/s")
        for name in names:
            await mount.write_file(f"a/s/{name}", name.encode())
        await mount.publish_all()  # real files: a rescan lists them in the folder's own order
        held = await mount.resolve("a/s")
        await mount.readdir(held)  # listed once, cookies assigned
        moved = False

        async def between() -> None:
            nonlocal moved
            if not moved:
                moved = True
                await mount.rename("a", "b")
                mount.session.clock.advance(5.0)  # type: ignore[attr-defined]

        return [name for name, _ in await mount.readdir(held, room=2, between=between)]

    listed = mount.run(go)
    assert sorted(listed) == names, listed


def test_lookup_counts_and_forget_never_free_a_held_inode(mount: InProcessMount) -> None:
    async def go() -> None:
        await mount.write_file("x", b"1")
        ino = await mount.resolve("x")
        await mount.readdir(ROOT_INODE)
        held = mount.kernel.refs[ino]
        assert held == 3  # create, lookup, readdir entry
        await mount.forget([(ino, held - 1)])
        assert mount.ops.inodes.get(ino) is not None
        await mount.forget([(ino, 1)])
        assert mount.ops.inodes.get(ino) is None

    mount.run(go)


# -- bugs found before (each was a known bug, then fixed) -------------------------------------


def test_lookup_gives_a_written_file_its_size(mount: InProcessMount) -> None:
    async def go() -> None:
        await mount.write_file("x", b"hello")
        assert (await mount.lookup(ROOT_INODE, "x")).st_size == 5
        assert [a.st_size for _, a in await mount.readdir(ROOT_INODE)] == [5]

    mount.run(go)


def test_a_published_file_written_again_reads_at_once(mount: InProcessMount) -> None:
    async def go() -> None:
        await mount.write_file("x", b"old")
        await mount.publish_all()
        await mount.write_file("x", b"new!")  # lookup, open(O_WRONLY|O_TRUNC), write, release
        attrs = await mount.lookup(ROOT_INODE, "x")
        assert await mount.read_inode(attrs.st_ino) == b"new!"

    mount.run(go)


def test_a_published_file_truncated_reads_at_once(mount: InProcessMount) -> None:
    from tests.unit.inprocess import FakeSetattrFields

    async def go() -> None:
        await mount.mkdir("d")
        await mount.write_file("d/x", b"old data")
        await mount.publish_all()
        held = await mount.resolve("d/x")
        await mount.readdir(await mount.resolve("d"))
        attrs = pyfuse3.EntryAttributes()
        attrs.st_size = 3
        await mount.ops.setattr(held, attrs, FakeSetattrFields(update_size=True), None, mount.ctx)
        assert (await mount.lookup(await mount.resolve("d"), "x")).st_ino == held
        listed = await mount.readdir(await mount.resolve("d"))
        assert [(n, a.st_ino, a.st_size) for n, a in listed] == [("x", held, 3)]
        assert await mount.read_file("d/x") == b"old"
        await mount.publish_all()
        assert await mount.read_inode(held) == b"old"

    mount.run(go)


def test_a_folder_moved_onto_a_held_name_keeps_its_inode(mount: InProcessMount) -> None:
    async def go() -> None:
        await mount.write_file("b", b"file")
        await mount.publish_all()
        await mount.resolve("b")  # the kernel holds the real file's inode (an open, a cwd)
        await mount.unlink("b")
        held = await mount.mkdir("c")
        await mount.rename("c", "b")
        assert (await mount.lookup(ROOT_INODE, "b")).st_ino == held

    mount.run(go)


def test_a_renamed_published_file_keeps_its_inode(mount: InProcessMount) -> None:
    async def go() -> None:
        await mount.write_file("x", b"old")
        await mount.publish_all()
        held = await mount.resolve("x")
        await mount.rename("x", "y")
        await mount.write_file("x", b"new!")
        await mount.publish_all()
        assert await mount.read_inode(held) == b"old"  # the kernel's dentry "y" has it
        assert (await mount.lookup(ROOT_INODE, "y")).st_ino == held

    mount.run(go)


async def _over_a_published_file(mount: InProcessMount) -> None:
    """x published, then rsync's temp file renamed over it (spooled, in front of it)."""
    await mount.write_file("x", b"old")
    await mount.publish_all()
    await mount.write_file(".x.Ab12Cd", b"new")
    await mount.rename(".x.Ab12Cd", "x")
    assert await mount.read_file("x") == b"new"


def test_unlink_of_a_file_renamed_over_a_published_one(mount: InProcessMount) -> None:
    async def go() -> None:
        await _over_a_published_file(mount)
        await mount.unlink("x")
        assert await mount.listdir("") == []

    mount.run(go)


def test_rename_away_of_a_file_renamed_over_a_published_one(mount: InProcessMount) -> None:
    async def go() -> None:
        await _over_a_published_file(mount)
        await mount.rename("x", "z")
        assert await mount.listdir("") == ["z"]

    mount.run(go)


def test_a_published_file_renamed_over_a_spooled_one(mount: InProcessMount) -> None:
    async def go() -> None:
        await mount.write_file("x", b"moved here")
        await mount.publish_all()
        await mount.write_file("y", b"replaced")
        await mount.rename("x", "y")
        assert await mount.read_file("y") == b"moved here"
        await mount.publish_all()
        assert await mount.read_file("y") == b"moved here"

    mount.run(go)


def test_a_rename_while_the_mount_switches_to_the_published_file(mount: InProcessMount) -> None:
    async def go() -> None:
        await mount.write_file("d", b"data")
        published = mount.ops.published
        renamed = False

        async def switch(relpath: str) -> None:  # the rename gets the folder's lock first
            nonlocal renamed
            if not renamed:
                renamed = True
                await mount.rename("d", "b")
            await published(relpath)

        assert mount.queue is not None
        mount.queue.on_published = switch
        await mount.publish_all()
        await mount.publish_all()
        assert await mount.listdir("") == ["b"]
        assert await mount.read_file("b") == b"data"

    mount.run(go)


def test_a_rescan_that_races_a_rename_of_its_folder(mount: InProcessMount) -> None:
    scan = mount.tree.scan
    raced = False

    def scan_then_rename(folder: Path, *args: Any, **kwargs: Any) -> dict[str, Any]:
        nonlocal raced
        found = scan(folder, *args, **kwargs)
        if folder == mount.config.src / "a" and not raced:
            raced = True  # the rename lands while the rescan's thread is still out
            trio.from_thread.run(mount.rename, "a", "b")
        return found

    async def go() -> None:
        await mount.mkdir("a")
        await mount.write_file("a/x", b"spooled")
        held = await mount.resolve("a")
        mount.tree.scan = scan_then_rename  # type: ignore[method-assign]
        await mount.ops.rescan(held, force=True)
        assert raced
        assert await mount.read_file("b/x") == b"spooled"

    mount.run(go)


def test_a_file_open_in_a_folder_that_moves(mount: InProcessMount) -> None:
    async def go() -> None:
        await mount.mkdir("a")
        fh, _ino = await mount.create(await mount.resolve("a"), "x")
        await mount.ops.write(fh, 0, b"first half, ")
        await mount.rename("a", "b")
        await mount.publish_all()  # the queue must still see b/x as open
        await mount.ops.write(fh, 12, b"second half")
        await mount.ops.release(fh)
        await mount.publish_all()
        assert await mount.read_file("b/x") == b"first half, second half"

    mount.run(go)


def test_an_inode_looked_up_before_its_file_is_published(mount: InProcessMount) -> None:
    async def go() -> None:
        await mount.write_file("x", b"data")
        held = await mount.resolve("x")
        assert await mount.publish_all() == 1
        assert (await mount.ops.getattr(held, mount.ctx)).st_size == 4
        assert await mount.read_inode(held) == b"data"

    mount.run(go)


# -- shadowing: a spooled file in front of a published one ---------------------------------


@pytest.fixture
def keeping(tmp_path: Path) -> Iterator[InProcessMount]:
    """A mount without --allow-delete."""
    with fake_session() as session:
        src = tmp_path / "src"
        src.mkdir()
        m = InProcessMount(src, tmp_path, allow_delete=False)
        m.session = session  # type: ignore[attr-defined]
        yield m


def test_without_allow_delete_a_file_replacing_a_published_one_is_not_deleted(
    keeping: InProcessMount,
) -> None:
    async def go() -> None:
        await _over_a_published_file(keeping)
        with pytest.raises(pyfuse3.FUSEError) as caught:
            await keeping.unlink("x")
        assert caught.value.errno == errno.EPERM
        assert await keeping.read_file("x") == b"new"
        assert (keeping.config.src / "x").read_bytes() == b"old"
        await keeping.rename("x", "z")  # a rename keeps the data: allowed, the old one goes
        assert await keeping.listdir("") == ["z"]
        await keeping.publish_all()
        assert sorted(p.name for p in keeping.config.src.iterdir() if p.name[0] != ".") == ["z"]
        assert await keeping.read_file("z") == b"new"

    keeping.run(go)


def test_without_allow_delete_a_file_just_published_can_still_be_deleted(
    keeping: InProcessMount,
) -> None:
    """Its own published copy is in SRC before the mount switches to it: not an older
    version, so the unlink is allowed, and nothing of it is left."""

    async def go() -> None:
        await keeping.write_file("x", b"data")
        published = keeping.ops.published

        done = False

        async def switch(relpaths: list[str]) -> None:
            nonlocal done
            if not done:
                done = True
                assert (keeping.config.src / "x").is_file()
                await keeping.unlink("x")
            await published(relpaths)

        assert keeping.queue is not None
        keeping.queue.on_published = switch
        await keeping.publish_all()
        assert await keeping.listdir("") == []
        assert not (keeping.config.src / "x").exists()
        assert keeping.spooled() == {}

    keeping.run(go)


@pytest.mark.parametrize("how", ["open", "truncate", "open, rename"])
def test_without_allow_delete_a_published_file_opened_for_writing_is_not_deleted(
    keeping: InProcessMount, how: str
) -> None:
    """Opening a published file for writing moves it back into the spool: deleting it then
    deletes the published file, and needs --allow-delete like a plain unlink (it was allowed);
    a file never published stays deletable."""

    async def go() -> None:
        await keeping.mkdir("d")
        await keeping.write_file("d/x", b"published")
        await keeping.publish_all()
        assert (keeping.config.src / "d/x").read_bytes() == b"published"
        ino = await keeping.resolve("d/x")
        if how == "truncate":
            await keeping.ops.setattr(ino, _size_attr(0), _size_fields(), None, keeping.ctx)
        else:
            info = await keeping.ops.open(ino, os.O_WRONLY, keeping.ctx)
            await keeping.ops.write(info.fh, 0, b"PUB")
            await keeping.ops.release(info.fh)
        name = "d/x"
        if "rename" in how:
            await keeping.rename("d", "e")
            name = "e/x"
        with pytest.raises(pyfuse3.FUSEError) as caught:
            await keeping.unlink(name)
        assert caught.value.errno == errno.EPERM
        assert await keeping.read_file(name) in (b"PUBlished", b"")
        await keeping.write_file("d2", b"never published")
        await keeping.unlink("d2")  # a new file: its writer may take it back
        await keeping.publish_all()
        assert (keeping.config.src / name).is_file()

    keeping.run(go)


def _size_attr(size: int) -> pyfuse3.EntryAttributes:
    attr = pyfuse3.EntryAttributes()
    attr.st_size = size
    return attr


def _size_fields() -> Any:
    from tests.unit.inprocess import FakeSetattrFields

    return FakeSetattrFields(update_size=True)


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_real_file_renamed_over_one_being_switched_to_its_published_copy(
    mount: InProcessMount, when: str
) -> None:
    """The spooled y is published; x is renamed over y before or after the mount shows the
    published y: x wins, and the spooled y is never published over it."""

    async def go() -> None:
        await mount.write_file("x", b"moved here")
        await mount.publish_all()
        await mount.write_file("y", b"replaced")
        published = mount.ops.published

        done = False

        async def switch(relpaths: list[str]) -> None:
            nonlocal done
            if done:
                await published(relpaths)
                return
            done = True
            if when == "after":
                await published(relpaths)
            await mount.rename("x", "y")
            if when == "before":
                await published(relpaths)

        assert mount.queue is not None
        mount.queue.on_published = switch
        await mount.publish_all()
        mount.queue.on_published = published
        await mount.publish_all()
        assert await mount.listdir("") == ["y"]
        assert await mount.read_file("y") == b"moved here"
        assert (mount.config.src / "y").read_bytes() == b"moved here"
        assert mount.spooled() == {}

    mount.run(go)


def test_a_file_renamed_over_an_archive_and_away_takes_the_archive_along(
    mount: InProcessMount, tmp_path: Path
) -> None:
    import numpy as np
    import tifffile

    tif = tmp_path / "t.tif"
    tifffile.imwrite(tif, np.arange(64 * 64, dtype=np.uint16).reshape(64, 64))

    async def go() -> None:
        await mount.write_file("t.tif", tif.read_bytes())
        await mount.publish_all()
        assert (mount.config.src / "t.tif.zarr.zip").is_file()
        await mount.write_file(".t.tif.Ab12Cd", b"not a tiff any more")
        await mount.rename(".t.tif.Ab12Cd", "t.tif")
        await mount.rename("t.tif", "u")
        assert await mount.listdir("") == ["u"]
        await mount.publish_all()
        assert await mount.listdir("") == ["u"]
        assert sorted(p.name for p in mount.config.src.iterdir() if p.name[0] != ".") == ["u"]

    mount.run(go)


def test_a_published_file_renamed_while_its_spooled_name_is_still_there(
    mount: InProcessMount,
) -> None:
    """Found by the state machine: the mount shows the published x (a hard link of the spooled
    file) and x is renamed before the queue removes the spooled name. The rename changed the
    inode's ctime, so the queue took the spooled name for a newer version and published it
    again: x came back beside its new name."""

    async def go() -> None:
        await mount.write_file("x", b"data")
        published = mount.ops.published
        done = False

        async def switch(relpaths: list[str]) -> None:
            nonlocal done
            await published(relpaths)
            if not done:
                done = True
                await mount.rename("x", "y")

        assert mount.queue is not None
        mount.queue.on_published = switch
        await mount.publish_all()
        await mount.publish_all()
        assert await mount.listdir("") == ["y"]
        assert await mount.read_file("y") == b"data"
        assert sorted(p.name for p in mount.config.src.iterdir() if p.name[0] != ".") == ["y"]
        assert mount.spooled() == {}

    mount.run(go)


def test_a_lookup_that_races_the_switch_to_the_published_file(mount: InProcessMount) -> None:
    """Found by the state machine: lookup refreshes a spooled file's size in a worker thread;
    the mount switched to the published file meanwhile and the spooled copy went, and the
    lookup handed out a new inode for the spooled copy: open gave ENOENT."""
    assert mount.ops.writer is not None
    refresh = mount.ops.writer.refresh
    raced = False

    def refresh_then_publish(node: Any) -> Any:
        nonlocal raced
        fresh = refresh(node)
        if node.spooled and not raced:
            raced = True
            trio.from_thread.run(mount.publish_all)
        return fresh

    async def go() -> None:
        await mount.write_file("x", b"data")
        mount.ops._quick.until = float("inf")  # spool calls in worker threads
        mount.ops.writer.refresh = refresh_then_publish  # type: ignore[method-assign,union-attr]
        attrs = await mount.lookup(ROOT_INODE, "x")
        assert raced
        assert await mount.read_inode(attrs.st_ino) == b"data"

    mount.run(go)


def test_a_spooled_file_renamed_over_one_the_mount_is_switching_to(
    mount: InProcessMount,
) -> None:
    """Found by the state machine: the new file renamed over x while the mount switched x
    to its published (older) copy; the listing kept showing the older copy."""

    async def go() -> None:
        await mount.write_file("x", b"older")
        await mount.write_file("y", b"new")
        published = mount.ops.published
        done = False

        async def switch(relpaths: list[str]) -> None:
            nonlocal done
            if not done:
                done = True
                await mount.rename("y", "x")
            await published(relpaths)

        assert mount.queue is not None
        mount.queue.on_published = switch
        await mount.publish_all()
        assert await mount.listdir("") == ["x"]
        assert (await mount.lookup(ROOT_INODE, "x")).st_size == 3
        assert await mount.read_file("x") == b"new"
        mount.queue.on_published = published
        await mount.publish_all()
        assert await mount.read_file("x") == b"new"

    mount.run(go)


def test_a_folder_renamed_while_a_publish_takes_its_last_spooled_file(
    mount: InProcessMount,
) -> None:
    """Found by the state machine: the queue removed the folder's last spooled file (and the
    emptied spool folder) between the folder's rename in SRC and in the spool: the rename
    failed with ENOENT after SRC had moved."""
    spool = mount.tree.spool
    assert spool is not None and mount.queue is not None
    rename = spool.rename

    def emptied_first(old: str, new: str) -> None:
        if old == "c":
            spool.remove("c/x")  # what the switch does once the mount shows the published x
        rename(old, new)

    async def go() -> None:
        await mount.mkdir("c")
        await mount.write_file("c/x", b"data")
        batch = list(mount.queue.items.values())
        for item in batch:
            item.state = "packing"
        outcomes = await trio.to_thread.run_sync(mount.queue._work, batch)
        spool.rename = emptied_first  # type: ignore[method-assign]
        await mount.rename("c", "d")
        await mount.queue._settle(batch, outcomes)
        await mount.publish_all()
        assert await mount.listdir("") == ["d"]
        assert await mount.listdir("d") == ["x"]
        assert await mount.read_file("d/x") == b"data"

    mount.run(go)


def test_a_missing_name_is_a_negative_entry_and_a_new_one_is_invalidated(
    mount: InProcessMount,
) -> None:
    """rsync asks for each name three times before creating it: the kernel may remember that
    it is missing. A name that then appears in SRC by other means is invalidated when a
    rescan finds it, so the kernel asks again."""

    async def go() -> None:
        await mount.write_file("x", b"here")
        attrs = await mount.ops.lookup(ROOT_INODE, b"y", mount.ctx)
        assert attrs.st_ino == 0 and attrs.entry_timeout > 0
        (mount.config.src / "y").write_bytes(b"dropped in")
        mount.session.invalidated.clear()  # type: ignore[attr-defined]
        await mount.ops.rescan(ROOT_INODE, force=True)
        assert (ROOT_INODE, b"y") in mount.session.invalidated  # type: ignore[attr-defined]
        assert await mount.read_file("y") == b"dropped in"

    mount.run(go)


def test_a_file_published_into_a_folder_new_to_src_is_found_at_once(
    mount: InProcessMount,
) -> None:
    """An inbox drop publishes `run1/x.csv` into a `run1/` made for it. The kernel holds only
    the root: the publish must show `run1` there, or a lookup right after the status says
    "done" gets ENOENT until the watcher's rescan arrives (a flake in the inbox mount test)."""

    async def go() -> None:
        assert await mount.listdir("") == []
        drop = mount.config.src / ".decant-spool" / "files" / "run1" / "x.csv"
        drop.parent.mkdir(parents=True)
        drop.write_bytes(b"a,b\n1,2\n")
        assert await mount.publish_all() == 1
        assert (mount.config.src / "run1" / "x.csv").is_file()
        assert await mount.read_file("run1/x.csv") == b"a,b\n1,2\n"  # no rescan in between

    mount.run(go)


def test_marks_of_rewritten_published_files_do_not_pile_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each published file opened for writing is marked until it is published again; the
    marks of those published since are pruned as more come, not kept for ever."""
    from vfs.ingest import writeside

    monkeypatch.setattr(writeside, "ADOPTED_PRUNE", 4)
    with fake_session():
        (tmp_path / "src").mkdir()
        m = InProcessMount(tmp_path / "src", tmp_path, allow_delete=False)
        sizes = []

        async def go() -> None:
            for r in range(6):
                for i in range(5):
                    await m.write_file(f"r{r}-{i}", b"first")
                await m.publish_all()
                for i in range(5):
                    await m.write_file(f"r{r}-{i}", b"again")  # opened for writing: adopted
                await m.publish_all()
                assert m.ops.writer is not None
                sizes.append(len(m.ops.writer._adopted))

        m.run(go)
    assert max(sizes) <= 10, sizes  # a round's five, and at most the five before them


def test_a_release_that_waits_on_a_thread_while_its_file_is_renamed_closes_the_new_name(
    mount: InProcessMount,
) -> None:
    """rsync closes its temp file and renames it at once; FUSE's release comes whenever it
    comes. A release that handed a call to a worker thread (QuickCalls in its cooldown, as on
    a loaded disk) before telling the queue let the rename run meanwhile: the open count
    moved to the new name while the release closed the old one, and the file was never
    published (found in CI: one of `test_rsync_of_3000_small_files` stayed spooled)."""

    async def go() -> None:
        fh, _ino = await mount.create(ROOT_INODE, ".a.txt.Xy12Ab")
        assert await mount.ops.write(fh, 0, b"data") == 4
        mount.ops._quick.until = time.monotonic() + 3600  # every quick call to a thread
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mount.ops.release, fh)
            await trio.sleep(0)  # the release is waiting on its thread now
            await mount.rename(".a.txt.Xy12Ab", "a.txt")
        queue = mount.queue
        assert queue is not None
        assert queue.open_counts == {}, queue.open_counts
        assert await mount.publish_all() == 1
        assert (mount.tree.root / "a.txt").read_bytes() == b"data"

    mount.run(go)
