"""Blosc1 chunks block by block: parse the header and block table, decode only some blocks.

A blosc1 chunk is a 16-byte header (version, versionlz, flags, typesize, then little-endian int32
nbytes, blocksize, cbytes), one int32 offset per block, then each block's compressed stream. A
chunk stored without compression (flag 0x02, memcpyed) has no table: its bytes follow the header.
Blocks are independent, so one block can be decoded alone: its stream is re-framed as a chunk of
one block and handed to numcodecs. The re-framed header keeps the chunk's flags, typesize and
compressor; the last block of a chunk whose size is not a multiple of the block size is never
split into per-byte streams by c-blosc, so its frame sets the "don't split" flag (0x10).

Every size and offset comes from attacker input: each is checked against the chunk's length
before it is used, and nothing is allocated from a size that has not been checked.
"""

from __future__ import annotations

import ctypes
import itertools
import struct
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numcodecs import blosc

HEADER = struct.Struct("<BBBBiii")
HEADER_SIZE = HEADER.size  # 16
MEMCPYED = 0x02
_SHUFFLE_BITS = 0x01 | 0x04  # both set: a blosc2 extended header, not decoded here
_DONT_SPLIT = 0x10
_VERSIONS = (1, 2)  # blosc1 chunk formats

Buffer = bytes | bytearray | memoryview


class BloscChunkError(ValueError):
    """A chunk whose header or block table contradicts itself or its length."""


def _context_decompressor() -> Any:
    """c-blosc's blosc_decompress_ctx from numcodecs' own extension, or None.

    numcodecs decodes through blosc's global context behind one process-wide mutex, so two
    threads never decode at once, and it costs ~2.5× the CPU of a context decode here
    (0.39 s vs 0.15 s per 512 MiB of planes). The context call takes no lock; ctypes releases
    the GIL around it, so read-ahead decodes the next plane on the other core.
    """
    try:
        fn = ctypes.CDLL(blosc.__file__).blosc_decompress_ctx
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_DECOMPRESS_CTX = _context_decompressor()


def decompress_into(chunk: Buffer, out: Buffer | np.ndarray[Any, Any], threads: int = 1) -> int:
    """Decode a whole blosc chunk into `out` (exactly its nbytes long); returns the bytes
    written. The caller has checked the header (cbytes is the chunk's own length, nbytes is
    len(out)): c-blosc trusts both."""
    src = np.frombuffer(chunk, dtype=np.uint8)
    dst = np.frombuffer(out, dtype=np.uint8)
    if len(dst) == 0:
        return 0
    if _DECOMPRESS_CTX is None or not dst.flags.writeable:
        got: Any = blosc.decompress(chunk, out)  # type: ignore[attr-defined]
        return int(memoryview(got).nbytes)
    written = int(_DECOMPRESS_CTX(src.ctypes.data, dst.ctypes.data, len(dst), threads))
    if written < 0:
        raise BloscChunkError(f"does not decode (c-blosc error {written})")
    return written


