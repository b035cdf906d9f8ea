"""Archives described while they may have been mid-write ("racy", as git calls such entries).

One `write()` stamps a file's mtime and ctime as it starts, so a listing during it sees the new
version's stat and parses the old bytes. A description made less than `RACY_NS` after its
archive file's mtime is served but not trusted: the tree keeps it out of the index and forgets
a failure to parse it, and the mount describes the archive again once the moment has passed.
Not the ctime: a rename (how the write side publishes an archive, its mtime the original's) or a
chmod moves only that, and writes no bytes.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

RACY_NS = 2_000_000_000
# Racy archives remembered per owner of the file (then that owner's forgotten all at once): one
# user keeping 10,000 files racy emptied a shared book, and another user's pending listing with
# it, so their archive stayed shown raw (red team 48b).
PER_OWNER = 10_000

Version = tuple[int, ...]


class RacyArchives:
    """The racy archives' versions (for an open to tell its node was described racy) and those
    waiting to be listed again, by owner. Written by listing threads, read on the event loop:
    single dict operations only (a copy to iterate), no lock."""

    def __init__(self, per_owner: int = PER_OWNER, clock: Callable[[], int] = time.time_ns):
        self._per_owner = per_owner
        self._clock = clock
        self._seen: dict[int, dict[Path, tuple[Version, int]]] = {}  # version, trusted from
        self._waiting: dict[int, dict[Path, int]] = {}  # trusted from: listed again then

    def note(self, path: Path, st: os.stat_result, version: Version) -> bool:
        """Whether a description of the archive file `st` just made may hold bytes of a write
        in progress; noted if so, forgotten if not. An mtime more than the window ahead of the
        clock was set, not stamped by a write (kept racy, a file dated 2033 was parsed again at
        every listing). A folder archive's stat says nothing of its files."""
        if not stat.S_ISREG(st.st_mode):
            return False
        window = RACY_NS
        now, trusted_from = self._clock(), st.st_mtime_ns + window
        if now >= trusted_from or st.st_mtime_ns > now + window:
            seen = self._seen.get(st.st_uid)
            if seen is not None:
                seen.pop(path, None)
            return False
        seen = self._seen.setdefault(st.st_uid, {})
        waiting = self._waiting.setdefault(st.st_uid, {})
        if len(seen) >= self._per_owner:
            seen.clear()
        if len(waiting) >= self._per_owner:
            waiting.clear()
        seen[path] = (version, trusted_from)
        waiting[path] = trusted_from
        return True

    def doubt(self, path: Path, version: Version, uid: int) -> None:
        """Have the archive at `path` (of `version`, owner `uid`) described again now, as a racy
        one whose moment has passed: its description does not hold what the file holds."""
        seen = self._seen.setdefault(uid, {})
        waiting = self._waiting.setdefault(uid, {})
        if len(seen) >= self._per_owner:
            seen.clear()
        if len(waiting) >= self._per_owner:
            waiting.clear()
        now = self._clock()
        seen[path] = (version, now)
        waiting[path] = now

    def due(self, path: Path, version: Version, uid: int) -> bool:
        """Whether the archive at `path`, of `version` and owner `uid`, was described racy and
        may be described again now for a description to trust."""
        if not self._seen:
            return False
        found = self._seen.get(uid, {}).get(path)
        return found is not None and found[0] == version and self._clock() >= found[1]

    def take_due(self) -> dict[Path, set[str]]:
        """The names of the racy archives whose moment has passed, by folder, each handed out
        once."""
        now = self._clock()
        out: dict[Path, set[str]] = {}
        for waiting in self._waiting.copy().values():
            for path, trusted_from in waiting.copy().items():
                if trusted_from <= now and waiting.pop(path, None) is not None:
                    out.setdefault(path.parent, set()).add(path.name)
        return out
