"""DecantOperations driven in-process, without /dev/fuse: a harness for handler-level tests.

`InProcessMount` wires a SourceTree, WriteSide, PackQueue and DecantOperations over a SRC folder
the way vfs/mount/daemon.py does, and plays the kernel: every inode a reply hands out (lookup,
create, mkdir, each readdir entry accepted) is counted in `Kernel`, so a test can forget exactly
what the kernel would. The pyfuse3 calls that need a live session are replaced while
`fake_session()` is active (`readdir_reply` fills a `Token` until its room runs out).

Handler calls are coroutines: run them with `InProcessMount.run` (trio.run plus the daemon's
background nursery). Everything here raises what the handler
raised (`pyfuse3.FUSEError` with the errno a syscall would see).
"""

from __future__ import annotations

import errno
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyfuse3
import trio

from vfs.cache import PageCache
from vfs.ingest.queue import PackQueue
from vfs.ingest.writeside import WriteSide
from vfs.mount import ops as ops_module
from vfs.mount.config import MountConfig
from vfs.mount.daemon import build_tree, build_write_side
from vfs.mount.inodes import ROOT_INODE
from vfs.mount.ops import DecantOperations

READ_CHUNK = 4096


@dataclass
class FakeContext:
    """What pyfuse3.RequestContext carries (its attributes cannot be set from Python)."""

    uid: int = 0
    gid: int = 0
    pid: int = 0
    umask: int = 0o022


@dataclass
class FakeSetattrFields:
    update_atime: bool = False
    update_mtime: bool = False
    update_mode: bool = False
    update_uid: bool = False
    update_gid: bool = False
    update_size: bool = False


@dataclass
class Token:
    """A readdir reply buffer with room for `room` entries (then readdir_reply says False)."""

    room: int
    entries: list[tuple[str, pyfuse3.EntryAttributes, int]] = field(default_factory=list)


class Clock:
    """ops.py's `time`, with a monotonic clock that moves only when told (listings go stale
    after RESCAN_INTERVAL: a test decides when that happens, not the machine's speed)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@dataclass
class Session:
    """What the fake pyfuse3 session recorded, and the clock ops.py sees."""

    invalidated: list[tuple[int, bytes]] = field(default_factory=list)
    sup_groups: list[int] = field(default_factory=list)
    clock: Clock = field(default_factory=Clock)

    def readdir_reply(
        self, token: Token, name: bytes, attrs: pyfuse3.EntryAttributes, next_id: int
    ) -> bool:
        if len(token.entries) >= token.room:
            return False
        token.entries.append((os.fsdecode(name), attrs, next_id))
        return True

    def invalidate_entry_async(
        self, inode: int, name: bytes, deleted: int = 0, ignore_enoent: bool = False
    ) -> None:
        self.invalidated.append((inode, name))

    def invalidate_entry(self, inode: int, name: bytes, deleted: int = 0) -> None:
        """(a worker thread: `LetGo`) Recorded as the async form is."""
        self.invalidated.append((inode, name))

    def get_sup_groups(self, pid: int) -> list[int]:
        return list(self.sup_groups)


@contextmanager
def fake_session() -> Iterator[Session]:
    """Replace pyfuse3's session-bound functions, and ops.py's clock, for the duration."""
    session = Session()
    names = ("readdir_reply", "invalidate_entry_async", "invalidate_entry", "get_sup_groups")
    saved = {name: getattr(pyfuse3, name) for name in names}
    try:
        for name in names:
            setattr(pyfuse3, name, getattr(session, name))
        ops_module.time = session.clock  # type: ignore[assignment]
        yield session
    finally:
        ops_module.time = time
        for name, fn in saved.items():
            setattr(pyfuse3, name, fn)


class Kernel:
    """The kernel's lookup counts: +1 per inode a reply hands out; forget gives them back."""

    def __init__(self) -> None:
        self.refs: Counter[int] = Counter()

    def took(self, ino: int) -> None:
        if ino != ROOT_INODE:
            self.refs[ino] += 1

    def give_back(self, ino: int, n: int) -> None:
        left = self.refs[ino] - n
        if left < 0:
            raise AssertionError(f"the kernel never held {n} references to inode {ino}")
        if left:
            self.refs[ino] = left
        else:
            del self.refs[ino]


