"""Key access to an archive's store (`.zarr.zip` or `.zarr/`) and chunk decoding of its arrays.

Reads bypass zarr-python on purpose: a STORED zip entry is a contiguous byte range, so a chunk is
one positional read at an offset found once from the central directory, with no event loop or store
lock in the way (`tools/bench.py read` measures both paths). Codecs still come from numcodecs,
configured by each array's own `.zarray`.

Bytes come through a byte source (`vfs.stores`): a local file is one descriptor read with
`os.pread`; an object in a bucket is read with ranged GETs. So that a remote zip costs one request
per step, the central directory is read with the file's tail in one read, and an entry's first
read fetches its local header and its data together.
"""

from __future__ import annotations

import io
import json
import math
import os
import struct
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np

from vfs.decant import MANIFEST_KEY as MANIFEST_KEY  # re-exported: its home is vfs.decant
from vfs.decant import archive_stem as archive_stem
from vfs.errors import CorruptArchiveError, NotAnArchiveError, UnsupportedFormatError
from vfs.stores.base import ByteSource, Folder
from vfs.stores.local import LocalFile, LocalFolder

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")

# numcodecs ignores blosc's thread count outside the main thread unless this is set.
numcodecs.blosc.use_threads = True  # type: ignore[attr-defined]
numcodecs.blosc.set_nthreads(min(4, os.cpu_count() or 1))  # type: ignore[attr-defined]


def is_archive_name(name: str) -> bool:
    return name.endswith((".zarr.zip", ".zarr"))


class Store:
    """Read-only key/value view of one archive. Thread-safe: reads are positional."""

    def __init__(self, path: Path | str) -> None:
        self.path = path  # a local path, or the URL of an archive in a bucket
        self.name = str(path)
        self.stat: os.stat_result | None = None  # of the very file read (local zip stores)
        self.identity: tuple[object, ...] | None = None  # of the very bytes read (zip stores)

    def get(self, key: str) -> bytes | None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _SourceFile(io.RawIOBase):
    """A byte source as the seekable file `zipfile` wants, its tail read once up front: the end
    record and central directory of a remote zip then cost one ranged GET, not a dozen."""

    def __init__(self, source: ByteSource, tail: int) -> None:
        super().__init__()
        self._source = source
        self._pos = 0
        self._tail_at = max(0, source.size - tail)
        self._tail = source.read(self._tail_at, source.size - self._tail_at)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._pos, self._source.size)[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buf: Any) -> int:
        n = max(0, min(len(buf), self._source.size - self._pos))
        if self._pos < self._tail_at < self._pos + n:  # e.g. a central directory larger than the
            head = self._source.read(self._pos, self._tail_at - self._pos)  # tail: grow it
            self._tail, self._tail_at = head + self._tail, self._pos
        if self._pos >= self._tail_at:
            start = self._pos - self._tail_at
            data = self._tail[start : start + n]
        else:
            data = self._source.read(self._pos, n)
        buf[: len(data)] = data
        self._pos += len(data)
        return len(data)


