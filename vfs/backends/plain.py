"""Plain files of SRC mirrored as they are, spooled files being written, and in-memory snapshots."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from vfs.beneath import not_listed, not_shown, open_beneath

_NOWAIT: int = getattr(os, "RWF_NOWAIT", 0)


class PlainFile:
    """A real file read by position; never written through the mount.

    Opened from `root` (SRC) with no symlink followed and without blocking: the file may have
    been swapped for a link or a FIFO since it was listed (see vfs/beneath.py)."""

    def __init__(self, path: Path, root: Path | None = None, ino: int = 0, uid: int = -1) -> None:
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
        if not_listed(st, ino, uid):  # not the file the caller's rights were checked against
            os.close(self._fd)
            raise OSError(errno.ESTALE, "not the file listed (replaced since)", str(path))
        self.size = st.st_size
        self._nowait = _NOWAIT != 0

    def read(self, offset: int, size: int) -> bytes:
        return os.pread(self._fd, size, offset)

    def read_cached(self, offset: int, size: int) -> memoryview | None:
        """The bytes at `offset` if the kernel's page cache holds them all, else None (the read
        then goes to a thread): `RWF_NOWAIT` never waits on the disk, so this may run on the
        event loop. A thread hop costs ~70 µs and two context switches, twice the whole read
        from the page cache; `open`/`read`/`close` of a 1 KiB mirrored file took 2.0 ms
        through the mount, the in-memory pyfuse3 ceiling 0.4-0.5 ms. Filesystems that could
        block on it (FUSE, NFS) refuse the flag (EOPNOTSUPP): their reads stay on threads."""
        if not self._nowait:
            return None
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        try:
            while got < size:
                more = os.preadv(self._fd, [view[got:]], offset + got, _NOWAIT)
                if more == 0:
                    break  # the end of the file (not cached would be EAGAIN)
                got += more
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                self._nowait = False  # a filesystem without it: threads, as before
            return None  # not cached (EAGAIN), or failing: the thread's read says how
        return view[:got]

    def readahead(self, offset: int) -> None:
        pass  # the kernel's own read-ahead covers real files

    def readahead_needed(self, offset: int) -> bool:
        return False  # so no read-ahead task (a thread hop) is started for `readahead`

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class SpoolFile(PlainFile):
    """A spooled file open for writing: reads and writes share one descriptor."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.size = os.fstat(fd).st_size
        self._nowait = _NOWAIT != 0
