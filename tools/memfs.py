#!/usr/bin/env python3
"""The benchmark ceiling: a read-only pyfuse3 filesystem serving files' bytes from memory.

    python tools/memfs.py MNT FILE… [-f] [--xattrs]

One flat folder holding the given files under their own names. A read is a memoryview slice of
bytes loaded at start, so whatever a read through this mount costs is pyfuse3's and the kernel's
own per-request price: the most any pyfuse3 filesystem can do on this machine. It mounts with the
kernel settings decant-mount uses (keep_cache on open, 1 MiB read-ahead raised after FUSE INIT by
the daemon's own functions), so both see the same request sizes and `tools/bench.py mount` compares
like with like. Serves until unmounted (`fusermount3 -u MNT`) or SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import stat
import sys
import time
from pathlib import Path

import pyfuse3
import trio

from vfs.mount.daemon import raise_read_ahead

# Same wait as the daemon's: the kernel sets the mount's read-ahead while handling FUSE INIT
# (capped at 128 KiB), which is answered only once the session loop runs.
INIT_GRACE = 0.3
TIMEOUT = 300.0  # contents never change: let the kernel keep entries, attributes and pages


class MemoryOperations(pyfuse3.Operations):
    """Root folder (inode 1) and one inode per file; every handler is a dict lookup at most."""

    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, files: dict[str, bytes], copy: bool = False, xattrs: bool = False) -> None:
        super().__init__()
        self._copy = copy
        self._xattrs = xattrs
        self._names = sorted(files)
        self._inode_of = {os.fsencode(n): i for i, n in enumerate(self._names, start=2)}
        self._data: dict[int, memoryview] = {
            self._inode_of[os.fsencode(n)]: memoryview(files[n]) for n in self._names
        }
        self._mtime_ns = time.time_ns()  # one fixed mtime: nothing changes while mounted

    def _attrs(self, inode: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = inode
        a.entry_timeout = a.attr_timeout = TIMEOUT
        if inode == pyfuse3.ROOT_INODE:
            a.st_mode, a.st_nlink, a.st_size = stat.S_IFDIR | 0o555, 2, 0
        else:
            a.st_mode, a.st_nlink, a.st_size = stat.S_IFREG | 0o444, 1, len(self._data[inode])
        a.st_uid, a.st_gid = os.getuid(), os.getgid()
        a.st_blksize = 128 * 1024  # as decant-mount reports
        a.st_blocks = (a.st_size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = self._mtime_ns
        return a

    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        inode = self._inode_of.get(name) if parent_inode == pyfuse3.ROOT_INODE else None
        if inode is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(inode)

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if inode != pyfuse3.ROOT_INODE and inode not in self._data:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(inode)

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        if inode != pyfuse3.ROOT_INODE:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        for i, name in enumerate(self._names[start_id:], start=start_id + 1):
            raw = os.fsencode(name)
            if not pyfuse3.readdir_reply(token, raw, self._attrs(self._inode_of[raw]), i):
                break

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        if inode not in self._data:
            raise pyfuse3.FUSEError(errno.EISDIR if inode == pyfuse3.ROOT_INODE else errno.ENOENT)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise pyfuse3.FUSEError(errno.EROFS)
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)  # as decant-mount opens

    # The stub says bytes, but pyfuse3 replies from any buffer (PyObject_GetBuffer): zero-copy.
    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:  # type: ignore[override]
        view = self._data[fh][off : off + size]
        return view.tobytes() if self._copy else view

    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        # ENOSYS (pyfuse3's default) makes the kernel stop asking for good; a filesystem that has
        # xattrs (decant-mount shows user.decant.*) answers each `ls -l` asks for, two an entry.
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR if self._xattrs else errno.ENOSYS)

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        out = pyfuse3.StatvfsData()
        out.f_bsize = out.f_frsize = 4096
        out.f_blocks = sum(len(d) for d in self._data.values()) // 4096 + 1
        out.f_files = len(self._data) + 1
        out.f_namemax = 255
        return out


def load(paths: list[Path]) -> dict[str, bytes]:
    """Each file's whole content, keyed by its base name (which must be distinct)."""
    files: dict[str, bytes] = {}
    for path in paths:
        if path.name in files:
            raise SystemExit(f"memfs: two files named {path.name!r}")
        try:
            files[path.name] = path.read_bytes()
        except OSError as exc:
            raise SystemExit(f"memfs: {path}: {exc.strerror}") from None
    return files


async def _serve(mnt: Path) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_raise_read_ahead_after_init, mnt)
        nursery.start_soon(_stop_on_signal)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()  # unmounted from outside


async def _raise_read_ahead_after_init(mnt: Path) -> None:
    await trio.sleep(INIT_GRACE)
    await trio.to_thread.run_sync(raise_read_ahead, mnt)


async def _stop_on_signal() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for _ in signals:
            pyfuse3.terminate()
            return


def _detach() -> int:
    """Fork; the parent exits once the child reports the mount ready, so callers can use MNT."""
    read_end, write_end = os.pipe()
    if os.fork() > 0:
        os.close(write_end)
        os._exit(0 if os.read(read_end, 1) == b"1" else 1)
    os.close(read_end)
    os.setsid()
    return write_end


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("mountpoint", type=Path, metavar="MNT")
    ap.add_argument("files", nargs="+", type=Path, metavar="FILE")
    ap.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground")
    ap.add_argument(
        "--copy", action="store_true", help="serve a bytes copy per read, as decant-mount does"
    )
    ap.add_argument(
        "--xattrs",
        action="store_true",
        help="answer getxattr (no such attribute), as decant-mount must: `ls -l` then asks "
        "this daemon twice an entry, as it asks decant-mount",
    )
    args = ap.parse_args(argv)
    files = load(args.files)  # before mounting: once MNT is mounted, every byte is there
    ready_fd = None if args.foreground else _detach()
    mnt = args.mountpoint.absolute()
    ops = MemoryOperations(files, args.copy, args.xattrs)
    pyfuse3.init(ops, str(mnt), {"fsname=memfs", "subtype=memfs"})
    try:
        if ready_fd is not None:
            os.write(ready_fd, b"1")
            os.close(ready_fd)
        trio.run(_serve, mnt)
    finally:
        pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
