"""A TIFF synthesized on demand from a full-resolution OME-Zarr array, read at any (offset, size).

Layout: header, the first IFD (the only one carrying the ImageJ/OME description), values shared by
every page, then IFDs 1..N-1 of one fixed stride, then every plane's pixels back to back (one page
per plane, uncompressed, striped). Everything before the pixels is arithmetic on shape and dtype:
only the first IFD is kept as bytes; the others are generated for the range a read touches, so
opening a 100,000-plane image costs the same as a one-plane image.
"""

from __future__ import annotations

import logging
import math
import struct
import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from vfs.acqstore.ngff import Axis, NgffImage
from vfs.acqstore.tiff_meta import describe_planes, resolution
from vfs.cache import DropBehind, PageCache
from vfs.decant.limits import MAX_CHUNK_BYTES, human
from vfs.errors import CorruptArchiveError, DecantError, UnsupportedFormatError

log = logging.getLogger(__name__)

MAX_PLANE_BYTES = MAX_CHUNK_BYTES  # a plane is decoded whole: bounded as a decant chunk is
CLASSIC_MAX_SIZE = 2**32  # every offset and count of a classic TIFF is a 32-bit LONG
STRIP_BYTES = 1 << 20  # strips of about 1 MiB: few strip offsets per IFD, small reader buffers
BLOCK_BYTES = 64 << 20  # read a whole zarr chunk of planes at once when it is no larger than this
# Planes queued ahead of a forward reader (at most a quarter of the cache). Three kept the two
# decoders waiting for the reader to move: 0.49-0.56 s for a cold 512 MiB read here, 0.40-0.46 s
# with eight (tools/bench.py acqstore; 16 were no faster).
READAHEAD_PLANES = 8
# Planes kept behind a forward reader of an image larger than a quarter of the cache (the kernel
# keeps two requests in flight, so the plane before the current one may still be asked for).
DROP_BEHIND = 2
REQUEST_BYTES = 1 << 20  # the largest read FUSE asks for (max_read)
# Decodes one read may need at most: an image of 1x1 planes, each its own chunk, had a 128 KiB
# read decode 65,536 of them, 25-150 s a read (red team 65, F2). At ~0.3 ms a decode, 1,024 of
# them keep a 1 MiB read under about 0.3 s: planes of 1 KiB and up, or chunks of several planes.
MAX_DECODES_PER_READ = 1024
SHORT, LONG, RATIONAL, LONG8, ASCII = 3, 4, 5, 16, 2
_SAMPLE_FORMAT = {"u": 1, "b": 1, "i": 2, "f": 3}
_N_TAGS = 13  # tags in every IFD; the first one adds ImageDescription