@dataclass(frozen=True)
class BloscHeader:
    """The 16-byte header of one blosc1 chunk, checked against the chunk's length."""

    version: int
    versionlz: int
    flags: int
    typesize: int
    nbytes: int
    blocksize: int
    cbytes: int

    @property
    def memcpyed(self) -> bool:
        return bool(self.flags & MEMCPYED)

    @property
    def nblocks(self) -> int:
        return -(-self.nbytes // self.blocksize) if self.nbytes else 0

    @property
    def table_end(self) -> int:
        """Where the block streams may start: after the header and, unless memcpyed, the table."""
        return HEADER_SIZE if self.memcpyed else HEADER_SIZE + 4 * self.nblocks

    def block_bytes(self, j: int) -> int:
        """Decoded size of block `j` (the last one may be short)."""
        return min(self.blocksize, self.nbytes - j * self.blocksize)

    def blocks_for(self, start: int, stop: int) -> range:
        """Indices of the blocks holding decoded bytes [start, stop) (clipped to the chunk)."""
        stop = min(stop, self.nbytes)
        if start >= stop:
            return range(0)
        return range(max(start, 0) // self.blocksize, -(-stop // self.blocksize))


def parse_header(data: Buffer, length: int) -> BloscHeader | None:
    """The header at the start of `data`, a chunk of `length` bytes; None for a chunk this
    module does not split (another blosc format version, a blosc2 extended header).

    Raises BloscChunkError for a header that cannot be right: cbytes other than the chunk's
    length, a table or memcpyed payload that does not fit, a non-positive block size."""
    if length < HEADER_SIZE or len(data) < HEADER_SIZE:
        raise BloscChunkError(f"chunk of {length} bytes is shorter than a blosc header")
    h = BloscHeader(*HEADER.unpack_from(data))
    if h.version not in _VERSIONS or h.flags & _SHUFFLE_BITS == _SHUFFLE_BITS:
        return None
    if h.cbytes != length:
        raise BloscChunkError(f"blosc header says {h.cbytes} bytes, the chunk holds {length}")
    if h.nbytes < 0 or h.typesize == 0:
        raise BloscChunkError(f"blosc header nbytes {h.nbytes} typesize {h.typesize} is invalid")
    if h.memcpyed:
        if HEADER_SIZE + h.nbytes > length:
            raise BloscChunkError(f"memcpyed chunk of {length} bytes cannot hold {h.nbytes}")
        # A copied payload has no blocks to speak of; any block size slices it.
        return h if 0 < h.blocksize <= h.nbytes else replace(h, blocksize=max(h.nbytes, 1))
    if h.nbytes and not 0 < h.blocksize <= h.nbytes:
        raise BloscChunkError(f"blosc block size {h.blocksize} for {h.nbytes} bytes is invalid")
    if h.nbytes and h.table_end > length:
        raise BloscChunkError(f"block table of {h.nblocks} blocks runs past {length} bytes")
    return h


def block_spans(h: BloscHeader, table: Buffer) -> list[tuple[int, int]]:
    """(start, end) within the chunk of each block's compressed stream.

    `table` holds the chunk's bytes [0, h.table_end). A stream ends where the next stream in
    the chunk starts (c-blosc's threads may store blocks out of order), the last at cbytes.
    """
    if h.memcpyed:
        return [
            (HEADER_SIZE + j * h.blocksize, HEADER_SIZE + j * h.blocksize + h.block_bytes(j))
            for j in range(h.nblocks)
        ]
    if len(table) < h.table_end:
        raise BloscChunkError(f"block table needs {h.table_end} bytes, got {len(table)}")
    starts = list(struct.unpack_from(f"<{h.nblocks}i", table, HEADER_SIZE))
    ordered = sorted(starts)
    for a, b in itertools.pairwise(ordered):
        if a == b:
            raise BloscChunkError(f"two blocks start at offset {a}")
    if ordered and (ordered[0] < h.table_end or ordered[-1] + 4 > h.cbytes):
        raise BloscChunkError(f"a block starts outside [{h.table_end}, {h.cbytes - 4}]")
    end_of = dict(zip(ordered, [*ordered[1:], h.cbytes], strict=True))
    return [(s, end_of[s]) for s in starts]


def decode_blocks(
    h: BloscHeader,
    spans: list[tuple[int, int]],
    blocks: range,
    data: Buffer,
    base: int = 0,
) -> bytearray:
    """The decoded bytes of `blocks` (consecutive), concatenated.

    `data` holds the chunk's bytes [base, base + len(data)), which must include every
    requested block's stream (for a memcpyed chunk: its payload bytes).
    """
    if not blocks:
        return bytearray()
    if blocks.start < 0 or blocks.stop > h.nblocks or blocks.step != 1:
        raise BloscChunkError(f"blocks {blocks} are not within the chunk's {h.nblocks}")
    lo = blocks.start * h.blocksize
    hi = lo + sum(h.block_bytes(j) for j in blocks)
    view = memoryview(data).cast("B")
    if h.memcpyed:
        first, last = HEADER_SIZE + lo - base, HEADER_SIZE + hi - base
        if first < 0 or last > len(view):
            raise BloscChunkError("memcpyed payload is not within the bytes given")
        return bytearray(view[first:last])
    out = bytearray(hi - lo)  # 256 KiB for the default codec: zeroing it is noise
    pos = 0
    for j in blocks:
        start, end = spans[j][0] - base, spans[j][1] - base
        if start < 0 or end > len(view):
            raise BloscChunkError(f"block {j} stream is not within the bytes given")
        size = h.block_bytes(j)
        _decode_one(h, j, view[start:end], memoryview(out)[pos : pos + size])
        pos += size
    return out


def _decode_one(h: BloscHeader, j: int, stream: memoryview, out: memoryview) -> None:
    size = len(out)
    short_last = j == h.nblocks - 1 and size < h.blocksize
    flags = h.flags | _DONT_SPLIT if short_last else h.flags
    blocksize = size if short_last else h.blocksize
    frame = bytearray(HEADER_SIZE + 4 + len(stream))
    HEADER.pack_into(
        frame, 0, h.version, h.versionlz, flags, h.typesize, size, blocksize, len(frame)
    )
    struct.pack_into("<i", frame, HEADER_SIZE, HEADER_SIZE + 4)
    frame[HEADER_SIZE + 4 :] = stream
    try:
        written = decompress_into(frame, out)
    except Exception as exc:  # c-blosc reports any failure as a RuntimeError with a code
        raise BloscChunkError(f"block {j} does not decode ({exc})") from None
    if written != size:
        raise BloscChunkError(f"block {j} decodes to {written} bytes, not {size}")


def decode_range(chunk: Buffer, start: int, stop: int) -> bytes:
    """Decoded bytes [start, stop) of a whole blosc1 chunk held in memory, decoding only the
    blocks they touch."""
    view = memoryview(chunk).cast("B")
    h = parse_header(view, len(view))
    if h is None:
        raise BloscChunkError("not a blosc1 chunk this module decodes block by block")
    stop = min(stop, h.nbytes)
    if start >= stop:
        return b""
    blocks = h.blocks_for(start, stop)
    out = decode_blocks(h, block_spans(h, view[: h.table_end]), blocks, view)
    first = blocks.start * h.blocksize
    return bytes(out[start - first : stop - first])
