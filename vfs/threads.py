"""Kernel names for pool threads, so per-thread CPU figures (/proc/PID/task/*/comm) tell them
apart: Python 3.11 names a thread for itself only, and a pool thread otherwise keeps the name
of the thread that started it (a trio worker's "readahead from …"), blurring with trio's."""

from __future__ import annotations

import contextlib
import ctypes

_PR_SET_NAME = 15  # prctl(2)


def name_this_thread(name: str) -> None:
    """Set the calling thread's kernel name (at most 15 bytes are kept); best effort."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
