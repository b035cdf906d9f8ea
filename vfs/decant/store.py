"""Key access to an archive's store (`.zarr.zip` or `.zarr/`), bounded: no read exceeds its limit.

Reads bypass zarr-python on purpose: a STORED zip entry is a contiguous byte range, so a chunk is
one positional read at an offset found once from the central directory, with no event loop or store
lock in the way (`tools/bench.py read` measures both paths). Every `get` names the most bytes the
caller can use; a larger entry is refused from its recorded size, before anything is allocated.

Bytes come through a byte source (`vfs.stores`): a local file is one descriptor read with
`os.pread`, an object in a bucket is read with ranged GETs. So that a remote zip costs one request
per step, the central directory is read with the file's tail in one read, and an entry's first
read fetches its local header and its data together.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
import struct
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import xxhash

# ISA-L's CRC-32 (the zip polynomial, the same values as zlib.crc32): checking the 283 MB of
# chunks a first read of the bench's 537 MB stack reads takes 0.024 s, 0.151 s with the system
# zlib's (11.7 against 1.9 GB/s here): ~0.24 s of a decode thread's CPU per GB served.
from isal.isal_zlib import crc32

from vfs.decant import MANIFEST_KEY as MANIFEST_KEY  # re-exported: its home is vfs.decant
from vfs.decant import archive_stem as archive_stem
from vfs.decant import folded_stat
from vfs.decant.limits import MAX_METADATA_KEYS, MAX_NDIM, MAX_ZIP_ENTRIES, human
from vfs.decant.zipdir import ZipDirectory, ZipEntry
from vfs.errors import (
    ArchiveChangedError,
    ArchiveGoneError,
    CorruptArchiveError,
    DecantError,
    NotAnArchiveError,
    ObjectChangedError,
    ObjectMissingError,
)
from vfs.stores import local as _local
from vfs.stores.base import ByteSource, Folder, ObjectInfo, replaced
from vfs.stores.local import LocalFile, LocalFolder, open_exact
from vfs.threadbuffers import keep

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_STORED, _DEFLATED = 0, 8  # zip methods read: what decant writes, and what `zip` re-zips with
T = TypeVar("T")

_VIEW_FROM = 64 * 1024  # chunks this large come back as views of the read, not copies
_HEAD_WITH_HEADER = 64 * 1024  # a ranged read ending before this reads the local header with it
_FOLLOW_MAX = 64  # entries looked at past a prefetched one (read-ahead from an object store)
# A thread keeps a scratch buffer this large at most (a compressed 8 MiB plane is ~4 MiB);
# larger entries are read into fresh memory, so no thread holds a hostile entry's size for good.
SCRATCH_KEEP = 16 << 20
# A deflated entry of more than LARGE_INFLATE bytes is inflated by one thread at a time. decant
# writes none (its entries are stored), and a deflated one costs its maker a thousandth of
# what it inflates to: a 66 KB archive of one 64 MiB chunk of zeros, linked into four folders
# and read 4 KiB at a time in each at once, had four chunks inflated together (peak RSS
# +323 MiB with a 64 MiB cache). A re-zipped archive stays readable, one large entry at a time.
LARGE_INFLATE = 8 << 20
_LARGE_INFLATE = threading.Lock()
DATA_OFFSET_BYTES = 120  # a found data offset as held (ZipArchiveStore.held_bytes)
DIRECT_MIN = 256 << 10  # a stored entry this large is read past the page cache (`_read_span`)
_SCRATCH = threading.local()


def scratch(nbytes: int) -> memoryview:
    """This thread's reusable read buffer, `nbytes` long (about SCRATCH_KEEP at most, checked
    by the caller): grown when too small, never shared between threads."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or len(buf) < nbytes:
        # With room to spare: chunks of one array differ in size by a few percent, and growing
        # by just enough each time faulted in a fresh buffer for every larger chunk.
        room = min(SCRATCH_KEEP, nbytes + nbytes // 8 + (1 << 20))
        buf = memoryview(bytearray(max(nbytes, room)))
        keep(_SCRATCH, "buf", buf, len(buf))
    return buf[:nbytes]


def is_archive_name(name: str) -> bool:
    return name.endswith((".zarr.zip", ".zarr"))


def is_metadata_key(key: str) -> bool:
    """What a reconstruction reads besides chunks: the manifest (where each page's bytes go)
    and each array's `.zarray` (its dtype and codec). Never a chunk key."""
    return key == MANIFEST_KEY or key.endswith("/.zarray")


def is_chunk_key(key: str) -> bool:
    """A chunk of some array: no part is hidden (.zarray, .zattrs, .decant/…)."""
    parts = key.split("/")
    return len(parts) > 1 and not any(p.startswith(".") for p in parts)


class Store:
    """Read-only key/value view of one archive. Thread-safe: reads are positional."""

    # Whether a key's bytes stay those of the store's identity for as long as it is open (a
    # zip's entries: one file, one descriptor). A folder archive's files change alone, with no
    # change to the folder's own stat: a key read twice may give two versions.
    stable = True

    def __init__(self, path: Path | str) -> None:
        self.path = path  # a local path, or the URL of an archive in a bucket
        self.name = str(path)
        self.stat: os.stat_result | None = None  # of the very file read (local zip stores)
        self.identity: tuple[object, ...] | None = None  # of the very bytes read (zip stores)
        # Chunk key → xxh3-64 of its stored bytes (digests.chunk_digests), from the adapter's
        # index: every chunk read is checked against it before it is decoded.
        self.digests: Mapping[str, int] | None = None
        # Metadata key → xxh3-64 of the bytes `get_metadata` returned: the map a verification
        # records holds the digests of the very manifest and `.zarray`s it was read with.
        self.metadata_seen: dict[str, int] = {}

    def get(self, key: str, limit: int) -> bytes | memoryview | None:
        """The value at `key`, None if there is none; CorruptArchiveError if over `limit` bytes.
        A large chunk may come back as a read-only view; metadata is always bytes."""
        raise NotImplementedError

    def get_metadata(self, key: str, limit: int) -> bytes | None:
        """`get` of a metadata entry (the manifest, a `.zarray`), its digest noted."""
        raw = self.get(key, limit)
        if raw is None:
            return None
        raw = bytes(raw)
        if len(self.metadata_seen) < MAX_METADATA_KEYS:
            self.metadata_seen[key] = xxhash.xxh3_64_intdigest(raw)
        return raw

    def get_scratch(self, key: str, limit: int) -> bytes | memoryview | None:
        """As `get`, checked the same way, but the value may be a view of this thread's scratch
        buffer (see `scratch`): valid only until this thread's next `get_scratch`. For a caller
        that decodes the value into a buffer of its own at once (read_chunk)."""
        return self.get(key, limit)

    def has(self, key: str) -> bool | None:
        """Whether `key` exists, or None when only a read can tell (checked lazily then)."""
        return None

    def value_size(self, key: str) -> int | None:
        """How many bytes `get(key)` would return, when that is known without reading them
        (None: unknown, or no such key)."""
        return None

    def entry_size(self, key: str) -> int | None:
        """Stored size of `key` when parts of it can be read alone (`get_range`), else None."""
        return None

    def prefetch(self, key: str) -> None:
        """Ask the kernel to start reading `key`'s bytes (read-ahead of the next chunk)."""

    def held_bytes(self) -> int:
        """Memory this open store holds for its index of keys (a zip's central directory)."""
        return 0

    def data_offset(self, key: str) -> int | None:
        """Where `key`'s stored bytes start in the archive file, once a read has found and
        checked it (zip stores; None elsewhere, or not read yet)."""
        return None

    def assume_data_offset(self, key: str, offset: int) -> None:
        """Take `offset` as where `key`'s bytes start, without reading its local header again:
        a digest map recorded it from this very file (the caller checks every range read at
        it against the map's digests, so an offset that is wrong fails as a digest error)."""

    def get_range(self, key: str, start: int, size: int) -> bytes:
        """Bytes [start, start + size) of the stored value at `key` (which `entry_size` sized).

        Unchecked: the zip CRC-32 and the digest map cover whole entries only, so a caller that
        needs a check reads the entry whole with `get` (vfs.decant.partial does, given digests).
        """
        raise NotImplementedError

    def listed(self, prefix: str) -> list[str] | None:
        """Keys starting with `prefix`, or None when listing is not cheap for this store."""
        return None

    def all_keys(self) -> Iterable[str]:
        """Every key (a zip's one at a time: a million entries are not a million strings)."""
        raise NotImplementedError

    def _check_digest(self, key: str, data: bytes | memoryview) -> None:
        assert self.digests is not None
        want = self.digests.get(key)
        if want is None:
            if is_chunk_key(key):
                raise CorruptArchiveError(
                    f"{self.path}: chunk {key!r} has no recorded digest (changed since indexed?)"
                )
            return
        if xxhash.xxh3_64_intdigest(data) != want:
            what = "chunk" if is_chunk_key(key) else "entry"
            raise CorruptArchiveError(
                f"{self.path}: {what} {key!r} does not match its recorded xxh3 digest"
            )

    def close(self) -> None:
        pass

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _too_large(self, key: str, size: int, limit: int) -> CorruptArchiveError:
        return CorruptArchiveError(
            f"{self.path}: {key!r} holds {size} bytes, more than the {human(limit)} it may"
        )


class _SourceFile(io.RawIOBase):
    """A byte source as a seekable file (for zipfile's end-record reader and the directory's
    parse), its tail read once up front: the end record and central directory of a remote zip
    then cost one ranged GET, not a dozen."""

    def __init__(self, source: ByteSource, tail: int) -> None:
        super().__init__()
        self._source = source
        # What zipfile reads is kept here, not by the reader of entries: an object store's
        # read-ahead is told so (`read_apart`), and still fetches the entries in the tail.
        self._read = getattr(source, "read_apart", None) or source.read
        self._pos = 0
        self._tail_at = max(0, source.size - tail)
        self._tail = self._read(self._tail_at, source.size - self._tail_at)

    def forget_tail(self) -> None:
        """Read no more from the kept tail (a local file: a pread costs no more than the copy,
        and the tail is the central directory's size, at least 64 KiB, for as long as the
        archive stays open)."""
        self._tail, self._tail_at = b"", self._source.size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._pos, self._source.size)[whence]
        if base + offset < 0:
            raise OSError(errno.EINVAL, "seek before the start")
        self._pos = base + offset
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        """At most what is left: never allocates the `size` a damaged directory may claim (the
        default `RawIOBase.read` would zero-fill a buffer of that size first)."""
        left = self._source.size - self._pos
        n = left if size is None or size < 0 else max(0, min(size, left))
        if self._pos < self._tail_at < self._pos + n:  # a central directory larger than the tail:
            head = self._read(self._pos, self._tail_at - self._pos)  # grow the tail
            self._tail, self._tail_at = head + self._tail, self._pos
        if self._pos >= self._tail_at:
            start = self._pos - self._tail_at
            data = self._tail[start : start + n]
        else:
            data = self._read(self._pos, n)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buf: Any) -> int:
        data = self.read(len(buf))
        buf[: len(data)] = data
        return len(data)


