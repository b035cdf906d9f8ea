"""An array's `.zarray`, validated, and bounded chunk decoding: the size is known before decoding.

Codecs come from numcodecs, configured by each array's own `.zarray`, but only from an allowlist:
numcodecs also registers codecs such as `pickle`, whose decode runs code chosen by the archive.
Every decode writes into a buffer of exactly the expected size, after the codec's own header (blosc,
zstd, lz4) has been checked to state that size; stream codecs decode with a `max_length`.
"""

from __future__ import annotations

import bz2
import math
import os
import re
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numcodecs
import numpy as np

from vfs.decant.blosc_blocks import decompress_into
from vfs.decant.limits import (
    MAX_METADATA_BYTES,
    MAX_METADATA_COST,
    MAX_NDIM,
    compressed_bound,
    human,
    parse_json,
)
from vfs.decant.store import Store
from vfs.errors import CorruptArchiveError, UnsupportedFormatError

# numcodecs ignores blosc's thread count outside the main thread unless this is set.
numcodecs.blosc.use_threads = True  # type: ignore[attr-defined]
numcodecs.blosc.set_nthreads(min(4, os.cpu_count() or 1))  # type: ignore[attr-defined]
# Threads of one whole-chunk decode. One: read-ahead decodes planes in parallel threads, and a
# plane's decode (~2.5 ms for 8 MiB) is short next to serving it.
DECODE_THREADS = 1

COMPRESSORS = frozenset({"blosc", "zstd", "lz4", "zlib", "gzip", "bz2"})
FILTERS = frozenset({"shuffle", "delta"})  # size-preserving ones only
_DTYPE = re.compile(r"[<>|=]?[uif][1248]")
_BLOSC_HEADER = struct.Struct("<BBBBIII")
_BLOSC_MEMCPYED = 0x02
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

