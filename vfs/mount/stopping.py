"""A stop that ends: once asked to stop, the daemon exits within a grace period, whatever a
worker thread is still doing.

A stop waits for the threads the daemon started: a pack step, a plane's decode. Each gives up
at its next block, but one blocked inside a single step (a read of a file on a hung NFS inbox,
a library call that does not return) held the stop without end: the mount hung for every user
(the session loop had stopped serving it), or, unmounted from outside, the daemon ran on holding
its spool, so a new one was refused. Everything the daemon writes survives being killed at any
point (a spooled file is published after the next start; the index is SQLite), so past the grace
the watch detaches the mount and exits, as `kill -9` would, with a line in the log saying why.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from vfs.mount.mountinfo import topmost

log = logging.getLogger(__name__)

# Under the systemd unit's TimeoutStopSec (30 s), after which it kills without a word; a stop
# that completes (every publish and decode gives up at its next block) takes well under a second.
STOP_GRACE = 10.0


def mounted_device(mnt: Path) -> str | None:
    """major:minor of the topmost mount at `mnt`, or None when nothing is mounted there."""
    found = topmost(mnt)
    return found[0] if found is not None else None


def detach(mnt: Path, device: str) -> None:
    """Lazily unmount `mnt` if the mount there is still the one of `device` (ours): never
    another filesystem mounted there since."""
    try:
        if mounted_device(mnt) != device:
            return
    except OSError:
        return
    for cmd in (["fusermount3", "-u", "-z", str(mnt)], ["umount", "-l", str(mnt)]):
        try:
            if subprocess.run(cmd, capture_output=True, check=False, timeout=5).returncode == 0:
                return
        except (OSError, subprocess.TimeoutExpired):
            continue


def _flush_log() -> None:
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):  # exiting: nothing is left to tell it to
            handler.flush()


class StopWatch:
    """Armed when the daemon is asked to stop; exits the process `grace` seconds later unless
    `done` came first. `arm` runs on the trio thread; the wait runs on a thread of its own."""

    def __init__(
        self,
        mnt: Path,
        grace: float = STOP_GRACE,
        exit_process: Callable[[int], object] = os._exit,
        unmount: Callable[[Path, str], None] = detach,
    ) -> None:
        self.mnt, self.grace = mnt, grace
        self._exit, self._detach = exit_process, unmount
        self._done = threading.Event()
        self._armed = False
        self._device: str | None = None

    def mounted(self) -> None:
        """Remember which mount is ours, to detach only that one."""
        try:
            self._device = mounted_device(self.mnt)
        except OSError:
            self._device = None

    def arm(self, status: int, busy: list[str]) -> None:
        """The daemon was asked to stop: exit with `status` after the grace unless done.
        `busy` names the files being published when the stop was asked."""
        if self._armed:
            return
        self._armed = True
        waiting = threading.Thread(
            target=self._wait, args=(status, busy), name="stop-watch", daemon=True
        )
        waiting.start()

    def done(self) -> None:
        self._done.set()

    def _wait(self, status: int, busy: list[str]) -> None:
        if self._done.wait(self.grace):
            return
        what = f"publishing {', '.join(busy[:5])}" if busy else "a worker thread"
        log.warning(
            "still stopping after %.0f s (%s does not return): exiting now; a file being "
            "published stays spooled and is published after the next start",
            self.grace, what,
        )  # fmt: skip
        _flush_log()
        if self._device is not None:
            self._detach(self.mnt, self._device)
        self._exit(status)
