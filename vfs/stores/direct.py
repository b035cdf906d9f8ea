"""Reads past the page cache (O_DIRECT) into a per-thread reused, page-aligned buffer.

A cold stream of an archive read through the page cache costs the kernel a fill and a copy of
every byte, and the cache it fills is never read again: decoded planes and decrypted segments
are what the daemon caches. Both read paths measured it (vfs.c4gh.segments, vfs.decant.store).
Where a system or file system refuses O_DIRECT, callers read through the page cache.
"""

from __future__ import annotations

import mmap
import os
import threading

from vfs.threadbuffers import keep

_per_thread = threading.local()

DIRECT_ALIGN = 4096  # O_DIRECT offsets, lengths and buffers: a multiple of the block size


def open_direct(fd: int) -> int | None:
    """A second descriptor of the file open on `fd` that reads past the page cache (O_DIRECT),
    or None where the system or file system has none.

    Opened through /proc/self/fd, so it is the very file `fd` holds (checked: same device and
    inode), never whatever its path names now.
    """
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        direct = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | flag | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        a, b = os.fstat(fd), os.fstat(direct)
    except OSError:
        os.close(direct)
        return None
    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
        os.close(direct)
        return None
    return direct


def pread_direct(fd: int, size: int, offset: int, keep_up_to: int) -> memoryview:
    """Up to `size` bytes at `offset` of an O_DIRECT descriptor (short only at the end of the
    file), read into this thread's reused page-aligned buffer. Valid until the thread's next
    call; the aligned read around [offset, offset + size) is at most 2 * DIRECT_ALIGN larger.
    """
    lo = offset - offset % DIRECT_ALIGN
    hi = -(-(offset + size) // DIRECT_ALIGN) * DIRECT_ALIGN
    span = hi - lo
    buf: mmap.mmap | None = getattr(_per_thread, "buffer", None)
    if buf is None or len(buf) < span:
        buf = mmap.mmap(-1, span)  # anonymous: page-aligned, as O_DIRECT wants
        if span <= keep_up_to + 2 * DIRECT_ALIGN:
            keep(_per_thread, "buffer", buf, span)
    view = memoryview(buf)
    got = os.preadv(fd, [view[:span]], lo)
    skip = offset - lo
    return view[skip : max(skip, min(got, skip + size))]
