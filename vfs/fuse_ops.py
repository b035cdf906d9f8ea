"""The pyfuse3 adapter: inode table, handlers, and the one errno boundary. No format logic here."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyfuse3
import trio

from vfs.backends.base import RandomAccess
from vfs.backends.plain import BytesFile, PlainFile, SpoolFile
from vfs.errors import DecantError
from vfs.integrity import Coverage, SequentialHasher
from vfs.tree import Node, NodeKey, SourceTree
from vfs.watcher import PackQueue
from vfs.writeside import Attrs, WriteSide

log = logging.getLogger(__name__)

ARCHIVE_TIMEOUT = 300.0  # archive contents never change in place: let the kernel keep them
MIRROR_TIMEOUT = 2.0  # SRC itself can change; the watcher invalidates sooner when it can
RESCAN_INTERVAL = 1.0  # a folder's mtime is re-checked at most this often
HASH_BACKLOG = 32  # served reads queued for hashing before reads wait for the hasher
VERDICT_WAIT = 5.0  # how long the last read waits for earlier reads' bytes to be hashed
STATUS_NAME = ".decant-status"  # read-only: what the pack queue holds, as JSON


@contextmanager
def errno_boundary(what: str) -> Iterator[None]:
    """Every handler runs inside this: pyfuse3 stops the daemon on any non-FUSEError exception."""
    try:
        yield
    except pyfuse3.FUSEError:
        raise
    except DecantError as exc:
        log.error("%s: %s", what, exc)
        raise pyfuse3.FUSEError(exc.errno) from None
    except OSError as exc:
        if exc.errno not in (errno.ENOENT,):
            log.warning("%s: %s", what, exc)
        raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
    except Exception:
        log.exception("%s: unexpected error", what)
        raise pyfuse3.FUSEError(errno.EIO) from None


@dataclass
class OpenFile:
    node: Node
    inode: int
    reader: RandomAccess
    fd: int = -1  # a spooled file's descriptor, for writing
    hasher: SequentialHasher | None = None
    hash_queue: trio.MemorySendChannel[tuple[int, bytes | memoryview]] | None = None
    hash_done: trio.Event = field(default_factory=trio.Event)
    served: Coverage = field(default_factory=Coverage)
    last_end: int = -1
    readahead_done: trio.Event | None = None


@dataclass
class DirState:
    children: dict[str, int]
    mtime_ns: int
    checked: float


class DecantOperations(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(
        self,
        tree: SourceTree,
        decode_threads: int = 4,
        writer: WriteSide | None = None,
        queue: PackQueue | None = None,
    ) -> None:
        super().__init__()
        self.tree = tree
        self.writer = writer
        self.queue = queue
        self.nursery: trio.Nursery | None = None
        self._nodes: dict[int, Node] = {pyfuse3.ROOT_INODE: tree.root_node()}
        self._inode_of: dict[NodeKey, int] = {
            self._nodes[pyfuse3.ROOT_INODE].key: pyfuse3.ROOT_INODE
        }
        self._dirs: dict[int, DirState] = {}
        self._next_inode = pyfuse3.ROOT_INODE + 1
        self._handles: dict[int, OpenFile] = {}
        self._next_fh = 1
        self._decode = trio.CapacityLimiter(decode_threads)
        self._readahead = trio.CapacityLimiter(2)
        self._scan_lock = trio.Lock()
        self._bad: set[NodeKey] = set()

    # -- inode table -----------------------------------------------------------------------

    def _inode(self, node: Node) -> int:
        ino = self._inode_of.get(node.key)
        if ino is None:
            ino = self._inode_of[node.key] = self._next_inode
            self._next_inode += 1
        self._nodes[ino] = node
        return ino

    def _node(self, inode: int) -> Node:
        node = self._nodes.get(inode)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node

    async def _children(self, inode: int) -> dict[str, int]:
        node = self._node(inode)
        if not node.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        state = self._dirs.get(inode)
        if node.backend is not None:
            if state is None:
                kids = await trio.to_thread.run_sync(self.tree.children_of_archive_node, node)
                state = self._dirs[inode] = DirState(self._adopt(kids), 0, 0.0)
            return state.children
        if state is not None and time.monotonic() - state.checked < RESCAN_INTERVAL:
            return state.children
        return await self.rescan(inode)

    def _is_status(self, parent_inode: int, name: bytes) -> bool:
        return (
            parent_inode == pyfuse3.ROOT_INODE
            and self.queue is not None
            and name == STATUS_NAME.encode()
        )

    def _status_inode(self) -> int:
        node = Node(False, 0, time.time_ns(), 0o444, os.getuid(), os.getgid(), self.tree.root,
                    member=STATUS_NAME)  # fmt: skip
        return self._inode(node)

    def status_bytes(self) -> bytes:
        assert self.queue is not None
        return (json.dumps(self.queue.status(), indent=1) + "\n").encode()

    def _adopt(self, kids: dict[str, Node]) -> dict[str, int]:
        return {name: self._inode(child) for name, child in kids.items()}

    async def rescan(self, inode: int, force: bool = False) -> dict[str, int]:
        """Re-read a mirrored folder if its mtime moved; invalidate what the kernel cached."""
        node = self._node(inode)
        async with self._scan_lock:
            state = self._dirs.get(inode)
            mtime = (await trio.to_thread.run_sync(os.stat, node.real)).st_mtime_ns
            if state is not None and state.mtime_ns == mtime and not force:
                state.checked = time.monotonic()
                return state.children
            kids = await trio.to_thread.run_sync(self.tree.scan, node.real)
            old = state.children if state else {}
            new = self._adopt(kids)
            self._dirs[inode] = DirState(new, mtime, time.monotonic())
        if state is not None:
            for name, ino in old.items():
                if new.get(name) != ino:
                    pyfuse3.invalidate_entry_async(inode, os.fsencode(name), ignore_enoent=True)
        return new

    def _attrs(self, inode: int, node: Node) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = inode
        a.generation = 0
        timeout = ARCHIVE_TIMEOUT if node.backend is not None else MIRROR_TIMEOUT
        a.entry_timeout = a.attr_timeout = timeout
        a.st_mode = (stat.S_IFDIR if node.is_dir else stat.S_IFREG) | node.mode
        a.st_nlink = 2 if node.is_dir else 1
        a.st_uid, a.st_gid = node.uid, node.gid
        a.st_size = node.size
        a.st_blksize = 128 * 1024
        a.st_blocks = (node.size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = node.mtime_ns
        return a

    # -- namespace handlers ----------------------------------------------------------------

    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        with errno_boundary(f"lookup {name!r}"):
            ino = (await self._children(parent_inode)).get(os.fsdecode(name))
            if ino is None and self._is_status(parent_inode, name):
                ino = self._status_inode()  # found by name only: listings and rsync skip it
            if ino is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._attrs(ino, self._nodes[ino])

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        with errno_boundary(f"getattr {inode}"):
            node = self._node(inode)
            if node.spooled and self.writer is not None:
                node = self._nodes[inode] = self.writer.refresh(node)  # writes move its size
            elif node.member == STATUS_NAME and node.backend is None:
                node.size = len(self.status_bytes())
            return self._attrs(inode, node)

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        with errno_boundary(f"opendir {inode}"):
            await self._children(inode)
            return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        with errno_boundary(f"readdir {fh}"):
            items = sorted((await self._children(fh)).items())
            for i, (name, ino) in enumerate(items[start_id:], start=start_id + 1):
                if not pyfuse3.readdir_reply(
                    token, os.fsencode(name), self._attrs(ino, self._nodes[ino]), i
                ):
                    break

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        with errno_boundary("statfs"):
            st = await trio.to_thread.run_sync(os.statvfs, self.tree.root)
            out = pyfuse3.StatvfsData()
            for name in (
                "f_bsize",
                "f_frsize",
                "f_blocks",
                "f_bfree",
                "f_bavail",
                "f_files",
                "f_ffree",
                "f_favail",
                "f_namemax",
            ):
                setattr(out, name, getattr(st, name))
            return out

    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        with errno_boundary(f"getxattr {inode}"):
            value = self._node(inode).xattrs.get(os.fsdecode(name))
            if value is None:
                raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
            return value.encode()

    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        with errno_boundary(f"listxattr {inode}"):
            return [os.fsencode(k) for k in self._node(inode).xattrs]

    async def forget(self, inode_list: Any) -> None:
        return None  # inodes stay stable for the life of the mount; nodes are small

    # -- file handlers ---------------------------------------------------------------------

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        with errno_boundary(f"open {inode}"):
            node = self._node(inode)
            if node.is_dir:
                raise pyfuse3.FUSEError(errno.EISDIR)
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
                return await self._open_for_write(inode, node, flags)
            if node.member == STATUS_NAME and node.backend is None:
                return self._new_handle(OpenFile(node, inode, BytesFile(self.status_bytes())),
                                        direct_io=True)  # fmt: skip
            if node.key in self._bad:
                raise pyfuse3.FUSEError(errno.EIO)
            reader = await trio.to_thread.run_sync(self._open_reader, node)
            handle = OpenFile(node, inode, reader)
            if node.sha256 and node.backend is not None:
                verified = await trio.to_thread.run_sync(self._is_verified, node)
                if not verified and self.nursery is not None:
                    handle.hasher = SequentialHasher(node.size, node.sha256)
                    self._start_hashing(handle)
            if node.spooled and self.queue is not None:
                self.queue.opened(node.spooled)
            # Archive content is immutable for a given inode (a replaced archive gets a new one),
            # so the kernel may keep its pages; a mirrored real file may change under us.
            return self._new_handle(handle, keep_cache=node.backend is not None)

    def _new_handle(self, handle: OpenFile, **info: bool) -> pyfuse3.FileInfo:
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = handle
        return pyfuse3.FileInfo(fh=fh, **info)

    def _open_reader(self, node: Node) -> RandomAccess:
        if node.backend is None:
            return PlainFile(node.real)
        assert node.entry is not None
        return node.backend.open(node.real, node.member, node.entry)

    def _is_verified(self, node: Node) -> bool:
        index = self.tree.index
        if index is None or not node.sha256:
            return False
        st = os.stat(node.real)
        return index.is_verified(node.real, node.member, st.st_size, st.st_mtime_ns, node.sha256)

    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:  # type: ignore[override]
        handle = self._handles.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        with errno_boundary(f"read {handle.node.real} {handle.node.member}".rstrip()):
            if handle.node.key in self._bad:
                raise pyfuse3.FUSEError(errno.EIO)
            # Bytes already decoded are served here: a thread hop per 1 MiB request costs more
            # than the slicing it would move off the loop.
            fast = getattr(handle.reader, "read_cached", None)
            data = fast(off, size) if fast is not None else None
            if data is None:
                data = await trio.to_thread.run_sync(
                    handle.reader.read, off, size, limiter=self._decode
                )
            if handle.hash_queue is not None and data and not handle.hash_done.is_set():
                await handle.hash_queue.send((off, data))
                if handle.served.add(off, off + len(data)) >= handle.node.size:
                    await self._verdict(handle)  # every byte is queued: the hash can finish
            sequential = off == handle.last_end
            handle.last_end = off + len(data)
            if sequential and handle.readahead_done is None and self.nursery is not None:
                handle.readahead_done = trio.Event()
                self._spawn(self._read_ahead, handle)
            return data

    def _spawn(self, fn: Any, *args: Any) -> None:
        """A background task that can fail without taking the daemon down with it."""

        async def guarded() -> None:
            try:
                await fn(*args)
            except Exception:
                log.exception("background task %s failed", getattr(fn, "__name__", fn))

        assert self.nursery is not None
        self.nursery.start_soon(guarded)

    def _start_hashing(self, handle: OpenFile) -> None:
        """Hash-as-you-serve off the read path: reads queue their bytes and return at once; only
        the read that reaches the end of the file waits for the verdict."""
        assert self.nursery is not None and handle.hasher is not None
        send, receive = trio.open_memory_channel[tuple[int, bytes | memoryview]](HASH_BACKLOG)
        handle.hash_queue = send
        self._spawn(self._hash_worker, handle, receive)

    async def _hash_worker(
        self, handle: OpenFile, receive: trio.MemoryReceiveChannel[tuple[int, bytes | memoryview]]
    ) -> None:
        hasher = handle.hasher
        assert hasher is not None
        async with receive:
            async for off, data in receive:
                completed = await trio.to_thread.run_sync(hasher.feed, off, data)
                if completed or hasher.abandoned:
                    break
        handle.hash_done.set()
        if not hasher.complete:
            return
        node = handle.node
        if hasher.ok:
            log.info("%s: verified sha256 on a full read", node.real)
            if self.tree.index is not None:
                await trio.to_thread.run_sync(self._mark_verified, node)
            return
        self._bad.add(node.key)
        log.error(
            "%s%s: reconstructed bytes hash to %s, not the recorded %s — refusing to serve it",
            node.real,
            f" ({node.member})" if node.member else "",
            hasher.hexdigest(),
            hasher.expected,
        )

    async def _verdict(self, handle: OpenFile) -> None:
        """Fail the read that completes the file when the whole file hashed wrong."""
        with trio.move_on_after(VERDICT_WAIT):  # reads still in flight fill the gaps by then
            await handle.hash_done.wait()
        hasher = handle.hasher
        if hasher is not None and hasher.complete and not hasher.ok:
            # No invalidate_inode: notifying while the kernel holds this file's pages for
            # pending reads deadlocks both. Cached pages stay unreachable: every open now fails.
            raise pyfuse3.FUSEError(errno.EIO)

    def _mark_verified(self, node: Node) -> None:
        st = os.stat(node.real)
        assert self.tree.index is not None and node.sha256
        self.tree.index.mark_verified(
            node.real, node.member, st.st_size, st.st_mtime_ns, node.sha256
        )

    async def _read_ahead(self, handle: OpenFile) -> None:
        """Keep decoding ahead for as long as the reader keeps moving forward."""
        try:
            while True:
                pos = handle.last_end
                await trio.to_thread.run_sync(
                    handle.reader.readahead, pos - 1, limiter=self._readahead
                )
                if handle.last_end == pos:
                    break
        except Exception as exc:  # a failed read-ahead only costs the later read its own decode
            log.debug("read-ahead in %s failed: %s", handle.node.real, exc)
        finally:
            assert handle.readahead_done is not None
            handle.readahead_done.set()
            handle.readahead_done = None

    async def release(self, fh: int) -> None:
        handle = self._handles.pop(fh, None)
        if handle is None:
            return
        with errno_boundary(f"release {handle.node.real}"):
            if handle.readahead_done is not None:
                # The reader's descriptor must outlive a read-ahead still using it.
                await handle.readahead_done.wait()
            if handle.node.spooled and self.queue is not None:
                self.queue.closed(handle.node.spooled)
            if handle.hash_queue is not None:
                await handle.hash_queue.aclose()
            await trio.to_thread.run_sync(handle.reader.close)

    # -- change notification ---------------------------------------------------------------

    def dir_inode_of(self, path: Path) -> int | None:
        """Inode of a mirrored folder, if the kernel has seen it."""
        ino = self._inode_of.get((str(path), "", "", ()))
        return ino if ino in self._dirs else None

    async def on_changed(self, folders: set[Path]) -> None:
        for folder in folders:
            ino = self.dir_inode_of(folder)
            if ino is not None:
                with contextlib.suppress(OSError):  # gone: its parent's rescan drops it
                    await self.rescan(ino)
        # A document deep inside a collection changed: rebuild the collection's view.
        roots = {r for r in self.tree.overlay_roots for f in folders if f == r or r in f.parents}
        for root in roots:
            ino = self.dir_inode_of(root)
            if ino is not None:
                with contextlib.suppress(OSError):
                    await self.rescan(ino, force=True)

    # -- the write side (a writable mount) -------------------------------------------------

    def _writer(self) -> WriteSide:
        if self.writer is None:
            raise pyfuse3.FUSEError(errno.EROFS)
        return self.writer

    async def _child(self, parent_inode: int, name: bytes) -> tuple[Node, str, int | None]:
        children = await self._children(parent_inode)
        text = os.fsdecode(name)
        return self._nodes[parent_inode], text, children.get(text)

    def _place(self, parent_inode: int, name: str, node: Node, ino: int | None = None) -> int:
        """Point `name` in a folder at `node` (reusing `ino` when an inode moves)."""
        if ino is None:
            ino = self._inode(node)
        else:
            self._inode_of[node.key] = ino
            self._nodes[ino] = node
        self._dirs[parent_inode].children[name] = ino
        return ino

    def _touch(self, node: Node) -> None:
        if node.spooled and self.queue is not None:
            self.queue.touch(node.spooled)

    async def _open_for_write(self, inode: int, node: Node, flags: int) -> pyfuse3.FileInfo:
        writer = self._writer()
        new, fd = await trio.to_thread.run_sync(writer.open_for_write, node, flags)
        self._inode_of[new.key] = inode
        self._nodes[inode] = new
        self._touch(new)
        assert self.queue is not None
        self.queue.opened(new.spooled)
        return self._new_handle(OpenFile(new, inode, SpoolFile(fd), fd=fd))

    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        with errno_boundary(f"create {name!r}"):
            writer = self._writer()
            parent, text, _ = await self._child(parent_inode, name)
            node, fd = await trio.to_thread.run_sync(
                writer.create, parent, text, mode, ctx.uid, ctx.gid
            )
            ino = self._place(parent_inode, text, node)
            self._touch(node)
            assert self.queue is not None
            self.queue.opened(node.spooled)
            info = self._new_handle(OpenFile(node, ino, SpoolFile(fd), fd=fd))
            return info, self._attrs(ino, node)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self._handles.get(fh)
        if handle is None or handle.fd < 0:
            raise pyfuse3.FUSEError(errno.EBADF)
        with errno_boundary(f"write {handle.node.spooled}"):
            written = await trio.to_thread.run_sync(os.pwrite, handle.fd, buf, off)
            self._touch(handle.node)
            return written

    async def fsync(self, fh: int, datasync: bool) -> None:
        handle = self._handles.get(fh)
        if handle is not None and handle.fd >= 0:
            with errno_boundary(f"fsync {handle.node.spooled}"):
                await trio.to_thread.run_sync(os.fsync, handle.fd)

    async def flush(self, fh: int) -> None:
        return None  # writes go straight to the spooled file

    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        with errno_boundary(f"setattr {inode}"):
            writer = self._writer()
            node = self._node(inode)
            attrs = Attrs(
                size=attr.st_size if fields.update_size else None,
                mode=attr.st_mode if fields.update_mode else None,
                uid=attr.st_uid if fields.update_uid else None,
                gid=attr.st_gid if fields.update_gid else None,
                atime_ns=attr.st_atime_ns if fields.update_atime else None,
                mtime_ns=attr.st_mtime_ns if fields.update_mtime else None,
            )
            new = await trio.to_thread.run_sync(writer.setattr, node, attrs)
            self._inode_of[new.key] = inode
            self._nodes[inode] = new
            self._touch(new)
            return self._attrs(inode, new)

    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        with errno_boundary(f"rename {name_old!r} -> {name_new!r}"):
            writer = self._writer()
            old_parent, old, ino = await self._child(parent_inode_old, name_old)
            new_parent, new, existing = await self._child(parent_inode_new, name_new)
            if ino is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            if flags & pyfuse3.RENAME_EXCHANGE:
                raise pyfuse3.FUSEError(errno.EINVAL)
            if flags & pyfuse3.RENAME_NOREPLACE and existing is not None:
                raise pyfuse3.FUSEError(errno.EEXIST)
            node = self._nodes[ino]
            moved = await trio.to_thread.run_sync(
                writer.rename, old_parent, old, node, new_parent, new
            )
            del self._dirs[parent_inode_old].children[old]
            self._place(parent_inode_new, new, moved, ino)
            for handle in self._handles.values():
                if handle.inode == ino:  # its writes and its release (often after the rename)
                    handle.node = moved  # must reach the pack queue under the new name
            self._dirs.pop(ino, None)  # a moved folder is listed afresh
            if node.spooled and self.queue is not None:
                self.queue.renamed(node.spooled, moved.spooled)
            await self._settle_shadowed(parent_inode_old)

    async def _settle_shadowed(self, parent_inode: int) -> None:
        """A spooled file left a name: whatever it shadowed (an archive, a real file) shows."""
        await self.rescan(parent_inode, force=True)

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        with errno_boundary(f"unlink {name!r}"):
            writer = self._writer()
            parent, text, ino = await self._child(parent_inode, name)
            if ino is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            node = self._nodes[ino]
            await trio.to_thread.run_sync(writer.unlink, parent, text, node)
            if node.spooled and self.queue is not None:
                self.queue.removed(node.spooled)
            self._dirs[parent_inode].children.pop(text, None)
            await self._settle_shadowed(parent_inode)

    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        with errno_boundary(f"mkdir {name!r}"):
            writer = self._writer()
            parent, text, existing = await self._child(parent_inode, name)
            if existing is not None:
                raise pyfuse3.FUSEError(errno.EEXIST)
            node = await trio.to_thread.run_sync(writer.mkdir, parent, text, mode, ctx.uid, ctx.gid)
            ino = self._place(parent_inode, text, node)
            return self._attrs(ino, node)

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        with errno_boundary(f"rmdir {name!r}"):
            writer = self._writer()
            parent, text, ino = await self._child(parent_inode, name)
            if ino is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            await trio.to_thread.run_sync(writer.rmdir, parent, text, self._nodes[ino])
            self._dirs[parent_inode].children.pop(text, None)
            self._dirs.pop(ino, None)

    async def published(self, relpath: str) -> None:
        """The pack queue published `relpath`: show the archive in place of the spooled file."""
        folder = self.tree.root / relpath
        ino = self.dir_inode_of(folder.parent)
        if ino is not None:
            await self.rescan(ino, force=True)