def errno_of(exc: BaseException) -> int | None:
    return exc.errno if isinstance(exc, pyfuse3.FUSEError) else None


class InProcessMount:
    """One writable (or read-only) mount's handlers over `src`, wired as the daemon wires them."""

    def __init__(
        self,
        src: Path,
        work: Path,
        *,
        read_only: bool = False,
        allow_delete: bool = True,
        pack_all: bool = False,
        settle: float = 0.0,
        ctx: FakeContext | None = None,
        use_index: bool = False,
    ) -> None:
        self.config = MountConfig(src, work / "mnt", use_index=use_index, read_only=read_only,
                                  allow_delete=allow_delete, pack_all=pack_all,
                                  settle=settle, cache_size=16 << 20,
                                  index_dir=work / "mnt-index")  # fmt: skip
        self.tree = build_tree(self.config, PageCache(self.config.cache_size))
        self.queue: PackQueue | None = build_write_side(self.config, self.tree)
        writer = None
        if self.queue is not None and self.tree.spool is not None:
            writer = WriteSide(src, self.tree.spool, allow_delete)
        self.ops = DecantOperations(self.tree, self.config, writer, self.queue)
        if self.queue is not None:
            self.queue.on_published = self.ops.published
        self.kernel = Kernel()
        self.ctx = ctx or FakeContext()

    def run(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """`trio.run(fn, *args)` with the nursery the daemon gives background work (hashing what
        is served, read-ahead, verification); what is still running at the end is cancelled."""

        async def serving() -> Any:
            failed: Exception | None = None
            async with trio.open_nursery() as nursery:
                self.ops.nursery = nursery
                nursery.start_soon(self.ops.let_go.run)
                try:
                    result = await fn(*args)
                except Exception as exc:  # raised as it is, not in the nursery's group
                    failed = exc
                finally:
                    self.ops.nursery = None
                    nursery.cancel_scope.cancel()
            if failed is not None:
                raise failed
            return result

        return trio.run(serving)

    # -- the kernel's side of each reply ---------------------------------------------------

    async def lookup(self, parent: int, name: str) -> pyfuse3.EntryAttributes:
        attrs = await self.ops.lookup(parent, os.fsencode(name), self.ctx)
        if attrs.st_ino == 0:  # a negative entry: the caller sees ENOENT
            raise pyfuse3.FUSEError(errno.ENOENT)
        self.kernel.took(attrs.st_ino)
        return attrs

    async def resolve(self, path: str) -> int:
        """The inode of a presented path ("" is the root), looked up component by component."""
        ino = ROOT_INODE
        for part in [p for p in path.split("/") if p]:
            ino = (await self.lookup(ino, part)).st_ino
        return ino

    async def readdir(
        self,
        ino: int,
        room: int = 1000,
        between: Callable[[], Awaitable[Any]] | None = None,
    ) -> list[tuple[str, pyfuse3.EntryAttributes]]:
        """opendir + readdir in batches of `room` entries (+ `between` after each) + release."""
        fh = await self.ops.opendir(ino, self.ctx)
        out: list[tuple[str, pyfuse3.EntryAttributes]] = []
        start = 0
        while True:
            token = Token(room)
            await self.ops.readdir(fh, start, token)  # type: ignore[arg-type]
            for name, attrs, cookie in token.entries:
                self.kernel.took(attrs.st_ino)
                out.append((name, attrs))
                start = cookie
            if len(token.entries) < room:
                await self.ops.releasedir(fh)
                return out
            if between is not None:
                await between()

    async def listdir(self, path: str, room: int = 1000) -> list[str]:
        return [name for name, _ in await self.readdir(await self.resolve(path), room)]

    async def create(self, parent: int, name: str, mode: int = 0o644) -> tuple[int, int]:
        """(fh, inode) of a new file open for writing."""
        info, attrs = await self.ops.create(
            parent, os.fsencode(name), mode, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self.ctx
        )
        self.kernel.took(attrs.st_ino)
        return info.fh, attrs.st_ino

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> int:
        """What `open(O_WRONLY|O_CREAT|O_TRUNC)`, one write, `close` do; returns the inode."""
        parent_path, _, name = path.rpartition("/")
        parent = await self.resolve(parent_path)
        try:
            ino = (await self.lookup(parent, name)).st_ino
        except pyfuse3.FUSEError as exc:
            if exc.errno != errno.ENOENT:
                raise
            fh, ino = await self.create(parent, name, mode)
        else:
            info = await self.ops.open(ino, os.O_WRONLY | os.O_TRUNC, self.ctx)
            fh = info.fh
        try:
            if data:
                assert await self.ops.write(fh, 0, data) == len(data)
        finally:
            await self.ops.release(fh)
        return ino

    async def read_file(self, path: str) -> bytes:
        return await self.read_inode(await self.resolve(path))

    async def read_inode(self, ino: int) -> bytes:
        info = await self.ops.open(ino, os.O_RDONLY, self.ctx)
        chunks = []
        try:
            off = 0
            while True:
                data = bytes(await self.ops.read(info.fh, off, READ_CHUNK))
                if not data:
                    return b"".join(chunks)
                chunks.append(data)
                off += len(data)
        finally:
            await self.ops.release(info.fh)

    async def mkdir(self, path: str, mode: int = 0o755) -> int:
        parent_path, _, name = path.rpartition("/")
        parent = await self.resolve(parent_path)
        attrs = await self.ops.mkdir(parent, os.fsencode(name), mode, self.ctx)
        self.kernel.took(attrs.st_ino)
        return attrs.st_ino

    async def rmdir(self, path: str) -> None:
        parent_path, _, name = path.rpartition("/")
        await self.ops.rmdir(await self.resolve(parent_path), os.fsencode(name), self.ctx)

    async def unlink(self, path: str) -> None:
        parent_path, _, name = path.rpartition("/")
        await self.ops.unlink(await self.resolve(parent_path), os.fsencode(name), self.ctx)

    async def rename(self, old: str, new: str, flags: int = 0) -> None:
        old_parent, _, old_name = old.rpartition("/")
        new_parent, _, new_name = new.rpartition("/")
        await self.ops.rename(
            await self.resolve(old_parent), os.fsencode(old_name),
            await self.resolve(new_parent), os.fsencode(new_name), flags, self.ctx,
        )  # fmt: skip

    async def forget(self, pairs: list[tuple[int, int]]) -> None:
        for ino, n in pairs:
            self.kernel.give_back(ino, n)
        await self.ops.forget(pairs)

    async def forget_all(self) -> None:
        """What the kernel does under memory pressure (drop_caches): forget every inode."""
        await self.forget(list(self.kernel.refs.items()))

    # -- the pack queue --------------------------------------------------------------------

    async def publish_all(self) -> int:
        """One pass of the queue's work, without settling: pick up the spool, pack and publish
        every file no handle holds. Returns how many were published."""
        from vfs.ingest.queue import WAITING

        queue = self.queue
        assert queue is not None
        await queue._walk()
        before = queue.done
        batch = [item for key, item in list(queue.items.items())
                 if item.state in WAITING and item.state != "temp"
                 and not (key[0] == 0 and queue.open_counts.get(item.relpath))]  # fmt: skip
        for item in batch:
            item.state, item.started = "packing", False
        if batch:
            outcomes = await trio.to_thread.run_sync(queue._work, batch)
            await queue._settle(batch, outcomes)
        return queue.done - before

    def spooled(self) -> dict[str, os.stat_result]:
        assert self.tree.spool is not None
        return self.tree.spool.walk()

    def spooled_below(self, reldir: str) -> list[str]:
        """Relpaths of the files spooled below the presented folder `reldir`."""
        return [rel for rel in self.spooled() if rel.startswith(reldir + "/")]

    def spool_path(self, relpath: str) -> Path:
        """Where `relpath` would be spooled (whether or not it is)."""
        assert self.tree.spool is not None
        return self.tree.spool.path(relpath)
