"""Spooled files open for writing through the mount, marked as such on the file itself.

A daemon stopped (SIGTERM, a restart, `kill -9`, a crash) while a `cp` into the mount was half
done left the half file spooled under its final name; the next start published it as any
settled file, complete to every reader, and the writer's error was the only sign. So while a
write handle of a spooled file is open the file carries the xattr `WRITING` (set through the
handle's descriptor, so a rename through the mount carries it along), removed when the last
one closes. What the next start finds still marked is not published: it stays spooled,
readable and reported as failed, until it is written again (a `touch` through the mount
publishes it as it is). A filesystem without user xattrs keeps no mark (as before).
Synchronous and FUSE-free.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

WRITING = "user.decant.writing"
# The mark's value says which run of the daemon set it. A mark of this run on a file the queue
# is publishing is a close under way (a release tells the queue before it clears the mark, and
# that may wait on a worker thread), not a cut-off: such a file is tried again shortly.
THIS_RUN = f"{os.getpid()}-{time.time_ns()}".encode()
CUT_OFF = ("its writer was cut off (the daemon stopped while it was open for writing), so it "
           "may be incomplete: write it again, or `touch` it through the mount to publish it "
           "as it is")  # fmt: skip
_NO_XATTRS = (errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS)


class Writers:
    """Write handles open per spooled file (by device and inode: renames do not matter)."""

    def __init__(self) -> None:
        self._open: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()  # opens and closes of one file come from many threads
        self._told = False

    def opened(self, fd: int) -> None:
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        with self._lock:  # the mark and the count change together
            held = self._open.get(key, 0)
            self._open[key] = held + 1
            if held == 0:
                self._set(fd)

    def closed(self, fd: int) -> None:
        """Never raises: the release calling it closes the descriptor next, whatever this does."""
        try:
            st = os.fstat(fd)
        except OSError:
            return
        key = (st.st_dev, st.st_ino)
        with self._lock:
            held = self._open.pop(key, 1) - 1
            if held > 0:
                self._open[key] = held
                return
            try:
                os.removexattr(fd, WRITING)
            except OSError as exc:
                if exc.errno not in (errno.ENODATA, *_NO_XATTRS):
                    log.warning("cannot clear the write mark of a spooled file: %s", exc)

    def _set(self, fd: int) -> None:
        try:
            os.setxattr(fd, WRITING, THIS_RUN)
        except OSError as exc:
            if not self._told:
                self._told = True
                log.warning("spooled files cannot be marked while written (%s): one cut off "
                            "by a daemon stop is published as it was left", exc)  # fmt: skip


def write_mark(path: Path) -> Literal["none", "closing", "cut off"]:
    """The write mark of the spooled file at `path` (no link followed): none; this run's (its
    last write handle is closing); or an earlier run's (its writer was cut off)."""
    try:
        value = os.getxattr(path, WRITING, follow_symlinks=False)
    except OSError:
        return "none"
    return "closing" if value == THIS_RUN else "cut off"