class ZipArchiveStore(Store):
    verify_crc = True  # ~0.15 ms per MiB read (5.5 GB/s); xxh3 digests are the faster check

    def __init__(self, source: ByteSource | Path) -> None:
        if isinstance(source, Path):
            try:
                source = LocalFile(source)
            except FileNotFoundError:
                raise ArchiveGoneError(f"{source}: no such archive") from None
            except OSError as exc:
                raise CorruptArchiveError(f"{source}: cannot read ({exc.strerror})") from None
        super().__init__(getattr(source, "path", source.name))
        # One source for the index and the reads (one descriptor; one ETag for an object):
        # opening twice could pair one file's central directory with the bytes of an archive
        # re-published in between.
        self._source: ByteSource | None = source
        self._fh: _SourceFile | None = None
        path = self.name
        try:
            self.stat = getattr(source, "stat", None)
            self.identity = source.identity
            tail = int(getattr(source, "tail_hint", 64 * 1024))
            self._fh = _SourceFile(source, tail)
            self._entries = ZipDirectory(path, self._fh)  # type: ignore[arg-type]
            if self.stat is not None:  # a local file: its central directory is parsed
                self._fh.forget_tail()
        except CorruptArchiveError:
            self.close()
            raise
        except OSError as exc:
            self.close()
            raise CorruptArchiveError(f"{path}: cannot read ({exc.strerror})") from None
        except Exception as exc:  # what a damaged end record makes zipfile's reader raise
            self.close()
            if isinstance(exc, DecantError):  # a byte source's StoreError keeps its kind
                raise
            raise CorruptArchiveError(f"{path}: not a readable zip archive ({exc})") from None
        self._data_offsets: dict[str, int] = {}
        self._lock = threading.Lock()

    def all_keys(self) -> Iterator[str]:
        return self._entries.names()

    def has(self, key: str) -> bool:
        return self._entries.get(key) is not None

    def value_size(self, key: str) -> int | None:
        info = self._entries.get(key)
        return None if info is None else info.file_size  # a deflated entry's, inflated

    def listed(self, prefix: str) -> list[str]:
        """Keys below `prefix` ("name/"): a first path part is a group kept by the directory."""
        return self._entries.listed(prefix)

    @property
    def source(self) -> ByteSource:
        if self._source is None:
            raise ValueError(f"{self.name}: store is closed")
        return self._source

    def _data_offset(self, info: ZipEntry, head: int) -> tuple[int, bytes | memoryview | None]:
        """Where the entry's bytes start, from its local header — which must name the same entry:
        a damaged directory offset would otherwise serve another entry's bytes under this key.
        The first time, the header and the entry's first `head` bytes are read together (one GET
        on a remote source: the header's extra length is guessed from the central directory);
        those bytes are returned when that read holds them all, else None."""
        offset = self._data_offsets.get(info.name)
        blob: bytes | memoryview = b""
        if offset is None:
            start, want = self._first_read(info, head)
            if start >= 0 and want >= _LOCAL_HEADER.size + len(info.raw_name):
                blob = self._read_buffer(start, want)
            offset = self._check_local_header(info, blob)
            with self._lock:
                self._data_offsets[info.name] = offset
        start = offset - info.header_offset
        if blob and head and start + head <= len(blob):
            if head < _VIEW_FROM or not is_chunk_key(info.name):
                return offset, bytes(blob[start : start + head])
            # A chunk gets a view, not a slice: slicing copied every chunk once more (4 MiB of
            # memcpy and fresh pages per plane on a first read); the view keeps ~100 bytes more.
            return offset, memoryview(blob)[start : start + head]
        return offset, None

    def _read_buffer(self, offset: int, size: int) -> bytes | memoryview:
        """[offset, offset + size) of the source, as a view of the source's own buffer where
        it offers one (`read_buffer`: an object's GET body, not copied again)."""
        read = getattr(self.source, "read_buffer", None) or self.source.read
        return read(offset, size)  # type: ignore[no-any-return]

    def _first_read(self, info: ZipEntry, head: int) -> tuple[int, int]:
        """The range `_data_offset(info, head)` reads while the data offset is not known: the
        local header, and `head` data bytes after it if its extra field is the central one's."""
        want = _LOCAL_HEADER.size + len(info.raw_name) + (info.extra_len + head if head else 0)
        return info.header_offset, min(want, self.source.size - info.header_offset)

    def _check_local_header(self, info: ZipEntry, blob: bytes | memoryview) -> int:
        """The data offset the local header at the start of `blob` gives, once it is checked."""
        name = info.raw_name
        header = bytes(blob[: _LOCAL_HEADER.size + len(name)])
        fields = _LOCAL_HEADER.unpack_from(header) if len(header) == len(name) + 30 else None
        if fields is None or fields[0] != b"PK\x03\x04":
            raise CorruptArchiveError(
                f"{self.path}: zip entry {info.name!r} has no local header (truncated?)"
            )
        if fields[9] != len(name) or header[30:] != name or fields[3] != info.method:
            raise CorruptArchiveError(
                f"{self.path}: zip entry {info.name!r}: its local header disagrees with "
                "the central directory"
            )
        return int(info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10])

    def get(self, key: str, limit: int) -> bytes | memoryview | None:
        return self._unchanged_after(key, lambda: self._get(key, limit))

    def _unchanged_after(self, key: str, read: Callable[[], T]) -> T:
        """`read()`, then whether the archive file was written since it was opened (a local
        file's size and mtime; an object's ETag is checked by its store). Written in place
        meanwhile (`cp` of another archive over it), a reader opened before mixed the two
        versions' bytes with no error until the running hash's verdict; a read that failed its
        CRC on such bytes is ArchiveChangedError too, not damage."""
        try:
            data = read()
        except CorruptArchiveError:
            self._check_unchanged(key)
            raise
        self._check_unchanged(key)
        return data

    def _check_unchanged(self, key: str) -> None:
        check = getattr(self._source, "check_unchanged", None)
        if check is None:
            return
        try:
            check()
        except ArchiveChangedError:
            raise ArchiveChangedError(
                f"{self.path}: zip entry {key!r} not served: written since the archive was "
                "opened (its size or mtime changed); reopen it to read the new version"
            ) from None

    def _get(self, key: str, limit: int) -> bytes | memoryview | None:
        info = self._entries.get(key)
        if info is None:
            return None
        if info.file_size > limit:
            raise self._too_large(key, info.file_size, limit)
        if info.flags & 0x1:
            raise CorruptArchiveError(f"{self.path}: zip entry {key!r} is encrypted")
        if info.method != _STORED:
            return self._get_compressed(key, info)
        if info.compress_size != info.file_size:
            raise CorruptArchiveError(
                f"{self.path}: stored zip entry {key!r} has compress_size {info.compress_size} "
                f"!= file_size {info.file_size}"
            )
        try:
            return self._read_stored(key, info)
        except OSError as exc:  # EINVAL for an offset no file has, EIO from the disk
            raise CorruptArchiveError(
                f"{self.path}: cannot read zip entry {key!r} ({exc.strerror})"
            ) from None

    def get_scratch(self, key: str, limit: int) -> bytes | memoryview | None:
        return self._unchanged_after(key, lambda: self._get_scratch(key, limit))

    def _get_scratch(self, key: str, limit: int) -> bytes | memoryview | None:
        info = self._entries.get(key)
        fileno = getattr(self._source, "fileno", None)
        plain = info is not None and info.method == _STORED and not info.flags & 0x1
        if not plain or fileno is None or not 0 < info.file_size <= min(limit, SCRATCH_KEEP):
            return self._get(key, limit)  # and its errors
        if info.compress_size != info.file_size:
            return self._get(key, limit)  # refused there
        try:
            data = self._read_stored_into(key, info, fileno())
        except OSError as exc:
            raise CorruptArchiveError(
                f"{self.path}: cannot read zip entry {key!r} ({exc.strerror})"
            ) from None
        if data is None:  # no local header where the directory says: `get` says why
            return self._get(key, limit)
        self._check_stored(key, info, data)
        return data

    def _read_stored_into(self, key: str, info: ZipEntry, fd: int) -> memoryview | None:
        """A stored entry's bytes read into the scratch buffer: as `_read_stored`, header
        included the first time, but into memory already faulted in. A fresh 4 MiB `bytes` per
        plane cost its page faults and the kernel zeroing it (clear_page was a fifth of the
        daemon's CPU on a first read: glibc hands such blocks back to the kernel on free)."""
        offset = self._data_offsets.get(info.name)
        if offset is None:
            start, want = self._first_read(info, info.file_size)
            header = _LOCAL_HEADER.size + len(info.raw_name)
            if start < 0 or want < header:
                return None
            buf = self._read_span(fd, start, want)
            got = len(buf)
            offset = self._check_local_header(info, bytes(buf[: min(got, header)]))
            with self._lock:
                self._data_offsets[info.name] = offset
            lo = offset - start
            if lo + info.file_size <= got:
                return buf[lo : lo + info.file_size]
        if offset + info.file_size > self.source.size:
            raise CorruptArchiveError(f"{self.path}: zip entry {key!r} runs past the end")
        buf = self._read_span(fd, offset, info.file_size)
        if len(buf) != info.file_size:
            raise CorruptArchiveError(f"{self.path}: zip entry {key!r} is truncated")
        return buf

    def _read_span(self, fd: int, start: int, size: int) -> memoryview:
        """[start, start + size) of the file (short at its end) in a buffer this thread reuses.

        A chunk this large is read past the page cache (O_DIRECT) where the file system lets
        it, as c4gh loads are: the plane cache serves repeats, so the page cache only costs a
        fill and a copy: perf of a cold read of the bench's 537 MB stack found 0.2-0.5 s of
        the decoding thread's CPU in the kernel's copy (_copy_to_iter). A/B of the code before
        and after, 6 rounds, fresh daemon, archive evicted: a first read 441-549 -> 583-667
        MB/s, daemon CPU 1.71-2.09 -> 1.39-1.49 s; a verified read 0.99-1.33 -> 0.95-1.05 s
        of CPU. On a disk throttled to 300 MB/s (tools/bench.py mount --disk-mbps 300, each
        tree's own, 2 runs) the disk sets the pace either way (a first read 502-504 -> 518-523
        MB/s) and the CPU of a first read went from 2.72-2.74 to 2.07-2.10 s per GB. Small
        chunks keep the page cache, and with it the kernel's read-ahead."""
        if size >= DIRECT_MIN:
            past = getattr(self._source, "read_past_cache", None)
            got = past(start, size, SCRATCH_KEEP) if past else None
            if got is not None:
                return got
        buf = scratch(size)
        return buf[: os.preadv(fd, [buf], start)]

    def entry_size(self, key: str) -> int | None:
        info = self._entries.get(key)
        # On an object store too: the local header and the block table come in one ranged GET
        # (`get_range` reads the header with the bytes asked for), a block in a second.
        if info is None or info.method != _STORED or info.flags & 0x1:
            return None
        return int(info.file_size) if info.compress_size == info.file_size else None

    def held_bytes(self) -> int:
        """The directory's tables, and the data offsets reads found since (a dict entry each:
        ~120 bytes with its name; a 200,000-chunk archive read whole holds ~24 MB of them)."""
        return self._entries.nbytes + len(self._data_offsets) * DATA_OFFSET_BYTES

    def data_offset(self, key: str) -> int | None:
        return self._data_offsets.get(key)

    def assume_data_offset(self, key: str, offset: int) -> None:
        info = self._entries.get(key)
        if info is None:
            return
        lowest = info.header_offset + _LOCAL_HEADER.size + len(info.raw_name)
        if not lowest <= offset <= self.source.size - info.compress_size:
            return  # not where this entry can start: read and check its local header instead
        with self._lock:
            self._data_offsets.setdefault(key, offset)

    def prefetch(self, key: str) -> None:
        """Start reading `key` (the reader's read-ahead asks for the chunk after the ones it
        decodes) and, from a source with `readahead_bytes` (an object store, where each GET
        waits a round trip), the entries after it in the archive up to that many bytes: so
        several GETs are in flight while planes decode.

        Not on a local file: the decoders' own preads of whole chunks keep the disk busy, and
        POSIX_FADV_WILLNEED ahead of them was measured to cost. Cold 4 MiB chunk reads in order
        streamed 2.7-3.1 GB/s alone, 1.3-1.4 GB/s with WILLNEED a chunk or three ahead; the
        daemon spent 0.54 s of CPU per GB served on a verified first read without it, 0.65-0.69
        with it (tools/bench.py mount)."""
        info = self._entries.get(key)
        one = getattr(self._source, "prefetch", None)
        run = getattr(self._source, "prefetch_run", None)
        if info is None or (one is None and run is None) or hasattr(self._source, "fileno"):
            return
        with contextlib.suppress(OSError, CorruptArchiveError):
            ranges = []
            for entry in self._following(info, int(getattr(self._source, "readahead_bytes", 0))):
                offset = self._data_offsets.get(entry.name)
                if offset is None:  # what the first `get` reads: header and data in one range
                    ranges.append(self._first_read(entry, entry.file_size))
                else:
                    ranges.append((offset, entry.compress_size))
            if run is not None:  # ranges that follow each other may go out as one GET
                run(ranges)
            else:
                for offset, size in ranges:
                    one(offset, size)

    def _following(self, info: ZipEntry, budget: int) -> list[ZipEntry]:
        """`info` and the chunks of its array stored after it, up to `budget` bytes (and among
        the next _FOLLOW_MAX entries: an archive of a million empty entries walks no further)."""
        if budget <= 0:
            return [info]
        head = info.name.partition("/")[0]
        with self._lock:  # the directory ranks entries by offset on first use
            following = self._entries.following(info, _FOLLOW_MAX)
        out, total = [info], info.compress_size
        for entry in following:
            total += entry.compress_size
            if total > budget:
                break
            if entry.name.partition("/")[0] == head and is_chunk_key(entry.name):
                out.append(entry)
        return out

    def get_range(self, key: str, start: int, size: int) -> bytes:
        return self._unchanged_after(key, lambda: self._get_range(key, start, size))

    def _get_range(self, key: str, start: int, size: int) -> bytes:
        info = self._entries.get(key)
        if info is None or not 0 <= start <= start + size <= info.file_size:
            raise CorruptArchiveError(
                f"{self.path}: bytes [{start}, {start + size}) are not within entry {key!r}"
            )
        try:
            first = start + size if start + size <= _HEAD_WITH_HEADER else 0
            offset, head = self._data_offset(info, first)
            if offset + info.file_size > self.source.size:
                raise CorruptArchiveError(f"{self.path}: zip entry {key!r} runs past the end")
            if head is not None:
                return bytes(head[start:])
            data = self.source.read(offset + start, size)
        except OSError as exc:
            raise CorruptArchiveError(
                f"{self.path}: cannot read zip entry {key!r} ({exc.strerror})"
            ) from None
        if len(data) != size:
            raise CorruptArchiveError(f"{self.path}: zip entry {key!r} is truncated")
        return data

    def _read_stored(self, key: str, info: ZipEntry) -> bytes | memoryview:
        offset, data = self._data_offset(info, info.file_size)
        if data is None:
            if offset + info.file_size > self.source.size:
                raise CorruptArchiveError(f"{self.path}: zip entry {key!r} runs past the end")
            data = self._read_buffer(offset, info.file_size)
            if not is_chunk_key(key):  # metadata is bytes (a chunk may be a view)
                data = bytes(data)
        if len(data) != info.file_size:
            raise CorruptArchiveError(f"{self.path}: zip entry {key!r} is truncated")
        self._check_stored(key, info, data)
        return data

    def _check_stored(self, key: str, info: ZipEntry, data: bytes | memoryview) -> None:
        # The writer's CRC-32 (zipfile checks it for compressed entries, pread does not): a flipped
        # bit on disk is an error here, not a wrong pixel that only a whole-file sha256 would see.
        # A digest map, made from CRC-checked reads, replaces it: xxh3 is four times faster. An
        # entry the map has no digest for keeps its CRC (a map recorded before metadata digests:
        # its manifest was read with no check at all, and one rotten bit shifted the original).
        if self.digests is not None and (key in self.digests or is_chunk_key(key)):
            self._check_digest(key, data)
        elif self.verify_crc and crc32(data) != info.crc:
            raise CorruptArchiveError(
                f"{self.path}: zip entry {key!r} fails its CRC-32 check (damaged on disk)"
            )

    def _get_compressed(self, key: str, info: ZipEntry) -> bytes:
        """Not what decant writes, but a re-zipped archive is still readable, just slower.
        Inflated no further than the entry's file_size (checked against the limit), CRC-checked."""
        if info.method != _DEFLATED:
            raise CorruptArchiveError(
                f"{self.path}: zip entry {key!r} uses compression method {info.method} "
                "(decant reads stored and deflated entries)"
            )
        # Deflate grows incompressible data by 5 bytes per 64 KiB block at most.
        if info.compress_size > info.file_size + info.file_size // 8192 + 1024:
            raise CorruptArchiveError(
                f"{self.path}: zip entry {key!r} claims {info.compress_size} deflated bytes "
                f"for {info.file_size}"
            )
        try:
            offset, _ = self._data_offset(info, 0)
            if offset + info.compress_size > self.source.size:
                raise CorruptArchiveError(f"{self.path}: zip entry {key!r} runs past the end")
            with _LARGE_INFLATE if info.file_size > LARGE_INFLATE else contextlib.nullcontext():
                stored = self.source.read(offset, info.compress_size)
                inflate = zlib.decompressobj(-zlib.MAX_WBITS)
                data = inflate.decompress(stored, info.file_size + 1)  # a longer one fails
                del stored
        except OSError as exc:
            raise CorruptArchiveError(
                f"{self.path}: cannot read zip entry {key!r} ({exc.strerror})"
            ) from None
        except zlib.error as exc:
            raise CorruptArchiveError(f"{self.path}: cannot inflate {key!r} ({exc})") from None
        if len(data) != info.file_size or not inflate.eof or crc32(data) != info.crc:
            raise CorruptArchiveError(
                f"{self.path}: zip entry {key!r} fails its CRC-32 check (damaged on disk)"
            )
        if self.digests is not None:
            self._check_digest(key, data)
        return data

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self._source is not None:
            self._source.close()
            self._source = None


