"""Plain files of SRC, mirrored as they are."""

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
