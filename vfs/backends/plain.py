"""Plain files of SRC mirrored as they are, spooled files being written, and in-memory snapshots."""

from __future__ import annotations

import os
from pathlib import Path


class PlainFile:
    """A real file read by position; never written through the mount."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self._fd).st_size

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


class BytesFile:
    """A snapshot served from memory (the status file)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.size = len(data)

    def read(self, offset: int, size: int) -> bytes:
        return self.data[offset : offset + size]

    def readahead(self, offset: int) -> None:
        pass

    def close(self) -> None:
        pass
