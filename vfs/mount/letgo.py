"""Kernel entries past the inode table's budget, asked to go from one background task.

Every entry the kernel holds (a lookup's, each name `ls` lists through readdirplus) keeps its
node and table rows in the daemon until the kernel forgets it, which it does only under memory
pressure. Past `InodeTable.listed_entries` the least recently handed out are invalidated: the
kernel drops them and forgets their inodes, and the next use looks the name up again.

The invalidations run here, in batches in a worker thread, not through pyfuse3's
`invalidate_entry_async`: its queue is unbounded and logs a traceback for each entry still
queued when the mount goes away (a `ls -l` of 200,000 names past the budget queued as many).
`invalidate_entry` blocks while the kernel runs a related request, which the trio thread keeps
serving meanwhile.
"""

from __future__ import annotations

import errno
import logging
import os

import pyfuse3
import trio

from vfs.mount.inodes import InodeTable

log = logging.getLogger(__name__)

BATCH = 1024  # entries invalidated per worker-thread call


class LetGo:
    def __init__(self, inodes: InodeTable) -> None:
        self.inodes = inodes
        self._wake = trio.Event()
        self.running = False
        self.busy = False  # a batch is being invalidated
        self.asked = 0  # entries asked to go so far (a counter for tests and the status)

    def poke(self) -> None:
        """(trio thread) The table may hold more kernel entries than it may: wake the task."""
        if self.inodes.overflowing():
            self._wake.set()

    async def run(self) -> None:
        """Invalidate what overflows, each time `poke` finds some, until cancelled."""
        self.running = True
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                while batch := self.inodes.overflow(BATCH):
                    self.asked += len(batch)
                    self.busy = True
                    try:
                        await trio.to_thread.run_sync(_invalidate, batch)
                    finally:
                        self.busy = False
        finally:
            self.running = False


def _invalidate(batch: list[tuple[int, str]]) -> None:
    """(worker thread) Ask the kernel to drop these entries; gone already is fine."""
    for parent, name in batch:
        try:
            pyfuse3.invalidate_entry(parent, os.fsencode(name))
        except OSError as exc:  # ENOENT: not held; EINVAL/ENOTCONN: the mount is going away
            if exc.errno != errno.ENOENT:
                log.debug("entry %r of inode %d not invalidated: %s", name, parent, exc)