class ZipArchiveStore(Store):
    def __init__(self, source: ByteSource | Path) -> None:
        if isinstance(source, Path):
            try:
                source = LocalFile(source)
            except OSError as exc:
                raise CorruptArchiveError(f"{source}: cannot read ({exc.strerror})") from None
        super().__init__(getattr(source, "path", source.name))
        # One source for the index and the reads (one descriptor; one ETag for an object):
        # opening twice could pair one file's central directory with the bytes of an archive
        # re-published in between.
        self._source: ByteSource | None = source
        try:
            tail = int(getattr(source, "tail_hint", 64 * 1024))
            with zipfile.ZipFile(_SourceFile(source, tail)) as zf:
                infos = zf.infolist()
        except zipfile.BadZipFile as exc:
            self.close()
            raise CorruptArchiveError(f"{self.name}: not a readable zip archive ({exc})") from None
        except OSError as exc:
            self.close()
            raise CorruptArchiveError(f"{self.name}: cannot read ({exc.strerror})") from None
        except BaseException:
            self.close()
            raise
        self._entries: dict[str, zipfile.ZipInfo] = {i.filename: i for i in infos}
        self._data_offsets: dict[str, int] = {}
        self._lock = threading.Lock()
        self.stat = getattr(source, "stat", None)
        self.identity = source.identity

    def keys(self) -> list[str]:
        return list(self._entries)

    @property
    def source(self) -> ByteSource:
        if self._source is None:
            raise ValueError(f"{self.name}: store is closed")
        return self._source

    def _first_read(self, info: zipfile.ZipInfo) -> bytes:
        """An entry's data, read with its local header in one read (the header's name and
        extra lengths are guessed from the central directory; a wrong guess costs one more)."""
        size = self.source.size
        guess = _LOCAL_HEADER.size + len(info.filename.encode()) + len(info.extra)
        end = min(size, info.header_offset + guess + info.file_size)
        if info.header_offset + _LOCAL_HEADER.size > size:
            blob = b""
        else:
            blob = self.source.read(info.header_offset, end - info.header_offset)
        header = blob[: _LOCAL_HEADER.size]
        if len(header) < _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
            raise CorruptArchiveError(
                f"{self.name}: zip entry {info.filename!r} has no local header (truncated?)"
            )
        fields = _LOCAL_HEADER.unpack(header)
        start = _LOCAL_HEADER.size + fields[9] + fields[10]
        offset = info.header_offset + start
        with self._lock:
            self._data_offsets[info.filename] = offset
        if start + info.file_size <= len(blob):
            return blob[start : start + info.file_size]
        return self._read_at(info, offset)

    def _read_at(self, info: zipfile.ZipInfo, offset: int) -> bytes:
        if offset + info.file_size > self.source.size:
            raise CorruptArchiveError(f"{self.name}: zip entry {info.filename!r} is truncated")
        return self.source.read(offset, info.file_size)

    def get(self, key: str) -> bytes | None:
        info = self._entries.get(key)
        if info is None:
            return None
        if info.compress_type != zipfile.ZIP_STORED:
            # Not what decant writes, but a re-zipped archive is still readable, just slower.
            try:
                with zipfile.ZipFile(_SourceFile(self.source, 0)) as zf:
                    return zf.read(info)
            except (zipfile.BadZipFile, OSError, EOFError) as exc:
                raise CorruptArchiveError(f"{self.name}: cannot read {key!r} ({exc})") from None
        offset = self._data_offsets.get(key)
        if offset is None:
            return self._first_read(info)
        return self._read_at(info, offset)

    def close(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None


class DirectoryStore(Store):
    def __init__(self, path: Path | str, folder: Folder | None = None) -> None:
        super().__init__(path)
        self.folder: Folder = folder or LocalFolder(Path(path))

    def get(self, key: str) -> bytes | None:
        try:
            return self.folder.get(key)
        except OSError as exc:
            raise CorruptArchiveError(
                f"{self.path}: cannot read {key!r} ({exc.strerror})"
            ) from None


def open_store(path: Path) -> Store:
    if path.is_dir():
        return DirectoryStore(path)
    if path.is_file():
        return ZipArchiveStore(path)
    raise NotAnArchiveError(f"{path}: no such archive")


def open_store_at(folder: Folder, key: str) -> Store:
    """The archive at `key` of any folder (a local one, a bucket prefix): `NAME.zarr` is a
    folder of keys, anything else one zip object."""
    if key.rstrip("/").endswith(".zarr"):
        sub = folder.sub(key)
        manifest = sub.stat(MANIFEST_KEY) or sub.stat(".zgroup")
        if manifest is None:
            raise NotAnArchiveError(f"{sub.name}: no such archive")
        store = DirectoryStore(sub.name, sub)
        store.identity = (sub.name, *manifest.identity)  # the manifest is written last
        return store
    return ZipArchiveStore(folder.open(key))


@dataclass(frozen=True)
class ArraySpec:
    """An array's `.zarray`, as far as reading chunks needs it."""

    name: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: np.dtype[Any]
    fill_value: Any
    separator: str
    compressor: Any
    filters: tuple[Any, ...]

    @property
    def chunk_nbytes(self) -> int:
        return math.prod(self.chunks) * self.dtype.itemsize

    def chunk_key(self, index: tuple[int, ...]) -> str:
        return f"{self.name}/" + self.separator.join(map(str, index))


def read_array_spec(store: Store, name: str) -> ArraySpec:
    raw = store.get(f"{name}/.zarray")
    if raw is None:
        raise CorruptArchiveError(f"{store.name}: array '{name}' is missing (no {name}/.zarray)")
    try:
        doc = json.loads(raw)
        if doc.get("zarr_format") != 2:
            raise UnsupportedFormatError(f"{store.name}: array '{name}' is not Zarr v2")
        if doc.get("order", "C") != "C":
            raise UnsupportedFormatError(f"{store.name}: array '{name}' is not in C order")
        compressor = doc.get("compressor")
        return ArraySpec(
            name=name,
            shape=tuple(int(n) for n in doc["shape"]),
            chunks=tuple(int(n) for n in doc["chunks"]),
            dtype=np.dtype(doc["dtype"]),
            fill_value=doc.get("fill_value") or 0,
            separator=doc.get("dimension_separator") or ".",
            compressor=numcodecs.get_codec(compressor) if compressor else None,
            filters=tuple(numcodecs.get_codec(f) for f in doc.get("filters") or ()),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptArchiveError(
            f"{store.name}: array '{name}' has bad metadata ({exc})"
        ) from None


def read_chunk(store: Store, spec: ArraySpec, index: tuple[int, ...]) -> bytes:
    """One chunk's decoded bytes (always the full chunk shape, as Zarr v2 stores edge chunks)."""
    key = spec.chunk_key(index)
    raw = store.get(key)
    if raw is None:
        fill = np.full(spec.chunks, spec.fill_value, dtype=spec.dtype)
        return fill.tobytes()
    try:
        data: Any = spec.compressor.decode(raw) if spec.compressor else raw
        for codec in reversed(spec.filters):
            data = codec.decode(data)
        out = memoryview(data).cast("B").tobytes() if not isinstance(data, bytes) else data
    except Exception as exc:  # codecs raise anything from RuntimeError to ValueError
        raise CorruptArchiveError(f"{store.name}: chunk {key!r} does not decode ({exc})") from None
    if len(out) != spec.chunk_nbytes:
        raise CorruptArchiveError(
            f"{store.name}: chunk {key!r} decodes to {len(out)} bytes, expected {spec.chunk_nbytes}"
        )
    return out
