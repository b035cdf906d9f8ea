"""Where `decant restore` writes: O_DIRECT through an aligned staging buffer, else the page cache.

Measured here (2 cores, ext4 on virtio, 512 MiB written in 8 MiB calls, then fsync): buffered
writes cost 0.1-1.05 s of kernel CPU (copying into the page cache, reclaiming it, throttling on
dirty pages: it varies with the other processes' memory) and took 0.24-1.8 s; O_DIRECT took
0.19-0.45 s with ~0.02 s of CPU, and its fsync had nothing left to write. Restore's other two
cores' worth of work (sha256, decode) need that CPU. O_DIRECT wants aligned memory, offsets and
lengths, and a region of the original starts anywhere, so the views are copied into a
page-aligned buffer first (numpy's copy releases the GIL; ~0.05 s/GB).
The fsync before the rename stays: O_DIRECT alone does not flush the device's cache or the
file's metadata.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import mmap
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

STAGE = 8 << 20  # bytes per O_DIRECT write (a multiple of ALIGN)
ALIGN = 4096  # offsets, lengths and memory: a page covers every common logical block size
WRITEBACK = 32 << 20  # buffered: ask the kernel to start writing back every this many bytes
O_DIRECT: int = getattr(os, "O_DIRECT", 0)

Buffer = bytes | bytearray | memoryview


class Output:
    """Writes consecutive views to `fd` from its current position; `close()` writes the tail and
    leaves the position at the end. Not thread-safe: one writer thread calls `write`."""

    def __init__(self, fd: int, direct: bool = True) -> None:
        self.fd = fd
        self.at = os.lseek(fd, 0, os.SEEK_CUR)  # file offset of the staged bytes' first byte
        self.direct = direct and self.at % ALIGN == 0 and _set_direct(fd, True)
        self._writeback = _Writeback(fd, self.at)
        self._stage: mmap.mmap | None = None
        self._staged: np.ndarray[Any, Any] | None = None
        self._fill = 0
        if self.direct:
            self._stage = mmap.mmap(-1, STAGE)  # page-aligned; faulted in once, then reused
            self._staged = np.frombuffer(self._stage, dtype=np.uint8)

    def write(self, views: Sequence[Buffer]) -> None:
        for view in views:
            if self._staged is None:
                self._write_buffered(memoryview(view).cast("B"))
            else:
                self._stage_bytes(np.frombuffer(view, dtype=np.uint8))

    def close(self) -> None:
        """Write what is staged (its unaligned tail without O_DIRECT); the position ends at the
        end of what was written. Drops the staging buffer."""
        if self._staged is not None:
            fill, whole = self._fill, self._fill - self._fill % ALIGN
            stage = memoryview(self._stage)  # type: ignore[arg-type]
            if whole:
                self._pwrite(stage[:whole], self.at)
            if fill > whole:
                self._buffered()
                self._pwrite(stage[whole:fill], self.at + whole)
            stage.release()
            self.at += fill
            self._staged = None
            self._stage.close()  # type: ignore[union-attr]
            self._stage = None
        if self.direct:
            self._buffered()
        os.lseek(self.fd, self.at, os.SEEK_SET)

    def _stage_bytes(self, src: np.ndarray[Any, Any]) -> None:
        staged = self._staged
        assert staged is not None
        pos = 0
        while pos < src.size:
            n = min(src.size - pos, staged.size - self._fill)
            np.copyto(staged[self._fill : self._fill + n], src[pos : pos + n])  # GIL released
            self._fill += n
            pos += n
            if self._fill == staged.size:
                self._flush()

    def _flush(self) -> None:
        """Write the full staging buffer at `at`."""
        with memoryview(self._stage) as stage:  # type: ignore[arg-type]
            self._pwrite(stage, self.at)
        self.at += self._fill
        self._fill = 0

    def _pwrite(self, data: memoryview, at: int) -> None:
        done = 0
        while done < data.nbytes:
            try:
                done += os.pwrite(self.fd, data[done:], at + done)
            except OSError as exc:
                # A filesystem may take the flag yet refuse the I/O, a short write may leave
                # the next offset unaligned: go on through the page cache.
                if exc.errno != errno.EINVAL or not self.direct:
                    raise
                self._buffered()

    def _write_buffered(self, data: memoryview) -> None:
        while data.nbytes:
            written = os.pwrite(self.fd, data, self.at)
            data = data[written:]
            self.at += written
            self._writeback.wrote(self.at)

    def _buffered(self) -> None:
        if self.direct:
            _set_direct(self.fd, False)
            self.direct = False


def _set_direct(fd: int, on: bool) -> bool:
    """Turn O_DIRECT on or off for `fd`; False where the platform or filesystem has none."""
    if not O_DIRECT:
        return False
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | O_DIRECT if on else flags & ~O_DIRECT)
    except OSError:
        return False
    return True


class _Writeback:
    """Starts the kernel's write-back of each WRITEBACK bytes as soon as they are written, so the
    fsync before the rename waits for the tail only (sync_file_range(2), SYNC_FILE_RANGE_WRITE:
    no waiting, no metadata). Where libc lacks it, the final fsync does all the work."""

    _FN: Any = False  # the libc function once looked up (None: there is none)

    def __init__(self, fd: int, at: int) -> None:
        self.fd = fd
        self.done = at

    def wrote(self, at: int) -> None:
        if at - self.done >= WRITEBACK:
            fn = self._sync_file_range()
            if fn is not None:
                fn(self.fd, self.done, at - self.done, 2)  # SYNC_FILE_RANGE_WRITE
            self.done = at

    @classmethod
    def _sync_file_range(cls) -> Any:
        if cls._FN is False:
            fn = None
            with contextlib.suppress(OSError, AttributeError, TypeError):
                fn = ctypes.CDLL(ctypes.util.find_library("c") or None).sync_file_range
                fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                fn.restype = ctypes.c_int
            cls._FN = fn
        return cls._FN
