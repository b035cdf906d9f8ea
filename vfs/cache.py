"""A byte-bounded, thread-safe LRU shared by every reader, with single-flight loading."""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

from vfs.errors import DecodeTooLargeError, StoreError


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


IDLE_SHARE = 8  # buffers kept idle for reuse: at most this fraction of a cache's budget
DECODE_GATE_BYTES = 256 << 20  # what decodes in flight may hold at once, or half the cache
# A decode of blosc blocks may always hold this much (PageCache.decode_bound).
DECODE_FLOOR = 64 << 20


class IdlePool(Protocol):
    """Buffers kept for reuse that the cache counts against its budget."""

    @property
    def idle_bytes(self) -> int: ...


# What holding one value costs beyond its bytes: its key, the dict's entry, the view and the
# array object. Measured ~990 bytes for a 2-byte plane (an AcqStore image of 1x1 planes, each
# its own chunk: 390,000 of them charged 2 bytes each took a 256 MiB cache's daemon to 633 MiB;
# red team 65, F2). Charged to values under SMALL_VALUE only: above, it is under 1.6% of one.
ENTRY_BYTES = 1024
SMALL_VALUE = 64 << 10


def nbytes_of(value: Any) -> int:
    """Size charged against the budget: buffers by their bytes, anything else by a flat guess."""
    if isinstance(value, memoryview):
        return value.nbytes  # len() counts items: a (2048, 2048) uint16 view has len 2048
    if isinstance(value, bytes | bytearray):
        return len(value)
    size = getattr(value, "nbytes", None)
    return int(size) if size is not None else 64


class BufferPool:
    """Decode buffers of values the cache let go, handed to the next decode of the same size.

    A fresh 8 MiB buffer costs its page faults and the kernel zeroing it (clear_page was ~30%
    of the daemon's CPU streaming a file here); one that was faulted in before costs neither.
    A buffer is reused only when nothing but this pool refers to it: every memoryview, slice or
    numpy view of it holds a reference to it, so a view still served or queued for hashing
    keeps it out of reach. At most `keep_bytes` of idle buffers are kept, and the cache counts
    them (`idle_bytes`) against its own budget: they are resident memory it let go of.
    """

    MIN_BYTES = 1 << 20  # smaller buffers come from malloc's free lists anyway
    KEEP_BYTES = 32 << 20

    def __init__(self, keep_bytes: int = KEEP_BYTES) -> None:
        self.keep_bytes = keep_bytes
        self.reused = 0
        self.idle_bytes = 0  # of the buffers kept (read without the lock: an estimate)
        self._free: list[np.ndarray[Any, Any]] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray[Any, Any]:
        """A uint8 array of `nbytes`, uninitialized: a released buffer if one fits, else new."""
        if nbytes >= self.MIN_BYTES:
            with self._lock:
                for i in range(len(self._free)):
                    arr = self._free[i]
                    # References: the list, `arr`, and getrefcount's argument; any more is a
                    # view somewhere (each memoryview, slice or array over it holds one).
                    if arr.nbytes == nbytes and sys.getrefcount(arr) == 3:
                        del self._free[i]
                        self.idle_bytes -= nbytes
                        self.reused += 1
                        return arr
        import numpy  # here, not at the top: a daemon serving only packages never loads it

        return numpy.empty(nbytes, dtype=numpy.uint8)

    def give(self, value: Any) -> None:
        """Offer an evicted value: kept if it is a view of a whole buffer `take` could return."""
        arr = value.obj if isinstance(value, memoryview) else None
        # Unloaded, no value is an array. Being imported by another thread (a first decant
        # open), the module has no `ndarray` yet: a package page evicted meanwhile raised
        # AttributeError, and the open that evicted it failed with EIO.
        ndarray = getattr(sys.modules.get("numpy"), "ndarray", None)
        if arr is None or ndarray is None or not isinstance(arr, ndarray):
            return
        if arr.nbytes < self.MIN_BYTES:
            return
        if arr.dtype.char != "B" or arr.ndim != 1 or not arr.flags.owndata:
            return
        with self._lock:
            self._free.append(arr)
            self.idle_bytes += arr.nbytes
            while self.idle_bytes > self.keep_bytes:
                self.idle_bytes -= self._free.pop(0).nbytes