class DirectoryStore(Store):
    """A `.zarr/` folder. Keys are opened component by component without following symlinks:
    an archive's owner must not make the daemon (often root) serve a file outside the archive.
    The folder itself is opened once: every key is read below that very folder (its `stat`
    is the one checked by the mount), never below whatever its path names later. Its files may
    change with no change to the folder's stat (`stable` is False); with `pinned` set (a dict),
    each key is held to the file version (inode, size, mtime, ctime) its first read found.
    Once the manifest is read, `stat` has that very manifest's stat folded in (`folded_stat`):
    the archive's version as a listing takes it (`archive_stat`), for what it was read as."""

    stable = False

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.pinned: dict[str, tuple[int, int, int, int]] | None = None
        self._folded = False  # the manifest's stat is in `stat`
        self._manifest: tuple[int, int, int, int] | None = None  # its version as first read
        self._dir = -1
        try:
            self._dir = open_exact(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise CorruptArchiveError(f"{path}: cannot read ({exc.strerror})") from None
        self.stat = os.fstat(self._dir)

    def close(self) -> None:
        if self._dir >= 0:
            os.close(self._dir)
            self._dir = -1

    def value_size(self, key: str) -> int | None:
        """The size of the regular file at `key`, walked as `get` walks (a sparse file costs
        its maker no disk, its size in memory once read)."""
        parts = key.split("/")
        if self._dir < 0 or any(p in ("", ".", "..") for p in parts):
            return None
        fds: list[int] = []
        try:
            st = os.stat(parts[-1], dir_fd=self._parent(parts, fds), follow_symlinks=False)
        except OSError:
            return None  # `get` says why
        finally:
            for fd in fds:
                os.close(fd)
        return st.st_size if stat.S_ISREG(st.st_mode) else None

    def get(self, key: str, limit: int) -> bytes | None:
        parts = key.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise CorruptArchiveError(f"{self.path}: key {key!r} is not a safe relative path")
        if self._dir < 0:
            raise CorruptArchiveError(f"{self.path}: read after close")
        fds: list[int] = []
        try:
            parent = self._parent(parts, fds)
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
            fds.append(os.open(parts[-1], flags, dir_fd=parent))
            data = self._read_regular(key, fds[-1], limit)
            if data is not None and self.digests is not None:
                self._check_digest(key, data)
            return data
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise CorruptArchiveError(f"{self.path}: {key!r} is a symlink (refused)") from None
            raise CorruptArchiveError(
                f"{self.path}: cannot read {key!r} ({exc.strerror})"
            ) from None
        finally:
            for fd in fds:
                os.close(fd)

    def _ours(self, st: os.stat_result) -> bool:
        """Whether a file of the folder may be read on anyone's behalf: its owner's, or one
        anybody may read (see vfs.stores.local.OWNER_FILES_ONLY)."""
        assert self.stat is not None
        return st.st_uid == self.stat.st_uid or bool(st.st_mode & stat.S_IROTH)

    def _parent(self, parts: list[str], fds: list[int]) -> int:
        """The folder holding key `parts`' last one, reached with no link followed; each
        descriptor it opens is appended to `fds`, for the caller to close."""
        for part in parts[:-1]:
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
            fds.append(os.open(part, flags, dir_fd=fds[-1] if fds else self._dir))
        return fds[-1] if fds else self._dir

    def all_keys(self) -> list[str]:
        """Every regular file below the folder, walked without recursion or symlinks."""
        out: list[str] = []
        stack = [("", 0)]
        while stack:
            prefix, depth = stack.pop()
            with os.scandir(self.path / prefix if prefix else self.path) as it:
                for entry in it:
                    key = f"{prefix}{entry.name}"
                    if entry.is_dir(follow_symlinks=False) and depth < MAX_NDIM + 2:
                        stack.append((f"{key}/", depth + 1))
                    elif entry.is_file(follow_symlinks=False):
                        out.append(key)
                    if len(out) > MAX_ZIP_ENTRIES:
                        raise CorruptArchiveError(
                            f"{self.path}: holds more than {MAX_ZIP_ENTRIES} files"
                        )
        return out

    def _read_regular(self, key: str, fd: int, limit: int) -> bytes | None:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            return None
        if not stat.S_ISREG(st.st_mode):
            raise CorruptArchiveError(f"{self.path}: {key!r} is not a regular file")
        if _local.OWNER_FILES_ONLY and not self._ours(st):
            raise CorruptArchiveError(
                f"{self.path}: {key!r} is uid {st.st_uid}'s, not the archive's owner's, and not "
                "readable by all (refused)"
            )
        if st.st_size > limit:
            raise self._too_large(key, st.st_size, limit)
        if self.pinned is not None:
            version = _file_version(st)
            if self.pinned.setdefault(key, version) != version:
                raise CorruptArchiveError(f"{self.path}: {key!r} changed while it was read")
        data = os.pread(fd, st.st_size + 1, 0)
        if len(data) != st.st_size:
            raise CorruptArchiveError(f"{self.path}: {key!r} changed while it was read")
        if key == MANIFEST_KEY and not self._folded and self.stat is not None:
            # Its stat after the read too: one taken before a rewrite of it, with the new text
            # read, would key the new manifest's archive as the old one's version.
            if _file_version(os.fstat(fd)) != _file_version(st):
                raise CorruptArchiveError(f"{self.path}: {key!r} changed while it was read")
            self.stat, self._folded = folded_stat(self.stat, st), True  # the first read's
            self._manifest = _file_version(st)
        elif self._manifest is not None and key != MANIFEST_KEY:
            self._still_as_opened(key)
        return data

    def _still_as_opened(self, key: str) -> None:
        """CorruptArchiveError unless the manifest is still the one this store read, after a
        read of `key`: an archive overwritten in place (`cp -r B.zarr/. x.zarr/`) kept its
        folder, and a handle opened before served B's chunks decoded by the old manifest, a
        mix, until its hash's verdict. (A chunk rewritten before the manifest is, while the
        copy runs, is caught by the recorded digests or that verdict only.)"""
        folder, _sep, name = MANIFEST_KEY.partition("/")
        try:
            sub = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=self._dir)  # fmt: skip
            try:
                now = _file_version(os.stat(name, dir_fd=sub, follow_symlinks=False))
            finally:
                os.close(sub)
        except OSError:
            now = None
        if now != self._manifest:
            raise CorruptArchiveError(
                f"{self.path}: rewritten since it was opened (its manifest changed); "
                f"{key!r} not served"
            )


