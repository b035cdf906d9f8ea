"""One open handle's served reads, fed to its running sha256 in order on a pool thread.

The event loop hands each served read over without a thread hop of its own: it appends to the
handle's queue, and a pool thread drains the queue into the hasher. Before, a trio task took
each batch to a worker thread and back: between two batches of a 1 GiB first read the hasher
sat idle 0.83 s of 2.07 s (a round trip through the event loop each, p50 2.3 ms) while the
reads waited on the full queue for 1.1 s. Here the loop is woken only when a read waits for
room (the backlog full) or when the hash is done.

A drain hashes what is queued, then goes to the back of the pool's queue if more came meanwhile:
one handle streaming a large file never holds a pool thread while another handle's reads wait.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import trio

from vfs.integrity import SequentialHasher
from vfs.threads import name_this_thread

log = logging.getLogger(__name__)

WORKERS = max(2, os.cpu_count() or 2)  # hashing is CPU work: one thread per core
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


class HashFeed:
    """Served reads of one handle, hashed in the order they were served.

    `put` (event loop) queues a read, waiting while `backlog` reads are queued already; `done`
    is set once the hash completed or gave up, or the feed was closed and drained: the verdict
    and a handle's close wait on it. Owned by the event loop; the drain runs on a pool thread
    and shares `_items`, `_running`, `_finished` and `_room` under `_lock`.
    """

    def __init__(self, hasher: SequentialHasher, backlog: int) -> None:
        self.hasher = hasher
        self.done = trio.Event()
        self._backlog = backlog
        self._token = trio.lowlevel.current_trio_token()
        self._items: deque[tuple[int, Any]] = deque()
        self._lock = threading.Lock()
        self._running = False  # a drain is queued on the pool or running
        self._finished = False  # complete, abandoned or closed: nothing more is hashed
        self._closed = False
        self._room: trio.Event | None = None  # set by the drain when a waiting put may go on

    async def put(self, offset: int, data: Any) -> None:
        """Queue a served read; a no-op once the hash is finished (its verdict needs no more)."""
        while True:
            with self._lock:
                if self._finished or self._closed:
                    return
                if len(self._items) < self._backlog:
                    self._items.append((offset, data))
                    start = not self._running
                    self._running = True
                    break
                room = self._room = trio.Event()
            await room.wait()
        if start:
            _pool().submit(self._drain)

    def close(self) -> None:
        """No more reads come (the handle closes): `done` is set once what is queued is hashed."""
        with self._lock:
            self._closed = True
            idle = not self._running
        if idle:
            self.done.set()

    def _drain(self) -> None:
        """(pool thread) Hash what is queued now; then go again at the back of the pool's
        queue if more came, or stop."""
        with self._lock:
            batch = list(self._items)
            self._items.clear()
            room, self._room = self._room, None
        if room is not None:
            self._soon(room.set)
        finished = False
        try:
            for offset, data in batch:
                if self.hasher.feed(offset, data) or self.hasher.abandoned:
                    finished = True
                    break
        except Exception:
            log.exception("hashing served reads failed")
            self.hasher.abandon()  # a hash that failed checks nothing: the file is verified aside
            finished = True
        finally:
            with self._lock:
                if finished:
                    self._finished = True
                    self._items.clear()
                more = bool(self._items)
                self._running = more
                end = not more and (self._finished or self._closed)
                room, self._room = (self._room, None) if finished else (None, self._room)
            if room is not None:
                self._soon(room.set)
            if end:
                self._soon(self.done.set)
            elif more:
                _pool().submit(self._drain)

    def _soon(self, fn: Any) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(fn)


def _pool() -> ThreadPoolExecutor:
    """Threads the drains run on, shared by every handle."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(WORKERS, "decant-hash", initializer=_name_thread)
        return _POOL


def start_threads() -> None:
    """Start the pool's threads now (at mount), not in the first read that hashes: starting
    them there cost that read ~0.4 ms. Idle threads cost nothing."""
    pool, barrier = _pool(), threading.Barrier(WORKERS)
    for _ in range(WORKERS):  # each waits for the others: one thread per task
        pool.submit(barrier.wait, 5.0)


def _name_thread() -> None:
    name_this_thread("decant-hash")