class _Load:
    """A load in flight: set once it ends; `error` when the store failed it (see get_or_load)."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: StoreError | None = None


class PageCache:
    """LRU over decoded pages, husk blocks and cipher segments, bounded in bytes.

    `get_or_load` runs the loader outside the lock and makes concurrent callers asking for the same
    key wait for that one load, so a reader and a read-ahead never decode the same plane twice.
    A value larger than the whole budget is returned but not kept. A load that says how large its
    value will be (`nbytes`) is given room before it runs, so decodes in flight count against the
    budget too instead of adding to it.

    A load the store failed (`StoreError`: unreachable after the request's retries) fails its
    waiters too, instead of each loading again: a read waiting for a read-ahead decode then gives
    EIO once that decode's GET has spent its retries, not after a second round of its own (twice
    the bound `--s3-timeout` promises). Any other failure is left to each waiter to meet itself.
    """

    def __init__(self, max_bytes: int, entry_bytes: int = ENTRY_BYTES) -> None:
        self.max_bytes = max_bytes
        self.entry_bytes = entry_bytes  # charged to each value under SMALL_VALUE besides its own
        self.stats = CacheStats()
        # Decodes reuse what eviction releases: at most an eighth of the budget, counted in it.
        self.buffers = BufferPool(min(BufferPool.KEEP_BYTES, max_bytes // IDLE_SHARE))
        self._idle_pools: list[IdlePool] = [self.buffers]
        self._data: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._reserved = 0  # bytes promised to loads in flight
        self._lock = threading.Lock()
        self._inflight: dict[Hashable, _Load] = {}
        # Decodes in flight, every reader's together (planes of originals and synthesized
        # TIFFs; `decoding`): room in the cache only evicts for a decode, and a small cache
        # could not stop six at once from holding six planes beside it. At the default budget
        # nothing waits.
        self.decodes = ByteGate(min(max_bytes // 2, DECODE_GATE_BYTES))

    @property
    def current_bytes(self) -> int:
        return self._bytes

    @property
    def idle_bytes(self) -> int:
        """Bytes of the buffers kept for reuse that the budget counts (`counts_idle`), all told;
        the budget counts at most half of itself."""
        return sum(pool.idle_bytes for pool in self._idle_pools)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._data

    def present_or_loading(self, key: Hashable) -> bool:
        """Cached, or being loaded by another thread (get_or_load will wait for it)."""
        with self._lock:
            return key in self._data or key in self._inflight

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            item = self._data.get(key)
            if item is None:
                self.stats.misses += 1
                return None
            self._data.move_to_end(key)
            self.stats.hits += 1
            return item[0]

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._store(key, value)

    def _store(self, key: Hashable, value: Any) -> None:
        size = nbytes_of(value)
        size += self.entry_bytes if size < SMALL_VALUE else 0
        old = self._data.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
            self.buffers.give(old[0])
        if size > self.max_bytes:
            return
        self._data[key] = (value, size)
        self._bytes += size
        self._evict()

    def counts_idle(self, pool: IdlePool) -> None:
        """Count `pool`'s idle buffers (kept for reuse, resident) against the budget too."""
        with self._lock:
            self._idle_pools.append(pool)
            self._evict()

    def _idle_bytes(self) -> int:
        # At most half the budget: the other half always caches (with a small cache, the
        # threads' read buffers alone would otherwise evict every value as it is stored).
        return min(self.idle_bytes, self.max_bytes // 2)

    def _evict(self) -> None:
        # Idle buffers count: kept beside a full cache, 16 readers of a package and an original
        # held 50-60 MiB of them past the budget. An eviction may add to them (the evicted
        # value's buffer kept), so they are read again each turn; they are bounded (IDLE_SHARE).
        while self._data and self._bytes + self._reserved + self._idle_bytes() > self.max_bytes:
            _, (value, evicted) = self._data.popitem(last=False)
            self._bytes -= evicted
            self.stats.evictions += 1
            self.buffers.give(value)

    def get_or_load(self, key: Hashable, loader: Callable[[], Any], nbytes: int = 0) -> Any:
        reserve = nbytes if nbytes <= self.max_bytes else 0
        while True:
            with self._lock:
                item = self._data.get(key)
                if item is not None:
                    self._data.move_to_end(key)
                    self.stats.hits += 1
                    return item[0]
                waiting = self._inflight.get(key)
                if waiting is None:
                    self.stats.misses += 1
                    load = self._inflight[key] = _Load()
                    self._reserve(reserve)
                    break
            waiting.done.wait()
            if waiting.error is not None:  # the store failed it just now, after its retries
                raise type(waiting.error)(*waiting.error.args)
            # The loader finished (or failed); loop to take its value or to load it ourselves.
            with self._lock:
                item = self._data.get(key)
                if item is not None:
                    self._data.move_to_end(key)
                    self.stats.hits += 1
                    return item[0]
                if key not in self._inflight:
                    # Loaded but too large to keep, or the loader raised: load it here.
                    self.stats.misses += 1
                    load = self._inflight[key] = _Load()
                    self._reserve(reserve)
                    break
        loaded = False
        try:
            value = loader()
            loaded = True
            return value
        except StoreError as exc:
            load.error = exc
            raise
        finally:
            with self._lock:
                self._reserved -= reserve
                if loaded:
                    self._store(key, value)
                del self._inflight[key]
            load.done.set()

    def lend(self, nbytes: int) -> None:
        """Room for bytes held outside the cache on its behalf (an object store's read-ahead,
        vfs.stores.s3): evicted for now, so the cache and what it lends stay within max_bytes
        together. Given back with `unlend`."""
        with self._lock:
            self._reserve(nbytes)

    def unlend(self, nbytes: int) -> None:
        with self._lock:
            self._reserved -= nbytes

    def decode_bound(self) -> int:
        """The most a decode of blosc blocks may hold: half the cache (its room is lent from
        the cache while it runs, and half is left to every other reader), at least
        DECODE_FLOOR."""
        return max(self.max_bytes // 2, DECODE_FLOOR)

    def check_blocks(self, hold: int, what: str) -> None:
        """Refuse a decode of blosc blocks past `decode_bound` before it allocates
        (DecodeTooLargeError, naming `what`). A chunk may state blocks as large as its plane:
        a 115 KB archive of 512 MiB blocks took a 64 MiB-cache daemon to 3.1 GiB, each 4 KiB
        read decoding one (red team 87). A writer's blocks are at most a few MiB. Whole planes
        are not held to it: the format allows planes of 1 GiB, tiled ones decode to twice
        that, and an archive that verified before must still read (red team 88); the gate
        runs such a decode alone."""
        bound = self.decode_bound()
        if hold > bound:
            raise DecodeTooLargeError(
                f"{what}: decoding its blosc blocks needs {hold >> 20} MiB at once, more than "
                f"the {bound >> 20} MiB this mount lets them hold (half the --cache-size, at "
                f"least {DECODE_FLOOR >> 20} MiB)"
            )

    @contextmanager
    def decoding(self, hold: int, room: int) -> Iterator[None]:
        """Run a decode: `hold` bytes of the decode gate, then room for its `room`-byte value
        evicted from the cache while it runs. Room taken by `get_or_load` before the gate was
        taken by every decode waiting there too: twenty-four readers under a 32 MiB cache kept
        it empty, and each read decoded its plane again."""
        with self.decodes.held(hold):
            self.lend(room)
            try:
                yield
            finally:
                self.unlend(room)

    def _reserve(self, nbytes: int) -> None:
        # With the lock held. Evicting for it now, rather than after the decode, means a
        # 256 MiB cache with 4 decoders of 8 MiB planes holds 256 MiB, not 288, at its peak.
        self._reserved += nbytes
        self._evict()

    def discard_prefix(self, *prefix: Hashable) -> None:
        """Drop every key whose first elements are `prefix` (an archive that changed on disk)."""
        n = len(prefix)
        with self._lock:
            for key in [k for k in self._data if isinstance(k, tuple) and k[:n] == prefix]:
                self._bytes -= self._data.pop(key)[1]

    def discard_source(self, name: str) -> None:
        """Drop the pages of the archive at `name` (a URL) or below it (a folder archive's),
        whatever version: keys whose first element is an identity led by such a name."""

        def of(key: Hashable) -> bool:
            head = key[0] if isinstance(key, tuple) and key else None
            first = head[0] if isinstance(head, tuple) and head else None
            return isinstance(first, str) and (
                first.rstrip("/") == name or first.startswith(name + "/")
            )

        with self._lock:
            for key in [k for k in self._data if of(k)]:
                self._bytes -= self._data.pop(key)[1]

    def discard(self, key: Hashable) -> None:
        """Drop one value (a plane a forward reader has passed), its buffer offered for reuse."""
        with self._lock:
            item = self._data.pop(key, None)
            if item is not None:
                self._bytes -= item[1]
                self.buffers.give(item[0])
                self._evict()  # the buffer kept idle counts


class ByteGate:
    """Bytes that decodes in flight may hold at once, all told: a decode waits for room unless
    none is under way (so one always runs). The cache's reservations only evict for a decode;
    they cannot stop six of them (four read threads, two read-ahead threads) from holding six
    planes outside the cache together."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._room = threading.Condition()
        self._queue: deque[object] = deque()  # waiters, first come first in
        self._holding = threading.local()

    def room(self) -> int:
        """Bytes a decode could hold now without waiting (a guess: read-ahead asks it, so as
        not to queue decodes that would only wait behind the ones a reader needs)."""
        with self._room:
            return 0 if self._queue else self.capacity - self.used

    @contextmanager
    def held(self, nbytes: int) -> Iterator[None]:
        """Hold `nbytes` for the block. In turn: a large decode is not passed for ever by
        small ones that keep fitting. A thread already holding passes (a decode whose chunk
        comes from another decode would otherwise wait for itself)."""
        if getattr(self._holding, "yes", False):
            yield
            return
        me = object()
        with self._room:
            self._queue.append(me)
            while self._queue[0] is not me or (self.used and self.used + nbytes > self.capacity):
                self._room.wait()
            self._queue.popleft()
            self.used += nbytes
            self._room.notify_all()  # the next in line may fit too
        self._holding.yes = True
        try:
            yield
        finally:
            self._holding.yes = False
            with self._room:
                self.used -= nbytes
                self._room.notify_all()


class DropBehind:
    """The planes a forward reader has passed, taken out of the cache (`discard`), for a file that
    does not fit in it: kept, LRU would evict its first planes for its last and a re-read would
    miss anyway, while every plane decoded into a fresh buffer (page faults, the kernel zeroing
    it). Dropped, their buffers decode the planes ahead. Shared by the decant reader and the
    synthesized AcqStore TIFF."""

    def __init__(self, cache: PageCache, keep: int, span: int) -> None:
        self.cache = cache
        self.keep = keep  # planes kept behind the current one (the kernel has two reads in flight)
        self.span = span  # planes dropped per call at most (a reader that jumps far ahead)
        self.behind = 0  # planes below this were dropped
        self._lock = threading.Lock()

    def passed(self, current: int, key: Callable[[int], Hashable]) -> None:
        """The reader is at plane `current`: drop those more than `keep` before it."""
        stop = current - self.keep
        with self._lock:
            first = max(self.behind, stop - self.span)
            self.behind = max(self.behind, stop)
        for n in range(first, stop):
            self.cache.discard(key(n))
