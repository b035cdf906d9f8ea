"""Segment maths of a crypt4gh body, and ChaCha20-Poly1305 decryption by span through the cache.

Plaintext offset p lives in segment p // SEGMENT_SIZE, whose cipher text starts at
header_len + (p // SEGMENT_SIZE) * CIPHER_SEGMENT_SIZE: every segment but the last is full, so a
read never needs anything but arithmetic to find its bytes, and decrypts only what it touches.
A read's cipher segments are fetched with one pread and decrypted in a loop; the cache holds
pages of PAGE_SEGMENTS segments, so a 1 MiB read costs one or two cache look-ups, not sixteen.

The cipher text comes from a local file (a path, or a `LocalFile`: preads into reused buffers,
RWF_NOWAIT inline decryption, WILLNEED read-ahead) or from any other `ByteSource` (an object in
a bucket: one ranged GET per span), so the same maths serves packages wherever they live.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import threading
from collections.abc import Hashable, Sequence
from pathlib import Path

from vfs.c4gh.buffers import (
    BufferPool,
    ByteBudget,
    RecycledBuffers,
    pread_reused,
)
from vfs.cache import IDLE_SHARE, PageCache
from vfs.errors import ArchiveChangedError, CorruptArchiveError
from vfs.stores.base import ByteSource
from vfs.stores.local import LocalFile

SEGMENT_SIZE = 65536
NONCE_SIZE = 12
TAG_SIZE = 16
CIPHER_SEGMENT_SIZE = SEGMENT_SIZE + NONCE_SIZE + TAG_SIZE  # 65564, a public crypt4gh constant
# Segments per cache entry: 2 MiB of plaintext. Against 1 MiB pages, streaming 1 GiB cost
# ~8% less daemon CPU here (half the preads, page locks and look-ups; 6 A/B rounds).
PAGE_SEGMENTS = 32
PAGE_SIZE = PAGE_SEGMENTS * SEGMENT_SIZE
MAX_SPAN_PAGES = 2  # one pread fetches at most this many pages' cipher text (4 MiB)
IDLE_PAGES = 12  # page buffers kept idle for the next loads: a read-ahead window and two spans
REQUEST_MAX = 1 << 20  # the largest read FUSE asks for (max_read)
MAX_SPAN = MAX_SPAN_PAGES * PAGE_SEGMENTS * CIPHER_SEGMENT_SIZE
MAX_FAILED = 4096  # failed segments remembered per reader (beyond: read-ahead retries them)
INLINE_SEGMENTS = 2  # read_cached decrypts this many itself when their cipher text is in RAM
NOWAIT = getattr(os, "RWF_NOWAIT", 0)  # preadv2: EAGAIN rather than wait for the disk
DIRECT_MIN = 4 * CIPHER_SEGMENT_SIZE  # loads this large read past the page cache (O_DIRECT)
CACHE_PREFIX = "c4gh"
PACKAGES_COUNTED = 4096  # packages SegmentStats counts apart (each name a user made was kept)

log = logging.getLogger(__name__)

Plain = bytes | bytearray | memoryview  # a decrypted segment as a page holds it


def cipher_offset(header_len: int, segment_no: int) -> int:
    """File offset of the cipher text of segment `segment_no`."""
    return header_len + segment_no * CIPHER_SEGMENT_SIZE


def segment_count(header_len: int, file_size: int) -> int:
    """How many (possibly partial) cipher segments the body holds."""
    body = max(file_size - header_len, 0)
    return -(-body // CIPHER_SEGMENT_SIZE)


def plaintext_capacity(header_len: int, file_size: int) -> int:
    """Plaintext bytes the body would carry if every segment authenticates.

    A trailing fragment of at most nonce + tag bytes carries no plaintext (it is a truncation).
    """
    body = max(file_size - header_len, 0)
    full, rest = divmod(body, CIPHER_SEGMENT_SIZE)
    return full * SEGMENT_SIZE + max(rest - NONCE_SIZE - TAG_SIZE, 0)


def touched_segments(offset: int, size: int) -> range:
    """Segments a plaintext read of `size` bytes at `offset` touches (empty for size <= 0)."""
    if size <= 0:
        return range(0)
    return range(offset // SEGMENT_SIZE, (offset + size - 1) // SEGMENT_SIZE + 1)


class _BadTag(Exception):
    """A segment failed authentication."""


class _OpenSSLAead:
    """ChaCha20-Poly1305 through `cryptography` (OpenSSL): ~4.5 GB/s per core here, 5x
    crypt4gh's libsodium binding, and recent releases (50.0 measured; upstream PR 15359) let go
    of the GIL while it works, so a read-ahead thread decrypts on the second core while the
    event loop serves (older ones hold it: still correct, less parallel)."""

    def __init__(self, session_key: bytes) -> None:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

        self._aead = ChaCha20Poly1305(session_key)
        self._invalid = InvalidTag
        self.into = hasattr(ChaCha20Poly1305, "decrypt_into")  # not in older releases

    def open(self, piece: memoryview) -> bytes:
        try:
            plain: bytes = self._aead.decrypt(piece[:NONCE_SIZE], piece[NONCE_SIZE:], None)
        except self._invalid:
            raise _BadTag from None
        return plain

    def open_into(self, piece: memoryview, out: memoryview) -> None:
        try:
            self._aead.decrypt_into(piece[:NONCE_SIZE], piece[NONCE_SIZE:], None, out)
        except self._invalid:
            raise _BadTag from None


@functools.lru_cache(maxsize=64)
def _openssl(session_key: bytes) -> _OpenSSLAead:
    return _OpenSSLAead(session_key)


def _cipher(session_key: bytes) -> _OpenSSLAead:
    """The cipher of a session key. crypt4gh's own libsodium binding once decrypted a daemon's
    first 16 segments, sparing the `cryptography` import (6-8 ms) on the way to the first bytes
    served; with the bytecode compiled, as installed, start to manifest bytes takes 0.18 s
    against the 0.3 s target either way, and the import then fell on a later read (a 7-8 ms
    stall among 4 KiB preads). One cipher, imported with the first segment."""
    return _openssl(session_key)


def decrypt_segment(
    cipher: bytes | memoryview, session_key: bytes, *, name: str, segment_no: int
) -> bytes:
    """Authenticate and decrypt one cipher segment (nonce ‖ cipher text ‖ tag).

    A failed tag raises CorruptArchiveError (EIO at the mount): tampered or cut bytes never
    reach a reader, as garbage or otherwise.
    """
    if len(cipher) <= NONCE_SIZE + TAG_SIZE:
        raise CorruptArchiveError(
            f"{name}: segment {segment_no} is truncated ({len(cipher)} bytes of cipher text)"
        )
    try:
        return _cipher(session_key).open(memoryview(cipher))
    except _BadTag:
        raise CorruptArchiveError(
            f"{name}: segment {segment_no} fails authentication (tampered or truncated package)"
        ) from None


class SegmentStats:
    """Counts segments actually decrypted (cache misses), shared by every reader of a backend.

    Each count is also a DEBUG line naming the package, the segment and both running totals: a
    daemon runs in its own process, and its log is how a test or an operator sees this counter
    (cheap: one lock and one level check per span decrypted when DEBUG is off).
    """

    def __init__(self) -> None:
        self.decrypted = 0
        self.per_package: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, package: Path | str, segment_no: int) -> None:
        self.count_many(package, (segment_no,))

    def count_many(self, package: Path | str, segments: Sequence[int]) -> None:
        if not segments:
            return
        key = str(package)
        with self._lock:
            before_mine = self.per_package.get(key, 0)
            before_all = self.decrypted
            if not before_mine and len(self.per_package) >= PACKAGES_COUNTED:
                del self.per_package[next(iter(self.per_package))]  # the first counted
            self.per_package[key] = before_mine + len(segments)
            self.decrypted = before_all + len(segments)
        if log.isEnabledFor(logging.DEBUG):
            for i, segment_no in enumerate(segments, 1):
                log.debug(
                    "%s: decrypted segment %d (%d for this package, %d in all)",
                    key,
                    segment_no,
                    before_mine + i,
                    before_all + i,
                )


class SegmentBuffers(RecycledBuffers):
    """64 KiB buffers segments are decrypted into, and (`pages`) PAGE_SIZE buffers a whole
    page is decrypted into, together about as many bytes as the cache can hold.

    With a fresh `bytes` per segment, streaming 1 GiB through a 512 MiB cache left 90-190 MiB
    of free but resident heap past the cache (decrypting threads come and go, and glibc keeps
    freed memory in the allocating thread's arena); recycled, the heap stays the cache's size.
    A page decrypted whole into one buffer serves a request inside it as one view, no copy.
    A page that leaves the cache gives its buffers back (`give_back`); a few are kept idle for
    the next loads (IDLE_PAGES page buffers, a page's worth of segment buffers), the others
    are dropped, so idle buffers do not sit beside what the cache holds of other archives.
    """

    def __init__(self, max_bytes: int) -> None:
        budget = ByteBudget(max_bytes + 2 * MAX_SPAN_PAGES * PAGE_SIZE)
        # The cache counts idle buffers against its budget (counts_idle): at most a share of it.
        share = max_bytes // IDLE_SHARE
        super().__init__(SEGMENT_SIZE, max_bytes // SEGMENT_SIZE + 2 * PAGE_SEGMENTS, budget,
                         reserve=min(PAGE_SEGMENTS, share // 2 // SEGMENT_SIZE))  # fmt: skip
        idle_pages = min(IDLE_PAGES, share // PAGE_SIZE)
        self.pages = RecycledBuffers(PAGE_SIZE, max_bytes // PAGE_SIZE + 2 * MAX_SPAN_PAGES,
                                     budget, reserve=idle_pages)  # fmt: skip

    @property
    def idle_bytes(self) -> int:
        return super().idle_bytes + self.pages.idle_bytes

    def give_back(self, page: _Page, wait: bool = True) -> None:
        """The buffers of `page`, which no longer holds them (it left the cache, or was
        emptied), back to their rings (`wait`: see RecycledBuffers.returned)."""
        if page.buf is not None:
            self.pages.returned(page.buf, wait)
        for plain in page.slots:
            if isinstance(plain, memoryview):
                plain = plain.obj  # a segment shorter than its buffer (the last one)
            if isinstance(plain, bytearray):
                self.returned(plain, wait)


def output_pool() -> BufferPool:
    """Buffers member reads are served in: a FUSE request is at most 1 MiB."""
    return BufferPool(REQUEST_MAX)


class _Page:
    """One cache entry: up to PAGE_SEGMENTS decrypted segments, each slot filled at most once.

    A slot holds only plaintext that authenticated and never changes once set, so readers look
    at slots without the lock; the lock lets one thread at a time decrypt into the page (so a
    read and a read-ahead never decrypt a segment twice). `nbytes` is what the cache charges.
    A page loaded whole has one buffer `buf` its segments lie in, in order; bit k of `inbuf`
    says slot k is in it (and authenticated), so a read inside the page is one view of it.
    """

    __slots__ = ("buf", "inbuf", "lock", "nbytes", "owner", "slots")

    def __init__(self, owner: SegmentBuffers | None = None) -> None:
        self.slots: list[Plain | None] = [None] * PAGE_SEGMENTS
        self.nbytes = 0
        self.lock = threading.Lock()
        self.buf: bytearray | None = None
        self.inbuf = 0
        self.owner = owner  # the rings its buffers came from

    def __del__(self) -> None:
        # Gone from the cache and from every reader: its buffers are free for the next loads.
        # Without waiting on a lock: the garbage collector may run this anywhere (a page in a
        # reference cycle through a stored exception's traceback), even inside `take`.
        owner = self.owner
        if owner is not None:
            with contextlib.suppress(Exception):  # never raise from a finalizer
                owner.give_back(self, wait=False)


class SegmentReader:
    """Plaintext of one package body, read by range, decrypting only the segments a read touches.

    Decrypted segments go through the shared PageCache in pages keyed ("c4gh", label, session,
    page_no) (label: the package's path or URL; session: a digest of its session key), so a
    member read, a read-ahead and a TAR walk never decrypt the same segment twice. `source` is
    a path (read with positional preads on one lazily opened descriptor), a `LocalFile` (the
    same, on its descriptor) or any other `ByteSource` (its `read`); a reader given a byte
    source owns it and closes it. Threads can share a reader.
    """

    def __init__(
        self,
        source: Path | str | ByteSource,
        header_len: int,
        session_key: bytes,
        cache: PageCache,
        *,
        file_size: int | None = None,
        stats: SegmentStats | None = None,
        buffers: SegmentBuffers | None = None,
        version: tuple[object, ...] = (),
    ) -> None:
        self._file: LocalFile | None = None  # a local package (opened on first use from a path)
        self._source: ByteSource | None = None
        if isinstance(source, (str, Path)):
            self.path: Path | None = Path(source)
            self.label = str(self.path)
            self.name = self.path.name
            size = os.stat(self.path).st_size if file_size is None else file_size
        else:
            self.path = None
            self._source = source
            self.label = source.name
            self.name = source.name.rpartition("/")[2]
            size = source.size if file_size is None else file_size
            if isinstance(source, LocalFile):  # the descriptor fast paths
                self._file = source
        self.header_len = header_len
        self.file_size = size
        self.size = plaintext_capacity(header_len, self.file_size)
        self.segments = segment_count(header_len, self.file_size)
        self.stats = stats if stats is not None else SegmentStats()
        self._key = session_key
        self._cache = cache
        self._buffers = buffers
        # The session key names the package's contents (each package draws its own): a file
        # replaced under the same path, even with its size and mtime kept, never meets the
        # plaintext of the one it replaced. Hashed: the key itself stays out of the cache's keys.
        # The version too (a local file's size, mtime, inode and ctime): a package rewritten in
        # place keeps its header, and so its session key, and a handle of the version before
        # must not be served the new one's segments (swapped ones decrypt).
        self._prefix = (
            CACHE_PREFIX,
            self.label,
            hashlib.sha256(session_key).digest()[:16],
            *version,
        )
        self._version = version
        self._lock = threading.Lock()
        self._advised = (0, 0)  # segments whose cipher text the kernel was asked to read ahead
        self._failed: set[int] = set()  # segments that failed: read-ahead does not retry them
        self._local = self.path is not None or self._file is not None
        self._nowait = bool(NOWAIT) and self._local
        self._direct_ok = self._local and hasattr(os, "O_DIRECT")  # until the file system refuses

    def cache_key(self, page_no: int) -> Hashable:
        """The cache key of page `page_no` (segments page_no * PAGE_SEGMENTS onwards)."""
        return (*self._prefix, page_no)

    def seed(self, segment_no: int, plaintext: Plain) -> None:
        """Keep a segment decrypted elsewhere (the header check decrypts segment 0)."""
        page_no, slot = divmod(segment_no, PAGE_SEGMENTS)
        page = self._page(page_no)
        with page.lock:
            if page.slots[slot] is None:
                page.slots[slot] = plaintext
                page.nbytes += len(plaintext)
        self._cache.put(self.cache_key(page_no), page)

    def release(self, first_page: int, stop_page: int) -> None:
        """Empty pages [first_page, stop_page) in the cache (a stream's pages far behind its
        reader): their segment buffers go back to be decrypted into again, and the cache
        charges the pages nothing. A reader still holding a segment keeps it (its buffer is
        not recycled while referenced); a later read of an emptied page decrypts it again.
        The page leaves the cache too: empty, it charged nothing, so it was never evicted while
        the cache had room (a long stream left an empty page object per page read)."""
        for page_no in range(max(first_page, 0), stop_page):
            key = self.cache_key(page_no)
            if key not in self._cache:
                continue
            page = self._page(page_no)
            with page.lock:
                if self._buffers is not None:
                    self._buffers.give_back(page)
                page.slots = [None] * PAGE_SEGMENTS  # one store: lock-free readers see either
                page.inbuf = 0  # before `buf` goes: see _page_view
                page.buf = None
                page.nbytes = 0
            self._cache.discard(key)

    def read(self, offset: int, size: int) -> bytes:
        """Plaintext bytes [offset, offset + size), short only at the end of the body."""
        found = self._span(offset, size, load=True)
        return b"" if found is None else bytes(self._assemble(*found, None))

    def read_view(self, offset: int, size: int, pool: BufferPool) -> bytes | memoryview:
        """`read`, as a view of a cached page or segment or of a pooled buffer (no fresh
        allocation)."""
        view = self._page_view(offset, size)
        if view is not None:
            return view
        found = self._span(offset, size, load=True)
        return b"" if found is None else self._assemble(*found, pool)

    def read_cached(
        self, offset: int, size: int, pool: BufferPool | None = None
    ) -> bytes | memoryview | None:
        """`read_view` if every segment it needs is decrypted already; None otherwise (no I/O)."""
        if size > MAX_SPAN_PAGES * PAGE_SIZE:
            return None  # large reads belong in a thread
        view = self._page_view(offset, size)
        if view is not None:
            return view
        found = self._span(offset, size, load=False)
        if found is None:
            if offset < 0 or offset >= min(offset + size, self.size):
                return b""
            found = self._decrypt_now(offset, size)
            if found is None:
                return None
        return self._assemble(*found, pool)

    def prefetch(self, first: int, count: int) -> None:
        """Decrypt up to `count` segments from `first` into the cache (sequential read-ahead).

        A page at a time (one pread each, `load_span`), so a reader waiting for the first page
        gets it before the rest are done; a caller with threads to spare hands the spans of
        `missing` to `load_span` itself, several at once. A segment that fails is left for the
        read that needs it to report. The cipher text of the `count` segments after these is
        asked of the disk now (`advise_ahead`).
        """
        self.advise_ahead(first, count)
        for span in self.missing(first, count):
            self.load_span(span)

    def missing(self, first: int, count: int) -> list[tuple[int, int]]:
        """Page by page, the spans of segments [first, first + count) not all decrypted yet:
        what `prefetch` would load (no I/O; cheap enough for the event loop). A segment that
        failed before does not count: a read-ahead would only fail it again, on every request
        of a reader streaming past it (the read that needs it still tries, and fails)."""
        n, stop = max(first, 0), min(first + count, self.segments)
        spans = []
        while n < stop:
            page_no = n // PAGE_SEGMENTS
            hi = min((page_no + 1) * PAGE_SEGMENTS, stop)
            page = self._cache.get(self.cache_key(page_no))
            if page is None or self._page_missing(page, page_no * PAGE_SEGMENTS, n, hi):
                spans.append((n, hi))
            n = hi
        return spans

    def _page_missing(self, page: _Page, base: int, lo: int, hi: int) -> bool:
        """Whether a segment of [lo, hi) in `page` still needs decrypting. Asked for every page
        of the read-ahead window on each request (on the event loop): a page loaded whole
        answers from its bits, others in a C-level scan before the per-segment look at
        failures (24 us for 8 pages segment by segment, measured here)."""
        want = ((1 << (hi - lo)) - 1) << (lo - base)
        if page.inbuf & want == want:
            return False
        window = page.slots[lo - base : hi - base]
        if not any(slot is None for slot in window):
            return False
        return any(s is None and k not in self._failed for k, s in enumerate(window, lo))

    def load_span(self, span: tuple[int, int]) -> None:
        """Decrypt segments [lo, hi) of one page into the cache (one of `missing`'s spans); a
        segment that fails is skipped, for the read that needs it to report."""
        self._load(*span, strict=False)

    def advise_ahead(self, first: int, count: int) -> None:
        """Ask the disk now for the `count` segments after [first, first + count), so the
        preads of the next read-ahead find them in the page cache (WILLNEED; only where loads
        read through the page cache)."""
        self._advise(min(first + count, self.segments), first + 2 * count)

    def verified_end(self) -> int:
        """Plaintext length up to which every segment can authenticate, judged by the last one.

        Only called when a TAR walk ended early, to tell a truncated tail from a complete one.
        """
        if self.segments == 0:
            return 0
        last = self.segments - 1
        try:
            self._load(last, last + 1, strict=True)
        except CorruptArchiveError:
            return last * SEGMENT_SIZE
        return self.size

    def close(self) -> None:
        with self._lock:
            self._direct_ok = False
            if self._source is not None:
                self._source.close()
            elif self._file is not None:
                self._file.close()
            self._file = None

    def __enter__(self) -> SegmentReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------

    def _advise(self, first: int, stop: int) -> None:
        """Start the disk reads of segments [first, stop) not advised yet (asynchronous)."""
        lo, hi = self._advised
        if lo <= first <= hi:
            first = hi  # a forward reader: only what the last call did not ask for
        else:
            lo = first
        stop = min(stop, self.segments)
        if first >= stop or not self._local or self._direct_ok:
            return  # O_DIRECT loads would not read what WILLNEED put in the page cache
        start = cipher_offset(self.header_len, first)
        with contextlib.suppress(OSError):
            os.posix_fadvise(
                self._descriptor(), start, self._cipher_end(stop) - start, os.POSIX_FADV_WILLNEED
            )
        self._advised = (lo, stop)

    def _decrypt_now(self, offset: int, size: int) -> tuple[list[Plain], int, int, int] | None:
        """A small read's span, decrypted on the calling thread if that cannot block: at most
        INLINE_SEGMENTS segments, no other thread loading their pages, and their cipher text in
        the kernel's page cache (RWF_NOWAIT). Decrypting 64 KiB (~20 us) costs less than the
        thread hop it saves a random reader; anything else, failures included, is None and
        left to `read` in a worker thread."""
        end = min(offset + size, self.size)
        first, stop = offset // SEGMENT_SIZE, (end - 1) // SEGMENT_SIZE + 1
        if not self._nowait or stop - first > INLINE_SEGMENTS:
            return None
        try:
            plains = self._load(first, stop, strict=True, nowait=True)
        except (_WouldBlock, CorruptArchiveError):
            return None
        except OSError as exc:  # EOPNOTSUPP and the like: this file system has no RWF_NOWAIT
            log.debug("%s: no non-blocking reads (%s); small reads go to threads", self.name, exc)
            self._nowait = False
            return None
        return plains, first, offset, end

    def disk_asked(self, offset: int, size: int) -> bool:
        """Whether a small read `read_cached` just declined is now on its way from the disk to
        the kernel's page cache (WILLNEED on its cipher text), so that polling `read_cached` a
        little while may serve it without a thread: the thread hop there and back costs 0.3 ms
        on this VM, three times the disk's own 64 KiB read. False where `read_cached` could not
        serve it however long one polled (too many segments, no RWF_NOWAIT)."""
        end = min(offset + size, self.size)
        if not self._nowait or offset < 0 or offset >= end:
            return False
        first, stop = offset // SEGMENT_SIZE, (end - 1) // SEGMENT_SIZE + 1
        if stop - first > INLINE_SEGMENTS:
            return False
        start = cipher_offset(self.header_len, first)
        with contextlib.suppress(OSError, ValueError):
            length = self._cipher_end(stop) - start
            os.posix_fadvise(self._descriptor(), start, length, os.POSIX_FADV_WILLNEED)
            return True
        return False

    def _page(self, page_no: int) -> _Page:
        page: _Page = self._cache.get_or_load(self.cache_key(page_no), self._new_page)
        return page

    def _new_page(self) -> _Page:
        return _Page(self._buffers)

    def _page_view(self, offset: int, size: int) -> memoryview | None:
        """A read inside one page loaded whole, as a view of its buffer (no copy); else None.

        Lock-free: `buf` is read before `inbuf`, and `release` clears `inbuf` before `buf`, so
        a buffer seen with its bits set is the page's, held by this reference (never handed out
        again meanwhile: see RecycledBuffers)."""
        end = min(offset + size, self.size)
        if offset < 0 or offset >= end:
            return None
        page_no = offset // PAGE_SIZE
        if (end - 1) // PAGE_SIZE != page_no:
            return None
        page = self._cache.get(self.cache_key(page_no))
        if page is None:
            return None
        buf = page.buf
        if buf is None:
            return None
        base = page_no * PAGE_SIZE
        lo, hi = (offset - base) // SEGMENT_SIZE, (end - 1 - base) // SEGMENT_SIZE + 1
        want = ((1 << (hi - lo)) - 1) << lo
        if page.inbuf & want != want:
            return None
        return memoryview(buf)[offset - base : end - base]

    def _cached(self, first: int, stop: int) -> list[Plain] | None:
        """The plaintext of segments [first, stop) if all are in the cache, else None."""
        out: list[Plain] = []
        for page_no in range(first // PAGE_SEGMENTS, (stop - 1) // PAGE_SEGMENTS + 1):
            page = self._cache.get(self.cache_key(page_no))
            if page is None:
                return None
            base = page_no * PAGE_SEGMENTS
            for plain in page.slots[max(first - base, 0) : min(stop - base, PAGE_SEGMENTS)]:
                if plain is None:
                    return None
                out.append(plain)
        return out

    def _load(self, first: int, stop: int, *, strict: bool, nowait: bool = False) -> list[Plain]:
        """Segments [first, stop), decrypting the missing ones with one pread.

        `strict`: a segment that fails raises CorruptArchiveError (after the good ones are
        kept); otherwise it is skipped and the list returned is incomplete. `nowait`: raise
        _WouldBlock rather than wait for another loader or for the disk.
        """
        if not 0 <= first < stop <= self.segments:
            raise CorruptArchiveError(
                f"{self.name}: segment {max(first, stop - 1)} is past the end"
            )
        first_page = first // PAGE_SEGMENTS
        pages = [self._page(p) for p in range(first_page, (stop - 1) // PAGE_SEGMENTS + 1)]
        held = []
        try:
            for page in pages:  # ascending order: two loaders never wait on each other
                if not page.lock.acquire(blocking=not nowait):
                    raise _WouldBlock
                held.append(page)
            missing = [n for n in range(first, stop) if _slot(pages, first_page, n) is None]
            if missing:
                self._fill(pages, first_page, missing[0], missing[-1] + 1, strict, nowait)
            plains = [_slot(pages, first_page, n) for n in range(first, stop)]
        finally:
            for page in reversed(held):
                page.lock.release()
        if missing:
            for page_no, page in enumerate(pages, first_page):
                self._cache.put(self.cache_key(page_no), page)  # charge what it holds now
        return [p for p in plains if p is not None]

    def _fill(
        self, pages: list[_Page], first_page: int, lo: int, hi: int, strict: bool, nowait: bool
    ) -> None:
        """Decrypt the empty slots of segments [lo, hi) from one pread; callers hold the locks."""
        start = cipher_offset(self.header_len, lo)
        want = self._cipher_end(hi) - start
        flags = NOWAIT if nowait else 0
        try:
            if not self._local:
                cipher = self._fetch(start, want)
            elif nowait or want < DIRECT_MIN or not self._direct_ok:
                cipher = pread_reused(self._descriptor(), want, start, MAX_SPAN, flags)
            else:
                cipher = self._read_direct(start, want)
        except BlockingIOError:
            raise _WouldBlock from None
        if nowait and len(cipher) < want:
            raise _WouldBlock  # in part on disk (or cut short: the thread's read says which)
        if self._local and self._version:
            self._check_version()
        cipher_of = _cipher(self._key)
        done: list[int] = []
        error: CorruptArchiveError | None = None
        whole = [self._whole_page(page, page_no, lo, hi, cipher_of.into)
                 for page_no, page in enumerate(pages, first_page)]  # fmt: skip
        for n in range(lo, hi):
            k = n // PAGE_SEGMENTS - first_page
            page = pages[k]
            slot = n % PAGE_SEGMENTS
            if page.slots[slot] is not None:
                continue
            at = (n - lo) * CIPHER_SEGMENT_SIZE
            piece = cipher[at : at + CIPHER_SEGMENT_SIZE]
            into = whole[k]
            if into is not None:  # the page's own buffer, at the segment's place in it
                into = into[slot * SEGMENT_SIZE : (slot + 1) * SEGMENT_SIZE]
            elif cipher_of.into:
                into = self._recycled()
            try:
                plain = self._decrypt(cipher_of, piece, n, into)
            except CorruptArchiveError as exc:
                error = error or exc
                if len(self._failed) < MAX_FAILED:
                    self._failed.add(n)
                continue
            page.slots[slot] = plain
            page.nbytes += len(plain)
            if whole[k] is not None:
                page.inbuf |= 1 << slot
            done.append(n)
        self.stats.count_many(self.label, done)
        if error is not None and strict:
            raise error

    def _read_direct(self, start: int, want: int) -> memoryview:
        """A large load's cipher text, read past the page cache (O_DIRECT).

        Measured streaming 1 GiB cold here: a buffered read costs 0.3-0.9 CPU-seconds of kernel
        time filling and copying the page cache, O_DIRECT 0.04 s (and the cache it would fill
        is never read again: the plaintext cache serves repeats). No RWF_NOWAIT probe of the
        page cache first: on a miss it starts the kernel's read-ahead before saying EAGAIN, so
        every byte was read twice. Where O_DIRECT is refused, loads use the page cache.
        """
        local = self._local_file()
        got = local.read_past_cache(start, want, MAX_SPAN)
        if got is None:  # refused (LocalFile logs it once): the page cache from now on
            self._direct_ok = False
            return pread_reused(local.fileno(), want, start, MAX_SPAN)
        return got

    def _whole_page(
        self, page: _Page, page_no: int, lo: int, hi: int, into: bool
    ) -> memoryview | None:
        """The buffer page `page_no` is decrypted into when [lo, hi) loads all of it and none
        of it is there yet (a page buffer, when one is free); else None: segment by segment."""
        base = page_no * PAGE_SEGMENTS
        stop = min(base + PAGE_SEGMENTS, self.segments)
        if not into or self._buffers is None or lo > base or hi < stop or page.nbytes:
            return None
        if page.buf is None:
            if any(page.slots):
                return None
            page.buf = self._buffers.pages.take()
            page.inbuf = 0
            if page.buf is None:
                return None
        return memoryview(page.buf)

    def _decrypt(
        self,
        cipher: _OpenSSLAead,
        piece: memoryview,
        n: int,
        into: bytearray | memoryview | None,
    ) -> Plain:
        """Segment `n` from its cipher text, into `into` (a recycled segment buffer, or the
        segment's place in its page's buffer) when one is given."""
        if len(piece) != self._cipher_end(n + 1) - cipher_offset(self.header_len, n):
            raise CorruptArchiveError(f"{self.name}: segment {n} is cut short on disk")
        if len(piece) <= NONCE_SIZE + TAG_SIZE:
            raise CorruptArchiveError(
                f"{self.name}: segment {n} is truncated ({len(piece)} bytes of cipher text)"
            )
        try:
            if into is None:
                return cipher.open(piece)
            size = len(piece) - NONCE_SIZE - TAG_SIZE
            out = memoryview(into)[:size]
            cipher.open_into(piece, out)
            return into if size == len(into) and isinstance(into, bytearray) else out
        except _BadTag:
            raise CorruptArchiveError(
                f"{self.name}: segment {n} fails authentication (tampered or truncated package)"
            ) from None

    def _recycled(self) -> bytearray | None:
        return None if self._buffers is None else self._buffers.take()

    def _cipher_end(self, stop: int) -> int:
        return min(cipher_offset(self.header_len, stop), self.file_size)

    def _span(
        self, offset: int, size: int, *, load: bool
    ) -> tuple[list[Plain], int, int, int] | None:
        """(segments, first segment, offset, end) of a read; None when it is empty, or (not
        `load`) when a segment it needs is not decrypted yet."""
        end = min(offset + size, self.size)
        if offset < 0 or offset >= end:
            return None
        first, stop = offset // SEGMENT_SIZE, (end - 1) // SEGMENT_SIZE + 1
        if not load:
            plains = self._cached(first, stop)
            return None if plains is None else (plains, first, offset, end)
        plains = []
        for lo, hi in _spans(first, stop):
            plains += self._cached(lo, hi) or self._load(lo, hi, strict=True)
        return plains, first, offset, end

    def _assemble(
        self, plains: list[Plain], first: int, offset: int, end: int, pool: BufferPool | None
    ) -> bytes | memoryview:
        views = [memoryview(p) for p in plains]
        views[-1] = views[-1][: end - (first + len(plains) - 1) * SEGMENT_SIZE]
        views[0] = views[0][offset - first * SEGMENT_SIZE :]
        if sum(len(v) for v in views) != end - offset:
            n = first + len(plains) - 1
            raise CorruptArchiveError(f"{self.name}: segment {n} decrypts short")
        if len(views) == 1:
            return views[0]  # a view of an immutable cached segment: nothing to copy
        out = pool.view(end - offset) if pool is not None else None
        if out is None:
            return b"".join(views)
        pos = 0
        for view in views:
            out[pos : pos + len(view)] = view
            pos += len(view)
        return out

    def _local_file(self) -> LocalFile:
        with self._lock:
            if self._file is None:
                if self.path is None:
                    raise ValueError(f"{self.name}: reader is closed")
                self._file = LocalFile(self.path)
            return self._file

    def _descriptor(self) -> int:
        return self._local_file().fileno()

    def _check_version(self) -> None:
        """The cipher text just read is the version this reader was made for (its file's size,
        mtime, inode and ctime after the read): a package rewritten in place since (its header
        kept, so its session key: segments swapped in it decrypt) is an error, never its
        segments. A verified member's handle has no running hash to tell them."""
        st = os.fstat(self._descriptor())
        now = (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
        if now != self._version:
            raise ArchiveChangedError(
                f"{self.name}: changed since it was opened (size, mtime, inode or ctime); "
                "reopen it to read the new version"
            )

    def _fetch(self, start: int, want: int) -> memoryview:
        """Up to `want` cipher bytes at `start` from a byte source, short (as a pread is) where
        the source ends before `file_size` says: the segments cut off then fail one by one."""
        assert self._source is not None
        have = max(0, min(want, self._source.size - start))
        return memoryview(self._source.read(start, have) if have else b"")


class _WouldBlock(Exception):
    """A non-blocking load would have had to wait (another loader, or the disk)."""


def _slot(pages: list[_Page], first_page: int, segment_no: int) -> Plain | None:
    page_no, slot = divmod(segment_no, PAGE_SEGMENTS)
    return pages[page_no - first_page].slots[slot]


def _spans(first: int, stop: int) -> list[tuple[int, int]]:
    """[first, stop) cut at page boundaries into runs of at most MAX_SPAN_PAGES pages."""
    step = MAX_SPAN_PAGES * PAGE_SEGMENTS
    out = []
    lo = first
    while lo < stop:
        hi = min((lo // PAGE_SEGMENTS) * PAGE_SEGMENTS + step, stop)
        out.append((lo, hi))
        lo = hi
    return out
