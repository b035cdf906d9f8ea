"""Byte ranges as sorted, disjoint [start, end) intervals: what the reads of an object took."""

from __future__ import annotations

import bisect


class Ranges:
    """A union of byte ranges near one moving position, of at most `limit` intervals (ranges
    that touch or overlap merge into one). Not thread-safe: the owner's lock guards it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._starts: list[int] = []
        self._ends: list[int] = []

    def __len__(self) -> int:
        return len(self._starts)

    def add(self, start: int, end: int) -> None:
        if start >= end:
            return
        lo = bisect.bisect_left(self._ends, start)  # the first that ends at or after `start`
        hi = bisect.bisect_right(self._starts, end)  # past the last that starts by `end`
        if lo < hi:
            start = min(start, self._starts[lo])
            end = max(end, self._ends[hi - 1])
        self._starts[lo:hi] = [start]
        self._ends[lo:hi] = [end]

    def overlaps(self, start: int, end: int) -> bool:
        """Whether any byte of [start, end) is in a range held."""
        if start >= end:
            return False
        i = bisect.bisect_right(self._ends, start)  # the first that ends after `start`
        return i < len(self._starts) and self._starts[i] < end

    def covered(self, start: int, end: int) -> int:
        """How many bytes of [start, end) are in the ranges held."""
        i = bisect.bisect_right(self._ends, start)  # the first that ends after `start`
        total = 0
        while i < len(self._starts) and self._starts[i] < end:
            total += min(end, self._ends[i]) - max(start, self._starts[i])
            i += 1
        return total

    def forget_from(self, start: int) -> None:
        """Forget every byte from `start` on."""
        i = bisect.bisect_right(self._ends, start)  # the first that ends after `start`
        tail = [start] if i < len(self._starts) and self._starts[i] < start else []
        self._starts[i:] = [self._starts[i]] if tail else []
        self._ends[i:] = tail

    def keep_near(self, start: int, end: int, distance: int) -> None:
        """Forget the ranges more than `distance` bytes away from [start, end), then the
        farthest ones beyond `limit`."""
        starts, ends = self._starts, self._ends
        first = bisect.bisect_left(ends, start - distance)  # those ending before that: far behind
        last = bisect.bisect_right(starts, end + distance)  # those starting after it: far ahead
        if first or last < len(starts):
            self._starts, self._ends = starts[first:last], ends[first:last]
            starts, ends = self._starts, self._ends
        while len(starts) > self.limit:
            if start - ends[0] > starts[-1] - end:
                del starts[0], ends[0]
            else:
                del starts[-1], ends[-1]

    def clear(self) -> None:
        self._starts, self._ends = [], []
