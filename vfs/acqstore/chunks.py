"""Planes of a directory-stored zarr array decoded straight from its chunk files with numcodecs.

zarr-python reads a chunk through its async machinery and copies the decoded chunk into the
selection (about 7 ms for an 8 MiB blosc plane here, against 3 ms for the codec alone). When the
layout is simple (C order, no filters or transposes, one codec from blosc/zstd/lz4/gzip/zlib/bz2
or none), a plane is read here instead: each chunk file is decoded into the plane buffer itself
when one chunk holds exactly the plane, or into a scratch chunk copied into place otherwise, and
must decode to exactly that size (the buffer is recycled: a short chunk left another image's
pixels in it; a bz2 chunk of a few KiB inflated to GiBs). Anything else (a zip store, sharding, a
missing chunk whose fill value zarr-python knows) returns None and the caller asks zarr-python.
"""

from __future__ import annotations

import asyncio
import copy
import errno
import functools
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numcodecs
import numcodecs.abc
import numpy as np
from numcodecs.compat import ensure_bytes

from vfs.beneath import open_beneath, read_beneath
from vfs.decant.chunks import COMPRESSORS, FILTERS, decode_into
from vfs.decant.limits import MAX_CHUNK_BYTES, compressed_bound
from vfs.errors import CorruptArchiveError, UnsupportedFormatError

_V3_COMPRESSORS = {"BloscCodec": "blosc", "ZstdCodec": "zstd", "GzipCodec": "gzip"}


