"""Threads shared by the readers, and their kernel names.

Names, so per-thread CPU figures (/proc/PID/task/*/comm) tell them apart: Python 3.11 names a
thread for itself only, and a pool thread otherwise keeps the name of the thread that started
it (a trio worker's "readahead from …"), blurring with trio's."""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

_PR_SET_NAME = 15  # prctl(2)


def name_this_thread(name: str) -> None:
    """Set the calling thread's kernel name (at most 15 bytes are kept); best effort."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


_HELPER: ThreadPoolExecutor | None = None
_HELPER_LOCK = threading.Lock()
_HELPER_FREE = threading.Semaphore(1)  # taken while the helper works on one read's blocks


def block_helper() -> ThreadPoolExecutor:
    """One thread shared by every decant reader: a small read's second blosc block decodes on
    the other core while its first decodes on the reading thread (vfs.decant.partial)."""
    global _HELPER
    with _HELPER_LOCK:
        if _HELPER is None:
            _HELPER = ThreadPoolExecutor(1, "decant-blocks", initializer=name_this_thread,
                                         initargs=("decant-blocks",))  # fmt: skip
        return _HELPER


def aside(fn: Callable[..., T], *args: Any) -> Future[T] | None:
    """`fn(*args)` on the helper thread if it is idle, else None (the caller does the work):
    a read never waits behind another's blocks, so one user's stream of small reads cannot
    slow another's."""
    if not _HELPER_FREE.acquire(blocking=False):
        return None

    def run() -> T:
        try:
            return fn(*args)
        finally:
            _HELPER_FREE.release()

    try:
        return block_helper().submit(run)
    except BaseException:
        _HELPER_FREE.release()
        raise


def start_block_helper() -> None:
    """Start the helper thread now (at mount), not in the first read over two blocks."""
    block_helper().submit(int).result()
