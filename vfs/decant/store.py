"""Key access to an archive's store (`.zarr.zip` or `.zarr/`) and chunk decoding of its arrays.

Reads bypass zarr-python on purpose: a STORED zip entry is a contiguous byte range, so a chunk is
one `os.pread` at an offset found once from the central directory, with no event loop or store lock
in the way (`tools/bench.py read` measures both paths). Codecs still come from numcodecs,
configured by each array's own `.zarray`.
"""

from __future__ import annotations

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

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")

# numcodecs ignores blosc's thread count outside the main thread unless this is set.
numcodecs.blosc.use_threads = True  # type: ignore[attr-defined]
numcodecs.blosc.set_nthreads(min(4, os.cpu_count() or 1))  # type: ignore[attr-defined]


def is_archive_name(name: str) -> bool:
    return name.endswith((".zarr.zip", ".zarr"))


class Store:
    """Read-only key/value view of one archive. Thread-safe: reads are positional."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = str(path)
        self.stat: os.stat_result | None = None  # of the very file read (zip stores)

    def get(self, key: str) -> bytes | None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ZipArchiveStore(Store):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        # One descriptor for the index and the reads: opening the path twice could pair one
        # file's central directory with the bytes of an archive re-published in between.
        self._fd = -1
        try:
            self._fd = os.open(path, os.O_RDONLY)
            with open(os.dup(self._fd), "rb") as fh, zipfile.ZipFile(fh) as zf:
                infos = zf.infolist()
        except zipfile.BadZipFile as exc:
            self.close()
            raise CorruptArchiveError(f"{path}: not a readable zip archive ({exc})") from None
        except OSError as exc:
            self.close()
            raise CorruptArchiveError(f"{path}: cannot read ({exc.strerror})") from None
        self._entries: dict[str, zipfile.ZipInfo] = {i.filename: i for i in infos}
        self._data_offsets: dict[str, int] = {}
        self._lock = threading.Lock()
        self.stat = os.fstat(self._fd)

    def keys(self) -> list[str]:
        return list(self._entries)

    def _data_offset(self, info: zipfile.ZipInfo) -> int:
        offset = self._data_offsets.get(info.filename)
        if offset is None:
            header = os.pread(self._fd, _LOCAL_HEADER.size, info.header_offset)
            if len(header) < _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
                raise CorruptArchiveError(
                    f"{self.path}: zip entry {info.filename!r} has no local header (truncated?)"
                )
            fields = _LOCAL_HEADER.unpack(header)
            offset = info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10]
            with self._lock:
                self._data_offsets[info.filename] = offset
        return offset

    def get(self, key: str) -> bytes | None:
        info = self._entries.get(key)
        if info is None:
            return None
        if info.compress_type != zipfile.ZIP_STORED:
            # Not what decant writes, but a re-zipped archive is still readable, just slower.
            try:
                with open(os.dup(self._fd), "rb") as fh, zipfile.ZipFile(fh) as zf:
                    return zf.read(info)
            except (zipfile.BadZipFile, OSError, EOFError) as exc:
                raise CorruptArchiveError(f"{self.path}: cannot read {key!r} ({exc})") from None
        offset = self._data_offset(info)
        data = os.pread(self._fd, info.file_size, offset)
        if len(data) != info.file_size:
            raise CorruptArchiveError(f"{self.path}: zip entry {key!r} is truncated")
        return data

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class DirectoryStore(Store):
    def get(self, key: str) -> bytes | None:
        try:
            return (self.path / key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
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