class PlaneReader:
    """The zarr array itself (for indexing) plus `read_plane`, the fast path for one plane."""

    def __init__(self, array: Any, folder: Path | None, label: Path | None = None) -> None:
        self.array = array
        # The image's array as SRC names it: `folder` may be a /proc/self/fd path (the image
        # held by a descriptor), which told a log's reader nothing.
        self._label = label
        self.shape: tuple[int, ...] = tuple(array.shape)
        self.chunks: tuple[int, ...] = tuple(array.chunks)
        self.dtype = np.dtype(array.dtype)
        self._folder = folder
        # Chunk files are reached from the store's root with no link followed on the way,
        # the array's own folder (a dataset path such as `0`) included.
        root = getattr(array.store, "root", None)
        self._root = Path(root) if folder is not None and root is not None else folder
        self._codec: Any = None
        self._store_dtype = self.dtype
        self._direct = folder is not None and self._plan(array.metadata)

    def __getitem__(self, key: Any) -> Any:
        return self.array[key]

    def _plan(self, meta: Any) -> bool:
        """Whether chunks can be decoded here; picks the codec and the stored byte order."""
        import numcodecs

        if self.dtype.kind == "b":  # zarr reads any byte but 0 as True: copied, 2 or 255
            return False  # stayed what they were (red team 82 F2); zarr's path casts to 0/1

        if getattr(meta, "zarr_format", None) == 2:
            if meta.filters or meta.order != "C":
                return False
            self._codec = getattr(meta.compressor, "inner", meta.compressor)
            self._store_dtype = np.dtype(meta.dtype.to_native_dtype())
            return True
        codecs = list(getattr(meta, "codecs", ()))
        if not codecs or type(codecs[0]).__name__ != "BytesCodec" or len(codecs) > 2:
            return False
        kind = _V3_COMPRESSORS.get(type(codecs[-1]).__name__) if len(codecs) == 2 else "none"
        if kind is None or type(meta.chunk_grid).__name__ != "RegularChunkGrid":
            return False
        factories = {"blosc": numcodecs.Blosc, "zstd": numcodecs.Zstd, "gzip": numcodecs.GZip}
        self._codec = factories[kind]() if kind in factories else None
        endian = getattr(codecs[0].endian, "value", None)
        self._store_dtype = self.dtype.newbyteorder(">" if endian == "big" else "<")
        return True

    def read_plane(
        self, lead: Sequence[int], alloc: Callable[[int], np.ndarray] | None = None
    ) -> memoryview | None:
        """The (y, x) plane at leading coordinates `lead` as little-endian bytes, or None when
        this array needs zarr-python (see the module docstring). `alloc(nbytes)` gives the
        uint8 buffer (PageCache.buffers.take: one already faulted in)."""
        if not self._direct:
            return None
        height, width = self.shape[-2:]
        # numpy's allocation, not a bytearray: large arrays get transparent huge pages.
        nbytes = height * width * self.dtype.itemsize
        buf = alloc(nbytes) if alloc is not None else np.empty(nbytes, np.uint8)
        plane = buf.view(self._store_dtype).reshape(height, width)
        cy, cx = self.chunks[-2:]
        outer = tuple(c // s for c, s in zip(lead, self.chunks, strict=False))
        for y0 in range(0, height, cy):
            for x0 in range(0, width, cx):
                if not self._decode_into((*outer, y0 // cy, x0 // cx), lead, plane, y0, x0):
                    return None
        if plane.dtype.byteorder == ">":
            plane.byteswap(inplace=True)  # the TIFF is little-endian; swapped where it lies
        return memoryview(buf)

    def prefetch(self, lead: Sequence[int]) -> None:
        """Ask the kernel to start reading the chunk files of the plane at `lead` (no waiting):
        a cold plane then decodes without its thread first sitting in a disk read."""
        if not self._direct:
            return
        outer = tuple(c // s for c, s in zip(lead, self.chunks, strict=False))
        grid = [range(-(-n // c)) for n, c in zip(self.shape[-2:], self.chunks[-2:], strict=True)]
        for cy in grid[0]:
            for cx in grid[1]:
                assert self._folder is not None
                path = self._folder / self.array.metadata.encode_chunk_key((*outer, cy, cx))
                try:  # never through a link, and never waiting on a FIFO (vfs/beneath.py)
                    fd = open_beneath(self._root, path, os.O_RDONLY | os.O_NONBLOCK)
                except OSError:
                    continue
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
                finally:
                    os.close(fd)

    def _decode_into(
        self, index: tuple[int, ...], lead: Sequence[int], plane: np.ndarray, y0: int, x0: int
    ) -> bool:
        assert self._folder is not None
        path = self._folder / self.array.metadata.encode_chunk_key(index)
        try:
            # The image folder was checked for links when opened; a chunk swapped for one (or
            # for a FIFO) since must not be read as root: see vfs/beneath.py.
            assert self._root is not None
            stored = compressed_bound(math.prod(self.chunks) * self.dtype.itemsize)
            raw = read_beneath(self._root, path, stored)
        except FileNotFoundError:
            return False  # the fill value: zarr-python's business
        except OSError as exc:
            if exc.errno != errno.EFBIG:
                raise
            raise CorruptArchiveError(f"{self._named(path)}: chunk file {exc.strerror}") from None
        height, width = plane.shape
        whole = self.chunks[-2:] == (height, width) and all(c == 1 for c in self.chunks[:-2])
        try:
            if whole:
                self._decode(raw, plane)
                return True
            chunk = np.empty(self.chunks, self._store_dtype)
            self._decode(raw, chunk)
        except Exception as exc:  # codecs raise anything from RuntimeError to ValueError
            why = f"chunk does not decode ({exc})"
            raise CorruptArchiveError(f"{self._named(path)}: {why}") from None
        inner = tuple(c % s for c, s in zip(lead, self.chunks, strict=False))
        ny, nx = min(self.chunks[-2], height - y0), min(self.chunks[-1], width - x0)
        plane[y0 : y0 + ny, x0 : x0 + nx] = chunk[inner][:ny, :nx]
        return True

    def _named(self, path: Path) -> Path:
        """`path` (a chunk file below the array's folder) as SRC names it, when known."""
        if self._label is None or self._folder is None:
            return path
        try:
            return self._label / path.relative_to(self._folder)
        except ValueError:
            return path

    def _decode(self, raw: bytes, out: np.ndarray) -> None:
        """Fill every byte of `out` (a recycled buffer: what it held before is another image's)
        from the chunk, or raise: a chunk stating or inflating to any other size is an error,
        found before more than `out` is written (vfs.decant.chunks.decode_into)."""
        if not out.flags.c_contiguous:
            raise ValueError("the plane buffer is not contiguous")
        decode_into(self._codec, raw, out)


class ExactCodec(numcodecs.abc.Codec):  # type: ignore[misc]
    """A v2 array's compressor as zarr-python is given it: `decode` gives exactly one chunk's
    bytes or raises. zarr-python decodes a chunk whole, with no bound, before it checks its
    shape: a bz2 chunk of 2.4 KiB for a 4 KiB plane grew the daemon by 9 GiB."""

    codec_id = "exact"  # zarr-python checks the class has one; each instance says its own

    def __init__(self, inner: Any, nbytes: int) -> None:
        self.inner, self.nbytes, self.codec_id = inner, nbytes, inner.codec_id

    def decode(self, buf: Any, out: Any = None) -> Any:
        dest = np.empty(self.nbytes, np.uint8) if out is None else out
        decode_into(self.inner, ensure_bytes(buf), dest)
        return dest

    def encode(self, buf: Any) -> Any:
        return self.inner.encode(buf)

    def get_config(self) -> dict[str, Any]:
        return self.inner.get_config()  # type: ignore[no-any-return]


def bounded(array: Any) -> Any:
    """`array` (as zarr.open_array gave it) with every chunk decoded to exactly its size, or
    UnsupportedFormatError naming what cannot be: a v2 array's compressor and filters from the
    decant core's allowlists (filters that keep the size), its compressor wrapped (ExactCodec),
    and no chunk over MAX_CHUNK_BYTES. A v3 array is returned as it is."""
    from dataclasses import replace

    from zarr import Array
    from zarr.core.array import AsyncArray

    meta = array.metadata
    if getattr(meta, "zarr_format", None) != 2:
        exact3 = replace(meta, codecs=_exact_v3(meta.codecs, "codecs"))
        return Array(AsyncArray(metadata=exact3, store_path=array.store_path))
    itemsize = np.dtype(meta.dtype.to_native_dtype()).itemsize
    nbytes = math.prod(meta.chunks) * itemsize
    if nbytes > MAX_CHUNK_BYTES:
        raise UnsupportedFormatError(f"chunks {list(meta.chunks)} of {nbytes} bytes are too large")
    codec_id = getattr(meta.compressor, "codec_id", None)
    if meta.compressor is not None and codec_id not in COMPRESSORS:
        raise UnsupportedFormatError(f"compressor {codec_id!r} is not one decoded here")
    for codec in meta.filters or ():
        same = np.dtype(getattr(codec, "astype", meta.dtype.to_native_dtype())).itemsize
        if codec.codec_id not in FILTERS or same != itemsize:
            raise UnsupportedFormatError(f"filter {codec.codec_id!r} is not one decoded here")
    if meta.compressor is None:
        return array
    exact = replace(meta, compressor=ExactCodec(meta.compressor, nbytes))
    return Array(AsyncArray(metadata=exact, store_path=array.store_path))


# Zarr v3 bytes-to-bytes codecs decoded here with a bound, by the numcodecs codec they wrap.
_V3_EXACT = {"BloscCodec": "Blosc", "ZstdCodec": "Zstd", "GzipCodec": "GZip"}
_V3_PASSING = {"TransposeCodec", "BytesCodec", "Crc32cCodec"}  # decode to no more than given


def _exact_v3(codecs: Any, where: str) -> tuple[Any, ...]:
    """A v3 codec list whose compressors decode to exactly their chunk (`_ExactV3`), inside a
    sharding codec too; UnsupportedFormatError for any codec not known to be bounded, or for
    two compressors in one list (the inner one's size would be unknown)."""
    from dataclasses import replace

    out: list[Any] = []
    crcs = 0  # crc32c checksums appended before the compressor: inside what it decodes to
    if sum(type(c).__name__ in _V3_EXACT for c in codecs) > 1:
        raise UnsupportedFormatError(f"{where}: more than one compressor")
    for codec in codecs:
        kind = type(codec).__name__
        if kind == "ShardingCodec":
            codec = replace(codec, codecs=_exact_v3(codec.codecs, "sharding codecs"),
                            index_codecs=_exact_v3(codec.index_codecs, "index codecs"))  # fmt: skip
        elif kind in _V3_EXACT:
            wrapped = copy.copy(codec)  # its class swapped: zarr-python's `replace`s keep it
            object.__setattr__(wrapped, "__class__", _exact_class(type(codec), crcs))
            codec = wrapped
        elif kind == "Crc32cCodec":
            crcs += 1
        elif kind not in _V3_PASSING:
            raise UnsupportedFormatError(f"{where}: codec {kind} is not one decoded here")
        out.append(codec)
    return tuple(out)


@functools.cache
def _exact_class(base: type, crcs: int) -> type:
    """`base` (a zarr v3 compressor) whose decode gives exactly the chunk's bytes or raises:
    zarr-python decodes a chunk whole, with no bound (a 3 MiB gzip chunk of a 4 KiB plane grew
    the daemon by 9 GiB). `crcs`: crc32c checksums the chunk carries inside the compression."""

    class Exact(base):  # type: ignore[misc,valid-type]
        async def _decode_single(self, chunk_bytes: Any, chunk_spec: Any) -> Any:
            return await asyncio.to_thread(self._exact, chunk_bytes, chunk_spec)

        def _exact(self, chunk_bytes: Any, chunk_spec: Any) -> Any:
            itemsize = np.dtype(chunk_spec.dtype.to_native_dtype()).itemsize
            nbytes = math.prod(chunk_spec.shape) * itemsize + 4 * crcs
            if nbytes > MAX_CHUNK_BYTES:
                raise UnsupportedFormatError(f"a chunk of {nbytes} bytes is too large")
            codec = getattr(numcodecs, _V3_EXACT[base.__name__])()
            dest = np.empty(nbytes, np.uint8)
            decode_into(codec, ensure_bytes(chunk_bytes.as_numpy_array()), dest)
            return chunk_spec.prototype.buffer.from_array_like(dest)

    Exact.__name__ = base.__name__  # what the codec lists say (and _plan matches on)
    return Exact


def store_folder(array: Any) -> Path | None:
    """The local folder holding `array`'s chunk files, or None for any other store."""
    from zarr.storage import LocalStore

    root = getattr(array.store, "root", None)
    if not isinstance(array.store, LocalStore) or root is None:
        return None
    return Path(root) / array.path if array.path else Path(root)
