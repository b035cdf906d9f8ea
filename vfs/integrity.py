"""Hash-as-you-serve: a running sha256 over a file read front to back, even if reads reorder."""

from __future__ import annotations

import hashlib
import threading
from typing import Any

MAX_PENDING = 8 * 1024 * 1024  # bytes parked ahead of the hash position before giving up
MAX_GAP = 4 * 1024 * 1024  # how far ahead of the hash position a read may start to be parked
PARKED_MAX = 64 * 1024 * 1024  # what all of a daemon's hashers may park together (ParkBudget)


class ParkBudget:
    """Bytes all running hashes may hold parked together. One handle parks at most
    MAX_PENDING, but a user may hold thousands: 60 handles on links of one archive, each
    read a few MiB in, grew a daemon with a 64 MiB cache to 359 MiB. A hasher that would go
    past the budget gives up (its file is then verified aside, as after random reads)."""

    def __init__(self, max_bytes: int = PARKED_MAX) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> bool:
        with self._lock:
            if self.held + nbytes > self.max_bytes:
                return False
            self.held += nbytes
            return True

    def give(self, nbytes: int) -> None:
        with self._lock:
            self.held -= nbytes


def held_bytes(data: Any) -> int:
    """What parking `data` keeps alive: all of the buffer a view pins, not just its bytes."""
    if isinstance(data, memoryview) and data.obj is not None:
        try:
            return max(data.nbytes, memoryview(data.obj).nbytes)
        except TypeError:
            pass
    return len(data)


class SequentialHasher:
    """Feeds reads into sha256 in file order. Reads that arrive ahead of the hash position (the
    kernel issues read-ahead concurrently) are parked until the gap fills; a read pattern that is
    not front to back makes it give up, and then the file is simply not checked this time."""

    def __init__(self, size: int, expected: str, budget: ParkBudget | None = None) -> None:
        self.size = size
        self.expected = expected
        self.pos = 0
        self.abandoned = False
        self._digest = hashlib.sha256()
        self._pending: dict[int, bytes | memoryview] = {}
        self._pending_bytes = 0
        self._budget = budget
        self._charged = 0  # what the parked reads hold of `budget`

    @property
    def complete(self) -> bool:
        return not self.abandoned and self.pos >= self.size

    @property
    def ok(self) -> bool:
        return self.complete and self._digest.hexdigest() == self.expected

    def hexdigest(self) -> str:
        return self._digest.hexdigest()

    def feed(self, offset: int, data: bytes | memoryview) -> bool:
        """Take one served read; True when this call completed the file."""
        if self.abandoned or self.pos >= self.size or offset + len(data) <= self.pos:
            return False
        if offset > self.pos:
            # Parked only when the gap could be the kernel's own reordering (it keeps a few
            # requests of at most 1 MiB in flight): a read further ahead is another pattern,
            # and parking it too held 8 MiB of copies per randomly read handle (16 handles of
            # one file: 104 MiB of a daemon's 365 MiB peak with an 8 MiB cache).
            far = offset - self.pos > MAX_GAP
            if far or offset in self._pending or self._pending_bytes + len(data) > MAX_PENDING:
                self.abandon()
            elif not self._charge(data):
                self.abandon()  # every hasher's parked reads together are at their bound
            else:
                self._pending[offset] = data
                self._pending_bytes += len(data)
            return False
        self._digest.update(memoryview(data)[self.pos - offset :])
        self.pos = offset + len(data)
        while self.pos in self._pending:
            chunk = self._pending.pop(self.pos)
            self._pending_bytes -= len(chunk)
            self._digest.update(chunk)
            self.pos += len(chunk)
            self._release(held_bytes(chunk))
        if self._pending and min(self._pending) < self.pos:
            self.abandon()  # overlapping reads: this is not a clean front-to-back pass
        return self.pos >= self.size

    def abandon(self) -> None:
        """Give up (the file is not checked this time); what was parked goes."""
        self.abandoned = True
        self._pending.clear()
        self._pending_bytes = 0
        self._release(self._charged)

    def _charge(self, data: Any) -> bool:
        if self._budget is None:
            return True
        nbytes = held_bytes(data)
        if not self._budget.take(nbytes):
            return False
        self._charged += nbytes
        return True

    def _release(self, nbytes: int) -> None:
        if self._budget is not None and nbytes:
            self._budget.give(nbytes)
            self._charged -= nbytes


class Coverage:
    """How far [0, n) has been served without a gap, from reads that arrive in any order.

    The read that completes coverage is the one that may wait for the hash verdict: a tail read
    that comes first (TIFF and zip readers start at the end) must not wait for bytes no one asked
    for yet.
    """

    MAX_RANGES = 4096  # a random-access pattern: stop tracking, there will be no verdict

    def __init__(self) -> None:
        self.upto = 0
        self._ahead: dict[int, int] = {}
        self.gave_up = False

    def add(self, start: int, end: int) -> int:
        if self.gave_up:
            return self.upto
        if start > self.upto:
            self._ahead[start] = max(end, self._ahead.get(start, 0))
            if len(self._ahead) > self.MAX_RANGES:
                self.gave_up = True
                self._ahead.clear()
            return self.upto
        self.upto = max(self.upto, end)
        while reached := [s for s in self._ahead if s <= self.upto]:
            for s in reached:
                self.upto = max(self.upto, self._ahead.pop(s))
        return self.upto
