"""A filesystem whose reads do not return: a hung NFS server, for tests of what waits on one.

    python tests/mount/hangfs.py MNT RELEASE

MNT holds one file, `stuck.tif` (64 KiB, root's, 0644) in a 0755 root folder. A read of it
waits until the file RELEASE exists, then returns zeros; the first read makes RELEASE.reading.
Serves until unmounted or SIGTERM.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import sys
from pathlib import Path

import pyfuse3
import trio

NAME, SIZE, INODE = b"stuck.tif", 64 << 10, 2


class HangOperations(pyfuse3.Operations):
    def __init__(self, gate: Path) -> None:
        super().__init__()
        self.gate = gate

    def _attrs(self, inode: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = inode
        if inode == pyfuse3.ROOT_INODE:
            a.st_mode, a.st_nlink, a.st_size = stat.S_IFDIR | 0o755, 2, 0
        else:
            a.st_mode, a.st_nlink, a.st_size = stat.S_IFREG | 0o644, 1, SIZE
        a.st_uid, a.st_gid = os.getuid(), os.getgid()
        a.st_blocks = (a.st_size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = 1_700_000_000 * 10**9
        return a

    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        if parent_inode != pyfuse3.ROOT_INODE or name != NAME:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(INODE)

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if inode not in (pyfuse3.ROOT_INODE, INODE):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(inode)

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        if start_id == 0:
            pyfuse3.readdir_reply(token, NAME, self._attrs(INODE), 1)

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        return pyfuse3.FileInfo(fh=inode)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        self.gate.with_suffix(".reading").touch()
        while not self.gate.exists():
            await trio.sleep(0.1)
        return bytes(max(0, min(size, SIZE - off)))


async def _serve() -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_signal)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()


async def _stop_on_signal() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            pyfuse3.terminate()
            return


def main() -> int:
    mnt, release = Path(sys.argv[1]), Path(sys.argv[2])
    pyfuse3.init(HangOperations(release), str(mnt), {"fsname=hangfs", "subtype=hangfs"})
    try:
        trio.run(_serve)
    finally:
        pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
