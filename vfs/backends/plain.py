"""Plain files of SRC mirrored as they are, spooled files being written, and in-memory snapshots."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from vfs.beneath import not_shown, open_beneath


class PlainFile:
    """A real file read by position; never written through the mount.

    Opened from `root` (SRC) with no symlink followed and without blocking: the file may have
    been swapped for a link or a FIFO since it was listed (see vfs/beneath.py)."""

    def __init__(self, path: Path, root: Path | None = None) -> None:
        flags = os.O_RDONLY | os.O_NONBLOCK
        if root is None:  # from its own folder, as open_beneath(path.parent, path) would, in
            # one call instead of three (rsync opens every file it copies once more)
            self._fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
        else:
            self._fd = open_beneath(root, path, flags)
        st = os.fstat(self._fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(self._fd)
            raise not_shown(path, st)
        self.size = st.st_size

    def read(self, offset: int, size: int) -> bytes:
        return os.pread(self._fd, size, offset)

    def readahead(self, offset: int) -> None:
        pass  # the kernel's own read-ahead covers real files

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class SpoolFile(PlainFile):
    """A spooled file open for writing: reads and writes share one descriptor."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.size = os.fstat(fd).st_size
