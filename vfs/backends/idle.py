"""Opened archives kept a few seconds after their last handle closed, for the next open.

Tools open, read and close the same file again and again (a TIFF reader reads the header, closes,
opens again for the pixels; `dd` or `cat` each time a script runs). Each open parsed the zip's
central directory and manifest and built the original's plan again (~3 ms for a 1 GiB stack on
local disk), and for an archive in a bucket made its tail and metadata GETs too (~12 ms against
a loopback SeaweedFS): a warm `dd` of a 512 MiB original served from the kernel's page cache
took ~10 % longer from a bucket than from a local SRC only because of that open.

What is kept is bounded by count and by bytes, and each entry by time; a sweeper thread closes
what has waited too long, so a deleted archive's space is freed within `seconds`. An entry is
kept under the version key its archive was opened for (a local file's lstat, an object's
listed ETag), so a changed archive is never taken for the one kept; whoever takes one back
charges it to the open budget again as if just opened.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Protocol


class Closable(Protocol):
    def close(self) -> None: ...


class IdleArchives:
    """At most `count` archives of at most `max_bytes` in all, each for at most `seconds`."""

    def __init__(
        self,
        seconds: float,
        count: int,
        max_bytes: int,
        clock: Callable[[], float] = time.monotonic,
        sweeper: bool = True,
    ) -> None:
        self.seconds = seconds
        self.count = count
        self.max_bytes = max_bytes
        self._clock = clock
        self._kept: OrderedDict[Hashable, tuple[Closable, int, float]] = OrderedDict()
        self._bytes = 0
        self._changed = threading.Condition()
        self._sweeper = sweeper
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.seconds > 0 and self.count > 0

    def __contains__(self, key: Hashable) -> bool:
        with self._changed:
            return key in self._kept

    def __len__(self) -> int:
        with self._changed:
            return len(self._kept)

    @property
    def held_bytes(self) -> int:
        with self._changed:
            return self._bytes

    def put(self, key: Hashable, archive: Closable, nbytes: int) -> None:
        """Keep `archive` (holding `nbytes` of tables) for the next open of `key`; closed now
        when keeping is off or it alone is past the bytes allowed. Pushes out the oldest."""
        if not self.enabled or nbytes > self.max_bytes:
            archive.close()
            return
        with self._changed:
            old = self._kept.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._kept[key] = (archive, nbytes, self._clock())
            self._bytes += nbytes
            out = self._trim(self._clock())
            if old is not None:
                out.append(old[0])
            self._start()
            self._changed.notify()
        _close_all(out)

    def take(self, key: Hashable) -> Closable | None:
        """The archive kept for `key`, no longer kept (the caller owns it); None if none."""
        with self._changed:
            found = self._kept.pop(key, None)
            if found is None:
                return None
            self._bytes -= found[1]
            return found[0]

    def sweep(self) -> float | None:
        """Close what waited `seconds` or more; seconds until the next one is due (None: empty)."""
        with self._changed:
            now = self._clock()
            out = self._trim(now)
            due = None
            if self._kept:
                first = next(iter(self._kept.values()))
                due = max(first[2] + self.seconds - now, 0.0)
        _close_all(out)
        return due

    def clear(self) -> None:
        with self._changed:
            out = [archive for archive, _n, _t in self._kept.values()]
            self._kept.clear()
            self._bytes = 0
        _close_all(out)

    def _trim(self, now: float) -> list[Closable]:
        """(the lock held) Pop what is past its time, the count or the bytes, oldest first."""
        out = []
        while self._kept:
            key, (archive, nbytes, since) = next(iter(self._kept.items()))
            if (
                now - since < self.seconds
                and len(self._kept) <= self.count
                and self._bytes <= self.max_bytes
            ):
                break
            del self._kept[key]
            self._bytes -= nbytes
            out.append(archive)
        return out

    def _start(self) -> None:
        if self._sweeper and self._thread is None:
            self._thread = threading.Thread(target=self._sweep_forever, name="decant-idle",
                                            daemon=True)  # fmt: skip
            self._thread.start()

    def _sweep_forever(self) -> None:
        while True:
            due = self.sweep()
            with self._changed:
                if due is None and not self._kept:
                    self._changed.wait()
                else:
                    self._changed.wait(timeout=(due or 0.0) + 0.01)


def _close_all(archives: list[Closable]) -> None:
    for archive in archives:
        archive.close()