Buffer = bytes | bytearray | memoryview


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
    all_stored: bool = False  # every chunk was written: a missing one is damage, not fill

    @property
    def chunk_nbytes(self) -> int:
        return math.prod(self.chunks) * self.dtype.itemsize

    @property
    def grid(self) -> tuple[int, ...]:
        return tuple(-(-s // c) for s, c in zip(self.shape, self.chunks, strict=True))

    def chunk_key(self, index: tuple[int, ...]) -> str:
        return f"{self.name}/" + self.separator.join(map(str, index))


def read_array_spec(
    store: Store, name: str, max_chunk_bytes: int, all_stored: bool = False
) -> ArraySpec:
    """The array's metadata, refused if a chunk would decode to more than `max_chunk_bytes`."""
    where = f"{store.name}: array '{name}'"
    raw = store.get_metadata(f"{name}/.zarray", MAX_METADATA_BYTES)
    if raw is None:
        raise CorruptArchiveError(f"{where} is missing (no {name}/.zarray)")
    try:
        doc = parse_json(raw, MAX_METADATA_COST)
    except ValueError as exc:
        raise CorruptArchiveError(f"{where} has bad metadata ({exc})") from None
    if not isinstance(doc, dict):
        raise CorruptArchiveError(f"{where}: .zarray is not a JSON object")
    if doc.get("zarr_format") != 2:
        raise UnsupportedFormatError(f"{where} is not Zarr v2")
    if doc.get("order", "C") != "C":
        raise UnsupportedFormatError(f"{where} is not in C order")
    shape, chunks = _dims(doc, "shape", where, 0), _dims(doc, "chunks", where, 1)
    if len(shape) != len(chunks):
        raise CorruptArchiveError(f"{where}: .zarray shape and chunks differ in rank")
    dtype = _dtype(doc.get("dtype"), where)
    spec = ArraySpec(
        name=name,
        shape=shape,
        chunks=chunks,
        dtype=dtype,
        fill_value=_fill(doc.get("fill_value"), dtype, where),
        separator=_separator(doc.get("dimension_separator"), where),
        compressor=_codec(doc.get("compressor"), COMPRESSORS, "compressor", where),
        filters=tuple(_codec(f, FILTERS, "filter", where) for f in _list(doc, "filters", where)),
        all_stored=all_stored,
    )
    if spec.chunk_nbytes > max_chunk_bytes:
        raise CorruptArchiveError(
            f"{where}: .zarray chunks {list(chunks)} make a chunk of {spec.chunk_nbytes} bytes, "
            f"more than the {human(max_chunk_bytes)} this array may hold"
        )
    return spec


def _dims(doc: dict[str, Any], key: str, where: str, least: int) -> tuple[int, ...]:
    value = doc.get(key)
    if (
        not isinstance(value, list)
        or not 1 <= len(value) <= MAX_NDIM
        or not all(type(n) is int and n >= least for n in value)
    ):
        raise CorruptArchiveError(
            f"{where}: .zarray {key} {str(value)[:80]} is not a list of 1 to {MAX_NDIM} "
            f"integers >= {least}"
        )
    return tuple(value)


def _dtype(value: Any, where: str) -> np.dtype[Any]:
    if not isinstance(value, str) or not _DTYPE.fullmatch(value):
        raise UnsupportedFormatError(f"{where}: .zarray dtype {str(value)[:40]!r} is not numeric")
    return np.dtype(value)


def _fill(value: Any, dtype: np.dtype[Any], where: str) -> Any:
    try:
        return np.array(0 if value is None else value, dtype=dtype).item()
    except (TypeError, ValueError, OverflowError):
        raise CorruptArchiveError(
            f"{where}: .zarray fill_value {str(value)[:40]!r} is not a {dtype}"
        ) from None


def _separator(value: Any, where: str) -> str:
    if value is None:
        return "."
    if value not in (".", "/"):
        raise CorruptArchiveError(f"{where}: .zarray dimension_separator {value!r} is not . or /")
    return str(value)


def _list(doc: dict[str, Any], key: str, where: str) -> list[Any]:
    value = doc.get(key) or []
    if not isinstance(value, list):
        raise CorruptArchiveError(f"{where}: .zarray {key} is not a list")
    return value


def _codec(config: Any, allowed: frozenset[str], what: str, where: str) -> Any:
    if config is None and what == "compressor":
        return None
    codec_id = config.get("id") if isinstance(config, dict) else None
    if not isinstance(codec_id, str) or codec_id not in allowed:
        raise UnsupportedFormatError(
            f"{where}: .zarray {what} {str(codec_id or config)[:40]!r} is not one this reader "
            f"decodes ({', '.join(sorted(allowed))})"
        )
    assert isinstance(config, dict)
    try:
        codec = numcodecs.get_codec(dict(config))  # get_codec pops "id": pass a copy
    except Exception as exc:  # bad parameters raise anything from TypeError to ValueError
        raise CorruptArchiveError(f"{where}: .zarray {what} {config} is invalid ({exc})") from None
    if codec_id == "delta" and np.dtype(codec.astype).itemsize != np.dtype(codec.dtype).itemsize:
        raise UnsupportedFormatError(f"{where}: .zarray delta filter changes the item size")
    return codec


def check_byte_chunks(store: Store, spec: ArraySpec, n_chunks: int) -> None:
    """A 1-D byte array's stored chunks against the `n_chunks` its size needs: none beyond them
    (an `original_size` of 0 over an array holding data is refused), none missing when every
    chunk was stored, and not none at all for a non-empty array. Zip stores list keys for free."""
    keys = store.listed(f"{spec.name}/")
    if keys is None:
        return
    present: set[int] = set()
    for key in keys:
        leaf = key[len(spec.name) + 1 :]
        if leaf.startswith("."):
            continue  # .zarray, .zattrs
        if not (leaf.isascii() and leaf.isdigit() and len(leaf) < 20) or int(leaf) >= n_chunks:
            raise CorruptArchiveError(
                f"{store.name}: array '{spec.name}' holds chunk {key[:80]!r} beyond the "
                f"{spec.shape[0]} bytes the manifest gives it"
            )
        present.add(int(leaf))
    if spec.all_stored and len(present) < n_chunks:
        missing = next(i for i in range(n_chunks) if i not in present)
        raise CorruptArchiveError(f"{store.name}: chunk {spec.chunk_key((missing,))!r} is missing")
    if n_chunks and not present:
        raise CorruptArchiveError(
            f"{store.name}: array '{spec.name}' holds no data for its {spec.shape[0]} bytes"
        )


def read_chunk(
    store: Store,
    spec: ArraySpec,
    index: tuple[int, ...],
    alloc: Callable[[int], np.ndarray[Any, Any]] | None = None,
) -> Buffer:
    """One chunk's decoded bytes: always exactly the full chunk shape (Zarr v2 stores edge
    chunks whole). A missing chunk is an error when the archive stored every chunk, else the
    array's fill value (archives from before `all_chunks_stored` omitted all-fill chunks).
    `alloc(nbytes)` gives the uint8 buffer a blosc chunk decodes into (PageCache.buffers.take)."""
    key = spec.chunk_key(index)
    expected = spec.chunk_nbytes
    # Every codec decodes into a buffer of its own, so the stored bytes may be read into the
    # thread's reused scratch buffer; without a codec they would be the value itself.
    get = getattr(store, "get_scratch", store.get) if spec.compressor is not None else store.get
    raw = get(key, compressed_bound(expected))
    if raw is None:
        if spec.all_stored:
            raise CorruptArchiveError(f"{store.name}: chunk {key!r} is missing")
        fill = np.full(expected // spec.dtype.itemsize, spec.fill_value, dtype=spec.dtype)
        return memoryview(fill.view(np.uint8))
    try:
        out = _decode(spec, raw, expected, alloc)
        for codec in reversed(spec.filters):
            out = _exact(codec.decode(out), expected)
    except _SizeError as exc:
        raise CorruptArchiveError(f"{store.name}: chunk {key!r} {exc}") from None
    except Exception as exc:  # codecs raise anything from RuntimeError to ValueError
        raise CorruptArchiveError(f"{store.name}: chunk {key!r} does not decode ({exc})") from None
    return out


class _SizeError(Exception):
    """A chunk states (or decodes to) a size other than the one expected."""


def _exact(data: Any, expected: int) -> Buffer:
    out = data if isinstance(data, bytes | bytearray) else memoryview(data).cast("B")
    if len(out) != expected:
        raise _SizeError(f"decodes to {len(out)} bytes, expected {expected}")
    return out


def _decode(
    spec: ArraySpec,
    raw: Buffer,
    expected: int,
    alloc: Callable[[int], np.ndarray[Any, Any]] | None = None,
) -> Buffer:
    codec = spec.compressor
    if codec is None:
        return _exact(raw, expected)
    codec_id = codec.codec_id
    if codec_id in ("zlib", "gzip", "bz2"):
        return _decode_stream(codec_id, raw, expected)
    stated = {"blosc": _blosc_size, "zstd": _zstd_size, "lz4": _lz4_size}[codec_id](raw)
    if stated is None:
        raise _SizeError(f"has no valid {codec_id} header stating its size")
    if stated != expected:
        raise _SizeError(f"states {stated} decoded bytes, expected {expected}")
    if codec_id == "blosc":  # lock-free, and parallel across threads (blosc_blocks)
        # Uninitialized: zeroing 8 MiB first costs as much memory traffic as the decode writes.
        plane = alloc(expected) if alloc is not None else np.empty(expected, dtype=np.uint8)
        if decompress_into(raw, plane, DECODE_THREADS) != expected:
            raise _SizeError(f"does not decode to the {expected} bytes it states")
        return memoryview(plane)
    out = bytearray(expected)
    return _exact(codec.decode(raw, out=out), expected)


def decode_into(codec: Any, raw: Buffer, out: np.ndarray[Any, Any]) -> None:
    """Decode `raw` with `codec` (a numcodecs codec of COMPRESSORS, or None: stored as is) into
    `out`, a C-contiguous array every byte of which it fills: the chunk must state (or decode
    to) exactly `out.nbytes`, else ValueError saying what it holds. numcodecs' own decode into
    `out` fills only what the stream holds and leaves the rest as it was, and a stream codec
    without `out` inflates whatever the stream holds."""
    flat = out.reshape(-1).view(np.uint8)
    expected = flat.nbytes
    codec_id = None if codec is None else codec.codec_id
    try:
        if codec_id is None:
            flat[:] = np.frombuffer(_exact(raw, expected), np.uint8)
        elif codec_id in ("zlib", "gzip", "bz2"):
            flat[:] = np.frombuffer(_decode_stream(codec_id, raw, expected), np.uint8)
        elif codec_id in COMPRESSORS:
            stated = {"blosc": _blosc_size, "zstd": _zstd_size, "lz4": _lz4_size}[codec_id](raw)
            if stated != expected:
                raise _SizeError(f"states {stated} decoded bytes, expected {expected}")
            if codec_id == "blosc":
                if decompress_into(raw, flat) != expected:
                    raise _SizeError(f"does not decode to the {expected} bytes it states")
            else:
                codec.decode(raw, out=flat)  # zstd and lz4 fail a stream short of what it states
        else:
            raise UnsupportedFormatError(f"codec {codec_id!r} is not one decoded here")
    except _SizeError as exc:
        raise ValueError(str(exc)) from None


def _blosc_size(raw: Buffer) -> int | None:
    """nbytes from the blosc header, once the header is sane: cbytes must be the entry's own
    length (c-blosc trusts cbytes and would read past the buffer) and the block table must fit."""
    if len(raw) < _BLOSC_HEADER.size:
        return None
    _version, _lz, flags, typesize, nbytes, blocksize, cbytes = _BLOSC_HEADER.unpack_from(raw)
    if cbytes != len(raw) or typesize == 0:
        return None
    blocks_fit = blocksize and 16 + 4 * -(-nbytes // blocksize) <= cbytes
    if nbytes and not flags & _BLOSC_MEMCPYED and not blocks_fit:
        return None
    return int(nbytes)


def _zstd_size(raw: Buffer) -> int | None:
    """Frame_Content_Size from the first frame header (RFC 8878 §3.1.1.1), None if absent."""
    if len(raw) < 6 or raw[:4] != _ZSTD_MAGIC:
        return None
    fhd = raw[4]
    single = (fhd >> 5) & 1
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
    width = (1 if single else 0, 2, 4, 8)[fhd >> 6]
    if width == 0 or len(raw) < pos + width:
        return None
    value = int.from_bytes(raw[pos : pos + width], "little")
    return value + 256 if width == 2 else value


def _lz4_size(raw: Buffer) -> int | None:
    return int.from_bytes(raw[:4], "little") if len(raw) >= 4 else None


def _decode_stream(codec_id: str, raw: Buffer, expected: int) -> bytes:
    """zlib, gzip and bz2 state no size: decode at most one byte more than expected."""
    dec: Any = (
        bz2.BZ2Decompressor()
        if codec_id == "bz2"
        else zlib.decompressobj(31 if codec_id == "gzip" else 15)
    )
    out = dec.decompress(raw, expected + 1)
    if len(out) != expected or not dec.eof:
        raise _SizeError(f"decodes to more or fewer than the {expected} bytes expected")
    return bytes(out)