def _file_version(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class FolderStore(Store):
    """A `.zarr/` archive in a folder that need not be local (a bucket prefix): keys are the
    folder's keys. Sizes are checked against the limit (one HEAD) before a value is fetched.
    Its objects are replaced one by one, with no change to the archive's identity (its
    manifest's): `stable` is False, and with `pinned` set (a dict), each key is held to the
    object version (size, ETag, Last-Modified) its first read found. Once the manifest is
    read, a value no recorded digest checks is served only while the manifest is still that
    version (`_still_as_opened`)."""

    stable = False

    def __init__(self, folder: Folder) -> None:
        super().__init__(folder.name)
        self.folder = folder
        self.pinned: dict[str, tuple[object, ...]] | None = None
        self._manifest: ObjectInfo | None = None  # the manifest's version as read

    def get(self, key: str, limit: int) -> bytes | None:
        if any(p in ("", ".", "..") for p in key.split("/")):
            raise CorruptArchiveError(f"{self.path}: key {key!r} is not a safe relative path")
        # Opened (one HEAD), then read as exactly the size it stated, with its ETag pinned: a
        # plain GET after the HEAD would take whatever replaced the object meanwhile, whole
        # (a 600 MiB body for a manifest checked at 2 bytes; red team, stop 25).
        try:
            source = self.folder.open(key)
        except (ObjectMissingError, FileNotFoundError):
            return None
        try:
            if source.size > limit:
                raise self._too_large(key, source.size, limit)
            if self.pinned is not None:
                info = getattr(source, "info", None)
                version = (source.size,) if info is None else info.identity
                if self.pinned.setdefault(key, version) != version:
                    raise ObjectChangedError(key)
            read = getattr(source, "read_apart", None) or source.read
            data = read(0, source.size)
        except ObjectChangedError:
            raise CorruptArchiveError(f"{self.path}: {key!r} changed while it was read") from None
        finally:
            source.close()
        if len(data) != source.size:
            raise CorruptArchiveError(f"{self.path}: {key!r} changed while it was read")
        if self.digests is not None:
            self._check_digest(key, data)
        if key == MANIFEST_KEY:
            if self._manifest is None:
                self._manifest = getattr(source, "info", None)
        elif self.pinned is None and (self.digests is None or key not in self.digests):
            self._still_as_opened(key)
        return data

    def _still_as_opened(self, key: str) -> None:
        """CorruptArchiveError unless the manifest is still the version this store read (one
        HEAD), after a read of `key` that no recorded digest checked: a prefix overwritten in
        place with another archive's objects kept its keys, and a handle opened before served
        the new chunks decoded by the old manifest, bytes of neither original, until its
        hash's verdict. A pinned store's values are held to their versions instead. (A chunk
        replaced before the manifest is, while the upload runs, is caught by that verdict.)"""
        if self._manifest is None:
            return
        now = self.folder.stat(MANIFEST_KEY)
        if now is None or replaced(self._manifest, now):
            raise CorruptArchiveError(
                f"{self.path}: rewritten since it was opened (its manifest changed); "
                f"{key!r} not served"
            )

    def all_keys(self) -> list[str]:
        out: list[str] = []
        for info in self.folder.list():
            out.append(info.key)
            if len(out) > MAX_ZIP_ENTRIES:
                raise CorruptArchiveError(f"{self.path}: holds more than {MAX_ZIP_ENTRIES} keys")
        return out


def open_store(path: Path) -> Store:
    if path.is_dir():
        return DirectoryStore(path)
    if path.is_file():
        return ZipArchiveStore(path)
    if not os.path.lexists(path):
        raise ArchiveGoneError(f"{path}: no such archive")
    raise NotAnArchiveError(f"{path}: no such archive")


def open_store_at(folder: Folder, key: str) -> Store:
    """The archive at `key` of any folder (a local one, a bucket prefix): `NAME.zarr` is a
    folder of keys, anything else one zip object. A local folder gets the local stores, with
    their no-symlink rules."""
    if isinstance(folder, LocalFolder):
        return open_store(folder.root / key)
    if key.rstrip("/").endswith(".zarr"):
        sub = folder.sub(key)
        manifest = sub.stat(MANIFEST_KEY) or sub.stat(".zgroup")
        if manifest is None:
            raise NotAnArchiveError(f"{sub.name}: no such archive")
        store = FolderStore(sub)
        store.identity = (sub.name, *manifest.identity)  # the manifest is written last
        return store
    return ZipArchiveStore(folder.open(key))