class TiffLayout:
    """Byte geometry of the synthesized file for one array shape and dtype; reads no pixels."""

    def __init__(
        self,
        axes: Sequence[Axis],
        shape: Sequence[int],
        dtype: Any,
        scale: Sequence[float],
        *,
        name: str = "",
        flavor: str = "auto",
        bigtiff: bool | None = None,
    ) -> None:
        src = np.dtype(dtype)
        if src.kind not in _SAMPLE_FORMAT or len(shape) < 2:
            raise UnsupportedFormatError(
                f"cannot present a {src} array of shape {tuple(shape)} as TIFF"
            )
        self.dtype = np.dtype("u1") if src.kind == "b" else src.newbyteorder("<")
        self.height, self.width = int(shape[-2]), int(shape[-1])
        meta = describe_planes(list(axes), list(shape), self.dtype, list(scale), name, flavor)
        self.flavor, self.page_axes, self.page_shape = meta.flavor, meta.page_axes, meta.page_shape
        self.description = meta.description.encode("utf-8") + b"\0"
        self.x_resolution = resolution(scale[-1])
        self.y_resolution = resolution(scale[-2])
        self.n_pages = math.prod(int(n) for n in self.page_shape)  # no int64 to wrap around
        row_bytes = self.width * self.dtype.itemsize
        self.plane_bytes = row_bytes * self.height
        if self.plane_bytes == 0 or self.n_pages == 0:
            raise UnsupportedFormatError(f"cannot present an empty array {tuple(shape)} as TIFF")
        if self.plane_bytes > MAX_PLANE_BYTES:
            # A plane is decoded whole, and its strip tables (a strip a row, for rows of 1 MiB
            # or more) are built when the view is listed: 2^25 rows of 32 MiB cost 1.5 GiB.
            raise UnsupportedFormatError(
                f"planes of {human(self.plane_bytes)} ({self.height} x {self.width} "
                f"{self.dtype}) are larger than the {human(MAX_PLANE_BYTES)} a TIFF is made of"
            )
        self.rows_per_strip = max(1, min(self.height, STRIP_BYTES // max(row_bytes, 1)))
        self.n_strips = -(-self.height // self.rows_per_strip)
        self.strip_bytes = self.rows_per_strip * row_bytes
        self._arrange(big=bool(bigtiff))
        if self.size > CLASSIC_MAX_SIZE and not self.bigtiff:
            if bigtiff is not None:
                raise UnsupportedFormatError(f"{self.size} bytes do not fit a classic TIFF")
            self._arrange(big=True)

    def _arrange(self, big: bool) -> None:
        self.bigtiff = big
        self._vs = 8 if big else 4  # bytes in a value/offset field
        self._es = 20 if big else 12  # bytes in an IFD entry
        self._cs = 8 if big else 2  # bytes in an IFD's entry count
        align = 8 if big else 2
        header = 16 if big else 8
        strip_array = self.n_strips * self._vs if self.n_strips > 1 else 0
        self._ifd0_len = self._cs + (_N_TAGS + 1) * self._es + self._vs + strip_array
        self._stride = self._cs + _N_TAGS * self._es + self._vs + strip_array
        pos = header + self._ifd0_len
        self._desc_at = pos
        pos = _align(pos + len(self.description), align)
        self._xres_at, self._yres_at = pos, pos + 8
        self._counts_at = pos + 16
        pos = _align(pos + 16 + strip_array, align)
        self.ifd1_at = pos
        self.table_end = pos + (self.n_pages - 1) * self._stride
        self.data_offset = _align(self.table_end, 16)
        self.size = self.data_offset + self.n_pages * self.plane_bytes
        if self.size >= 2**63:  # what a file's size (st_size, a BigTIFF's offsets) can hold
            raise UnsupportedFormatError(f"{self.n_pages} planes do not fit in one TIFF")
        if not big and self.size > CLASSIC_MAX_SIZE:
            return  # its offsets do not fit 32 bits: __init__ makes it a BigTIFF (or refuses)
        self.head = self._build_head(header)
        self._template = (
            np.frombuffer(self._ifd(1, self.ifd1_at), np.uint8) if self.n_pages > 1 else None
        )

    def _build_head(self, header: int) -> bytes:
        magic = (
            struct.pack("<HHHQ", 43, 8, 0, header)
            if self.bigtiff
            else struct.pack("<HI", 42, header)
        )
        out = bytearray(b"II" + magic)
        out += self._ifd(0, header)
        out += self.description
        out += bytes(self._xres_at - len(out))
        out += struct.pack("<II", *self.x_resolution) + struct.pack("<II", *self.y_resolution)
        if self.n_strips > 1:
            counts = [self.strip_bytes] * self.n_strips
            counts[-1] = self.plane_bytes - self.strip_bytes * (self.n_strips - 1)
            out += np.asarray(counts, self._odt).tobytes()
        out += bytes(self.ifd1_at - len(out))
        return bytes(out)

    @property
    def _odt(self) -> str:
        return "<u8" if self.bigtiff else "<u4"

    def _ifd(self, page: int, at: int) -> bytes:
        """One IFD block (entries, next offset, own strip offsets) for `page` placed at `at`."""
        oty, ofmt = (LONG8, "<Q") if self.bigtiff else (LONG, "<I")
        first = self.data_offset + page * self.plane_bytes
        single = self.n_strips == 1
        # Several strips: this page's offsets array follows its IFD (entries, then next offset).
        own_array = at + self._cs + (_N_TAGS + (page == 0)) * self._es + self._vs
        entries: list[tuple[int, int, int, bytes | int]] = [
            (256, LONG, 1, struct.pack("<I", self.width)),
            (257, LONG, 1, struct.pack("<I", self.height)),
            (258, SHORT, 1, struct.pack("<H", self.dtype.itemsize * 8)),
            (259, SHORT, 1, struct.pack("<H", 1)),  # no compression
            (262, SHORT, 1, struct.pack("<H", 1)),  # min-is-black
            (273, oty, self.n_strips, struct.pack(ofmt, first) if single else own_array),
            (277, SHORT, 1, struct.pack("<H", 1)),
            (278, LONG, 1, struct.pack("<I", self.rows_per_strip)),
            (
                279,
                oty,
                self.n_strips,
                struct.pack(ofmt, self.plane_bytes) if single else self._counts_at,
            ),
            (282, RATIONAL, 1, self._rational(self.x_resolution, self._xres_at)),
            (283, RATIONAL, 1, self._rational(self.y_resolution, self._yres_at)),
            (296, SHORT, 1, struct.pack("<H", 1)),  # unit lives in the description, as in ImageJ
            (339, SHORT, 1, struct.pack("<H", _SAMPLE_FORMAT[self.dtype.kind])),
        ]
        if page == 0:  # the description only on the first page, where readers look for it
            entries.insert(5, (270, ASCII, len(self.description), self._desc_at))
        out = bytearray(struct.pack("<Q" if self.bigtiff else "<H", len(entries)))
        for tag, kind, count, value in entries:
            out += struct.pack("<HHQ" if self.bigtiff else "<HHI", tag, kind, count)
            out += (
                struct.pack(ofmt, value) if isinstance(value, int) else value.ljust(self._vs, b"\0")
            )
        nxt = 0 if page + 1 >= self.n_pages else self.ifd1_at + page * self._stride
        out += struct.pack(ofmt, nxt)
        if not single:
            out += self._strip_offsets(np.array([page])).astype(self._odt).tobytes()
        return bytes(out)

    def _rational(self, value: tuple[int, int], at: int) -> bytes | int:
        """A RATIONAL fits in a BigTIFF entry's 8-byte value field; classic TIFF points to it."""
        return struct.pack("<II", *value) if self.bigtiff else at

    def _strip_offsets(self, pages: np.ndarray) -> np.ndarray:
        first = np.uint64(self.data_offset) + pages.astype(np.uint64) * np.uint64(self.plane_bytes)
        return first[:, None] + np.arange(self.n_strips, dtype=np.uint64) * np.uint64(
            self.strip_bytes
        )

    def ifd_rows(self, first: int, last: int) -> np.ndarray:
        """IFDs `first`..`last-1` (first >= 1) as rows of bytes, patched from one template."""
        assert self._template is not None
        pages = np.arange(first, last, dtype=np.uint64)
        at = np.uint64(self.ifd1_at) + (pages - np.uint64(1)) * np.uint64(self._stride)
        rows = np.tile(self._template, (len(pages), 1))
        vs, head = self._vs, self._cs + _N_TAGS * self._es
        nxt = np.where(
            pages + np.uint64(1) < self.n_pages, at + np.uint64(self._stride), np.uint64(0)
        )
        rows[:, head : head + vs] = _le(nxt, self._odt)
        value_at = self._cs + 5 * self._es + (12 if self.bigtiff else 8)  # StripOffsets is entry 5
        if self.n_strips == 1:
            rows[:, value_at : value_at + vs] = _le(self._strip_offsets(pages)[:, 0], self._odt)
        else:
            rows[:, value_at : value_at + vs] = _le(at + np.uint64(head + vs), self._odt)
            rows[:, head + vs :] = _le(self._strip_offsets(pages), self._odt)
        return rows

    def prefix(self, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of everything before the pixel data."""
        parts: list[bytes] = []
        if start < self.ifd1_at:
            parts.append(self.head[start : min(stop, self.ifd1_at)])
            start = min(stop, self.ifd1_at)
        if start < min(stop, self.table_end):
            end = min(stop, self.table_end)
            first = 1 + (start - self.ifd1_at) // self._stride
            last = 1 + -(-(end - self.ifd1_at) // self._stride)
            base = self.ifd1_at + (first - 1) * self._stride
            parts.append(self.ifd_rows(first, last).tobytes()[start - base : end - base])
            start = end
        if start < stop:
            parts.append(bytes(stop - start))
        return b"".join(parts)

    def page_coords(self, page: int) -> dict[int, int]:
        """NGFF axis index -> coordinate for the plane shown as `page`."""
        # divmod, not np.unravel_index: read-ahead asks for every plane it prefetches, and
        # numpy's per-call overhead showed in the daemon's profile (13 of ~300 busy samples).
        if not 0 <= page < self.n_pages:
            raise ValueError(f"page {page} is not below {self.n_pages}")
        coords: list[int] = []
        for n in reversed(self.page_shape):
            page, c = divmod(page, int(n))
            coords.append(c)
        return dict(zip(self.page_axes, reversed(coords), strict=True))

    def page_of(self, coords: dict[int, int]) -> int:
        index = [coords[a] for a in self.page_axes]
        return int(np.ravel_multi_index(index, self.page_shape)) if index else 0


def require_plane_fits(layout: TiffLayout, cache: PageCache, name: str) -> None:
    """UnsupportedFormatError unless a plane fits a quarter of the cache: a plane is decoded
    whole, and a larger one is not kept, so every read of one decoded it all again (red team 50:
    a 29 KB `.zarray` of 1 GiB planes took 59 s and 1.1 GiB of memory for ten small reads)."""
    quarter = cache.max_bytes // 4
    if layout.plane_bytes > quarter:
        raise UnsupportedFormatError(
            f"{name}: planes of {human(layout.plane_bytes)} are larger than a quarter of the "
            f"{human(cache.max_bytes)} page cache; a larger --cache-size serves them"
        )


def layout_for_image(image: NgffImage, name: str = "") -> TiffLayout:
    return TiffLayout(image.axes, image.shape, image.dtype, image.scale, name=name)


class _NotCached(Exception):
    """A cached-only read needs a plane that is not decoded yet."""


class SynthesizedTiff:
    """RandomAccess over a TiffLayout; each plane is decoded once into the shared PageCache.

    Planes are cached as flat little-endian memoryviews, so a read inside one plane is a view of
    the cached plane (pyfuse3 replies from any buffer): a 1 MiB request costs no copy.
    """

    def __init__(
        self,
        layout: TiffLayout,
        array: Any,
        cache: PageCache,
        key: tuple[Hashable, ...],
        on_close: Callable[[], None] | None = None,
        spawn: Callable[[Callable[[], None]], Future[None]] | None = None,
        label: str = "",
    ) -> None:
        self.layout, self.size = layout, layout.size
        self._array, self._cache, self._key, self._on_close = array, cache, key, on_close
        self._label = label or "image"
        self._ndim = len(array.shape)
        self._head = memoryview(layout.head)
        self._ahead = max(1, min(READAHEAD_PLANES, cache.max_bytes // 4 // layout.plane_bytes))
        self._spawn = spawn
        self._lock = threading.Lock()
        self._queued: dict[int, Future[None]] = {}  # planes decoding through `spawn`
        self._closed = False
        self._prefetched = 0  # planes below this had their chunk files' reads started
        # Drop-behind: an image that would fill a quarter of the cache is not kept whole behind a
        # forward reader (the kernel's page cache holds what it served). Its planes' buffers are
        # then reused for the planes ahead: decoding into a fresh 8 MiB buffer (page faults, the
        # kernel zeroing it) cost 1.8-5x the decode itself here (0.34-1.07 s vs 0.19 s for 64
        # planes, tools/bench.py acqstore), and kept planes also pushed out everything else.
        drops = layout.n_pages * layout.plane_bytes > cache.max_bytes // 4
        self._dropping = DropBehind(cache, DROP_BEHIND, 4 * self._ahead + 64) if drops else None

    def decodes_per_read(self) -> int:
        """How many decodes one read (up to REQUEST_BYTES) of the pixels may need at most."""
        lay = self.layout
        block = self._block(lay.page_coords(0))
        planes = math.prod(b.stop - b.start if isinstance(b, slice) else 1 for b in block)
        unit = max(1, planes * lay.plane_bytes)
        return min(lay.n_pages, -(-REQUEST_BYTES // unit) + 1)

    def read(self, offset: int, size: int) -> bytes | memoryview:
        return self._read(offset, size, self._plane)

    def read_cached(self, offset: int, size: int) -> bytes | memoryview | None:
        """The same bytes if they need no decoding (planes cached, or the precomputed header),
        else None: cheap enough for an event loop to call without a thread hop."""
        try:
            return self._read(offset, size, self._cached_plane)
        except _NotCached:
            return None

    def _read(
        self, offset: int, size: int, plane: Callable[[int], memoryview]
    ) -> bytes | memoryview:
        lay = self.layout
        end = min(offset + max(size, 0), self.size)
        if offset >= end:
            return b""
        if offset >= lay.data_offset:  # the common case: inside one plane, a view of it
            page, within = divmod(offset - lay.data_offset, lay.plane_bytes)
            if within + end - offset <= lay.plane_bytes:
                return plane(page)[within : within + end - offset]
        elif end <= lay.ifd1_at:
            return self._head[offset:end]
        parts: list[bytes | memoryview] = []
        if offset < lay.data_offset:
            if plane == self._cached_plane and offset < lay.table_end and end > lay.ifd1_at:
                raise _NotCached  # IFDs are generated: a thread's work for a large table
            parts.append(lay.prefix(offset, min(end, lay.data_offset)))
            offset = min(end, lay.data_offset)
        while offset < end:
            page, within = divmod(offset - lay.data_offset, lay.plane_bytes)
            take = min(end - offset, lay.plane_bytes - within)
            parts.append(plane(page)[within : within + take])
            offset += take
        return b"".join(parts)

    def readahead(self, offset: int) -> None:
        """Queue the decode of the missing planes among the few after the one holding `offset`
        through `spawn` (when given; else decode the first here) and return: the pool's threads
        decode while the reader is served, and a read that needs a queued plane awaits it
        (`loading`). Decoding the first plane on the calling thread and queueing the others,
        as before, fed the pool only between that thread's decodes: one decoder often sat idle
        while the reader waited, and a cold 512 MiB read took 0.49-0.56 s here, not 0.4-0.45 s."""
        lay = self.layout
        page = self._next_page(offset)
        stop = min(page + self._ahead, lay.n_pages)
        self._drop_behind(page - 1)
        self._prefetch(page, stop + self._ahead)
        # A plane being decoded elsewhere (the reader's own decode) is left to that thread.
        cached, key = self._cache.present_or_loading, self._key
        with self._lock:
            queued = self._queued
            missing = [p for p in range(page, stop) if p not in queued and not cached((*key, p))]
            if self._spawn is not None and not self._closed:
                for p in missing:
                    self._queued[p] = self._spawn(lambda p=p: self._background(p))
                return
        if missing:
            self._plane(missing[0])

    def loading(self, offset: int, size: int) -> Future[None] | None:
        """The queued decode of a plane [offset, offset + size) needs, not finished yet, or
        None: the mount awaits it on its event loop, then serves the read from the cache."""
        lay = self.layout
        end = min(offset + max(size, 0), self.size)
        if end <= lay.data_offset:
            return None
        first = max(0, offset - lay.data_offset) // lay.plane_bytes
        last = (end - 1 - lay.data_offset) // lay.plane_bytes
        with self._lock:
            for page in range(first, last + 1):
                future = self._queued.get(page)
                if future is not None and not future.done():
                    return future
        return None

    def readahead_needed(self, offset: int) -> bool:
        """Whether `readahead(offset)` would decode anything (cheap: the mount asks on the event
        loop before handing a read-ahead to a thread, once per request)."""
        page = self._next_page(offset)
        stop = min(page + self._ahead, self.layout.n_pages)
        dropping = self._dropping
        if dropping is not None and page - 1 - DROP_BEHIND > dropping.behind:
            return True  # planes to drop behind
        cached = self._cache.present_or_loading
        return any(p not in self._queued and not cached((*self._key, p)) for p in range(page, stop))

    def _next_page(self, offset: int) -> int:
        lay = self.layout
        return 0 if offset < lay.data_offset else (offset - lay.data_offset) // lay.plane_bytes + 1

    def _drop_behind(self, page: int) -> None:
        """Forget the planes more than DROP_BEHIND before `page` (the one being read), when this
        image drops behind; a reader that jumps far ahead drops at most a window's worth."""
        if self._dropping is not None:
            self._dropping.passed(page, lambda p: (*self._key, p))

    def _prefetch(self, start: int, stop: int) -> None:
        """Start the disk reads of planes [start, stop) (those the next calls will decode),
        skipping those already started."""
        prefetch = getattr(self._array, "prefetch", None)
        with self._lock:
            done = self._prefetched if start < self._prefetched <= stop else start
            first, self._prefetched = done, stop
        if prefetch is None:
            return
        for page in range(first, min(stop, self.layout.n_pages)):
            block = self._block(self.layout.page_coords(page))
            if all(isinstance(b, int) for b in block):
                prefetch(block)

    def _background(self, page: int) -> None:
        try:
            self._plane(page)
        except Exception as exc:  # the reader decodes it itself and sees the error there
            log.debug("read-ahead of plane %d of %s failed: %s", page, self._key, exc)
        finally:
            with self._lock:
                self._queued.pop(page, None)

    def close(self) -> None:
        """Cancel queued read-ahead, wait for decodes under way, release the store."""
        with self._lock:
            pending = list(self._queued.values())
            on_close, self._on_close, self._closed = self._on_close, None, True
        for future in pending:
            if not future.cancel():
                future.exception()  # running: wait; its own errors are logged, not raised
        if on_close is not None:
            on_close()

    def _plane(self, page: int) -> memoryview:
        return self._cache.get_or_load(  # type: ignore[no-any-return]
            (*self._key, page), lambda: self._gated(page)
        )

    def _gated(self, page: int) -> memoryview:
        # Held against the cache's decode gate (the plane decoded, and copied out), then the
        # plane's room in the cache (PageCache.decoding): decodes outside the cache stay
        # bounded, and those waiting at the gate evict nothing yet.
        block = self._block(self.layout.page_coords(page))
        planes = math.prod(b.stop - b.start if isinstance(b, slice) else 1 for b in block)
        nbytes = self.layout.plane_bytes
        with self._cache.decoding(2 * planes * nbytes, nbytes):
            return self._load(page)

    def _cached_plane(self, page: int) -> memoryview:
        value = self._cache.get((*self._key, page))
        if value is None:
            raise _NotCached
        return value  # type: ignore[no-any-return]

    def _load(self, page: int) -> memoryview:
        """Decode `page`; when its zarr chunk spans neighbouring planes, keep those too."""
        lay = self.layout
        coords = lay.page_coords(page)
        block = self._block(coords)
        if all(isinstance(b, int) for b in block):
            fast = getattr(self._array, "read_plane", None)
            got = fast(block, self._cache.buffers.take) if fast is not None else None
            if got is not None:
                return got  # type: ignore[no-any-return]
        try:
            data = np.asarray(self._array[(*block, slice(None), slice(None))])
        except (DecantError, OSError, MemoryError):
            raise
        except Exception as exc:  # zarr-python and its codecs raise anything for a bad chunk
            why = f"page {page} does not decode ({type(exc).__name__}: {exc})"
            raise CorruptArchiveError(f"{self._label}: {why}") from None
        if data.ndim == 2:
            return _flat(np.ascontiguousarray(data, dtype=lay.dtype))
        wanted = None
        starts = [s.start for s in block]
        for local in np.ndindex(data.shape[:-2]):
            here = {a: starts[a] + local[a] for a in range(len(block))}
            # A copy per plane: a view would keep the whole block alive after others are evicted.
            plane = _flat(np.array(data[local], dtype=lay.dtype, order="C"))
            other = lay.page_of(here)
            if other == page:
                wanted = plane
            else:
                self._cache.put((*self._key, other), plane)
        assert wanted is not None
        return wanted

    def _block(self, coords: dict[int, int]) -> list[Any]:
        lead = self._ndim - 2
        chunks = getattr(self._array, "chunks", None)
        single = [coords.get(a, 0) for a in range(lead)]
        if not chunks or len(chunks) != self._ndim:
            return single
        spans = []
        for a in range(lead):
            c, step, dim = coords.get(a, 0), int(chunks[a]), int(self._array.shape[a])
            lo = c - c % step
            spans.append(slice(lo, min(lo + step, dim)))
        planes = int(np.prod([s.stop - s.start for s in spans], dtype=np.int64))
        limit = min(BLOCK_BYTES, self._cache.max_bytes // 4)
        if planes <= 1 or planes * self.layout.plane_bytes > limit:
            return single
        return spans


def _align(value: int, to: int) -> int:
    return -(-value // to) * to


def _le(values: np.ndarray, dtype: str) -> np.ndarray:
    """Integers as little-endian byte columns, ready to drop into rows of IFD bytes."""
    arr = np.ascontiguousarray(values, dtype=dtype)
    return arr.view(np.uint8).reshape(arr.shape[0], -1)


def _flat(array: np.ndarray) -> memoryview:
    """A C-contiguous array's bytes as a flat memoryview (its length is its size in bytes)."""
    return memoryview(array.reshape(-1).view(np.uint8))
