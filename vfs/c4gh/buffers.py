"""Reused buffers for the read path: pooled outputs, recycled segment buffers, per-thread preads
(through the page cache; past it: vfs.stores.direct).

A buffer is handed out again only once its reference count shows that nothing holds it: every
view of a buffer (a memoryview, a slice of one, a Py_buffer in C) holds a reference, so one given
to pyfuse3, queued for hashing or kept in a cache page is never written again while it is in use.
Where reference counts do not behave so (not CPython), nothing is pooled and callers allocate.
"""

from __future__ import annotations

import collections
import os
import sys
import threading

from vfs.threadbuffers import keep

_FREE_REFS = 3  # the container, the loop variable and getrefcount's own argument


def refcounts_track_views() -> bool:
    """Whether a buffer's reference count shows each view of it, as in CPython."""
    probe = [bytearray(1)]
    free = sys.getrefcount(probe[0])  # the list and the argument
    view = memoryview(probe[0])
    held = sys.getrefcount(probe[0])
    del view
    return free == _FREE_REFS - 1 and held == free + 1


class BufferPool:
    """Output buffers of `size` bytes, at most `limit` of them.

    A read through the mount is copied out of the cached segments into one buffer. A fresh
    1 MiB `bytes` per read costs an allocation, its page faults, and a heap that fragments
    between the cache's 64 KiB segments.
    """

    def __init__(self, size: int, limit: int = 16) -> None:
        self.size = size
        self.limit = limit
        self._buffers: list[bytearray] = []
        self._lock = threading.Lock()
        self._usable = refcounts_track_views()

    def view(self, nbytes: int) -> memoryview | None:
        """A writable view of `nbytes` in a buffer nothing uses; None when all are busy."""
        if nbytes > self.size or not self._usable:
            return None
        with self._lock:
            for buf in self._buffers:
                if sys.getrefcount(buf) <= _FREE_REFS:
                    return memoryview(buf)[:nbytes]  # the view holds it before the lock goes
            if len(self._buffers) >= self.limit:
                return None
            buf = bytearray(self.size)
            self._buffers.append(buf)
            return memoryview(buf)[:nbytes]


class ByteBudget:
    """Bytes that several RecycledBuffers may allocate between them, all told."""

    def __init__(self, max_bytes: int) -> None:
        self.left = max_bytes
        self._lock = threading.Lock()

    def spend(self, nbytes: int) -> bool:
        with self._lock:
            if nbytes > self.left:
                return False
            self.left -= nbytes
            return True

    def refund(self, nbytes: int) -> None:
        with self._lock:
            self.left += nbytes


class RecycledBuffers:
    """Up to `limit` buffers of `size` bytes, handed out again, oldest first, once free.

    For data a byte-bounded LRU keeps: the oldest buffers are the first it lets go of, so the
    oldest is looked at first. Buffers are not freed while in use, so the heap holds at most
    `limit` of them however threads allocate (glibc keeps freed memory in the arena of the
    thread that allocated it, and worker threads come and go). With a `budget`, a new buffer is
    made only while the budget (shared with other sizes) lasts.

    A holder that lets a buffer go (its page left the cache) says so with `returned`: at most
    `reserve` such idle buffers are kept for the next loads, the others are dropped and their
    bytes go back to the budget. Kept, every buffer ever made stayed resident beside the cache:
    a package streamed and then a decant original read through a 256 MiB cache left the daemon
    at 455 MiB (the cache's own bytes plus the package's idle buffers).
    """

    SCAN = 32  # buffers looked at, once there are `limit`, before giving up

    def __init__(
        self, size: int, limit: int, budget: ByteBudget | None = None, reserve: int = 0
    ) -> None:
        self.size = size
        self.limit = limit
        self.reserve = reserve
        self._budget = budget
        self._spent = False  # the budget said no: no new buffer will be made until a refund
        # id -> buffer, oldest first (a buffer looked at moves to the end); by id, since equal
        # contents are not the same buffer and `returned` must find its own in O(1).
        self._ring: dict[int, bytearray] = {}
        self._idle = 0  # buffers returned and kept, not handed out since (an estimate)
        self._later: collections.deque[object] = collections.deque()  # see `returned`
        self._lock = threading.Lock()
        self._usable = refcounts_track_views()

    def __len__(self) -> int:
        return len(self._ring)

    @property
    def idle_bytes(self) -> int:
        """Bytes of the buffers kept idle for reuse (an estimate; see vfs.cache.IdlePool)."""
        return self._idle * self.size

    def take(self) -> bytearray | None:
        """A buffer nothing else holds (the caller's reference keeps it from the others), or
        None when all `limit` are in use."""
        if not self._usable:
            return None
        with self._lock:
            self._refund(self._settle())
            ring = self._ring
            # Until the LRU is full hardly any buffer comes free: look at two, then make one.
            full = len(ring) >= self.limit or self._spent
            for _ in range(min(len(ring), self.SCAN if full or self._idle else 2)):
                key = next(iter(ring))
                buf = ring.pop(key)
                ring[key] = buf
                if sys.getrefcount(buf) <= _FREE_REFS:
                    self._idle = max(0, self._idle - 1)
                    return buf
            if full:
                return None
            if self._budget is not None and not self._budget.spend(self.size):
                self._spent = True
                return None
            buf = bytearray(self.size)
            ring[id(buf)] = buf
            return buf

    def returned(self, buf: object, wait: bool = True) -> None:
        """`buf` (one of this ring's, else nothing happens) is no longer held by its page: keep
        it for reuse while fewer than `reserve` are idle, else drop it from the ring.

        `wait=False` (from a finalizer, which may run inside any allocation, this ring's own
        `take` included): when the lock is taken, the buffer is queued and the next call here
        or to `take` settles it, so a finalizer never waits on a lock."""
        if not self._lock.acquire(blocking=wait):
            self._later.append(buf)
            return
        try:
            dropped = self._keep_or_drop(buf) + self._settle()
        finally:
            self._lock.release()
        self._refund(dropped)

    def _keep_or_drop(self, buf: object) -> int:
        """With the lock held: 1 if `buf` left the ring, else 0."""
        if self._ring.get(id(buf)) is not buf:
            return 0
        if self._idle < self.reserve:
            self._idle += 1
            return 0
        del self._ring[id(buf)]
        self._spent = False
        return 1

    def _settle(self) -> int:
        """With the lock held: what finalizers queued meanwhile; how many buffers left."""
        dropped = 0
        while self._later:
            try:
                buf = self._later.popleft()
            except IndexError:  # another finalizer's append raced the check: none left
                break
            dropped += self._keep_or_drop(buf)
        return dropped

    def _refund(self, buffers: int) -> None:
        if buffers and self._budget is not None:
            self._budget.refund(buffers * self.size)


_per_thread = threading.local()


def pread_reused(fd: int, size: int, offset: int, keep_up_to: int, flags: int = 0) -> memoryview:
    """Up to `size` bytes at `offset`, read into this thread's reused buffer (preadv2 `flags`).

    Valid until the thread's next call. Reusing it spares a fresh allocation (and its page
    faults) per read; a buffer larger than `keep_up_to` is not kept for the next call.
    """
    buf: bytearray | None = getattr(_per_thread, "buffer", None)
    if buf is None or len(buf) < size:
        buf = bytearray(size)
        if size <= keep_up_to:
            keep(_per_thread, "buffer", buf, size)
    view = memoryview(buf)
    got = (
        os.preadv(fd, [view[:size]], offset, flags)
        if flags
        else os.preadv(fd, [view[:size]], offset)
    )
    return view[:got]
