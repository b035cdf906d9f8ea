"""Free space on the spool's filesystem and the reserve new data may not use (`--min-free`).

Writes, creates and truncates that grow a file are refused with ENOSPC while free space is below
the reserve, so packing (which needs room for an archive) can always finish and the queue never
stalls on a disk filled by the very files it has to pack. `admit` is called on every write: it
keeps an estimate (the last statvfs less what it admitted since) and asks the filesystem again
at most every REFRESH seconds, or at once when the estimate nears the reserve.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MIN_FREE_CAP = 256 << 20  # the default reserve: this, or 5 % of the filesystem if smaller
MIN_FREE_FRACTION = 0.05
REFRESH = 0.5
NEAR = 64 << 20  # this close to the reserve, the filesystem is asked on every call


def default_min_free(path: Path) -> int:
    st = os.statvfs(path)
    return min(MIN_FREE_CAP, int(st.f_blocks * st.f_frsize * MIN_FREE_FRACTION))


def free_bytes(path: Path) -> int:
    """What an unprivileged writer may still use (the daemon runs as root and could use more:
    the reserve is counted without root's blocks, to be safe)."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class SpaceGuard:
    """Thread-safe: handlers call it from worker threads. `refusing` is set by the first
    refusal (one log line) and cleared, with another line, once the filesystem has room again
    for what was refused."""

    def __init__(self, path: Path, min_free: int | None = None) -> None:
        self.path = path
        self.min_free = default_min_free(path) if min_free is None else min_free
        self._lock = threading.Lock()
        self._free = 0
        self._at = -REFRESH
        self.refusing = False
        self.refused = 0  # calls refused so far
        self._wanted = 0  # the size last refused

    def free(self) -> int:
        with self._lock:
            return self._refresh()

    def _refresh(self) -> int:
        self._free, self._at = free_bytes(self.path), time.monotonic()
        if self.refusing and self._free - max(self._wanted, 1 << 20) >= self.min_free:
            self.refusing = False
            log.info("%s: %d MiB free again: new data is accepted", self.path, self._free >> 20)
        return self._free

    def admit(self, nbytes: int) -> bool:
        """May `nbytes` of new data be written without going below the reserve?"""
        with self._lock:
            stale = time.monotonic() - self._at > REFRESH
            if stale or self._free - nbytes < self.min_free + NEAR:
                self._refresh()
            if self._free - nbytes >= self.min_free:
                self._free -= nbytes
                return True
            self.refused += 1
            self._wanted = nbytes
            if not self.refusing:
                self.refusing = True
                log.warning(
                    "%s: %d MiB free, --min-free is %d MiB: new data is refused (ENOSPC) until "
                    "space returns, so what is spooled can still be packed",
                    self.path, self._free >> 20, self.min_free >> 20,
                )  # fmt: skip
            return False

    def status(self) -> dict[str, Any]:
        """As the filesystem tells it, at most REFRESH old: `_free` alone is the estimate
        `admit` keeps (0 until the first write asked, then less what was admitted since)."""
        with self._lock:
            if time.monotonic() - self._at > REFRESH:
                self._refresh()
            # Below the reserve, new data is refused whether or not a write has asked yet.
            refusing = self.refusing or self._free < self.min_free
        return {"free": self._free, "min_free": self.min_free, "refusing_writes": refusing,
                "refused": self.refused}  # fmt: skip
