"""vfs.decant.blosc_blocks: decoding some blocks of a blosc1 chunk equals slicing the whole
decode, for every codec the packer offers, any typesize and odd sizes; hostile headers are
refused with BloscChunkError, never decoded past the chunk."""

from __future__ import annotations

import struct

import numcodecs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vfs.decant.blosc_blocks import (
    HEADER_SIZE,
    BloscChunkError,
    block_spans,
    decode_blocks,
    decode_range,
    parse_header,
)
from vfs.decant.writer import CodecChoice

CNAMES = sorted(numcodecs.blosc.list_compressors())  # type: ignore[attr-defined]
SHUFFLES = ("noshuffle", "byteshuffle", "bitshuffle")
DTYPES = ("u1", "<u2", ">u2", "<i4", ">f4", "<f8", "V3", "V5", "V17")


@st.composite
def chunks(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(a chunk the packer's codec wrote, its whole decode): random codec, dtype, length, block
    size and entropy (low entropy compresses, full entropy ends up memcpyed or incompressible)."""
    choice = CodecChoice(draw(st.sampled_from(CNAMES)), draw(st.integers(0, 9)),
                         draw(st.sampled_from(SHUFFLES)))  # fmt: skip
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    # Codecs that split a block into per-byte streams use blocks of 64 KiB or more: chunks of up
    # to a few blocks plus a short last one exercise that split (and the unsplit last block).
    count = draw(st.integers(1, 12_000) | st.integers(30_000, 150_000))
    bits = draw(st.sampled_from([1, 4, 6, 8]))
    seed = draw(st.integers(0, 2**32 - 1))
    raw = np.random.default_rng(seed).integers(0, 1 << bits, count * dtype.itemsize, np.uint8)
    if bits < 8 and dtype.itemsize > 1:  # smooth high bytes, noisy low bytes: like microscopy
        raw.reshape(count, dtype.itemsize)[:, 1:] //= 8
    data = raw.view(dtype)
    blocksize = draw(st.sampled_from([0, 0, 128, 256, 1000, 4096, 65536]))
    config = {k: v for k, v in choice.codec().get_config().items() if k != "id"}
    chunk = bytes(numcodecs.Blosc(**{**config, "blocksize": blocksize}).encode(data))
    return chunk, bytes(numcodecs.Blosc().decode(chunk))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunks(), st.data())
def test_partial_decode_equals_slicing_the_whole(
    pair: tuple[bytes, bytes], data: st.DataObject
) -> None:
    chunk, whole = pair
    start = data.draw(st.integers(0, len(whole)))
    stop = data.draw(st.integers(start, len(whole) + 64))
    assert decode_range(chunk, start, stop) == whole[start:stop]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunks())
def test_every_block_alone_and_from_a_range_read(pair: tuple[bytes, bytes]) -> None:
    """Each block decoded from only the chunk bytes its stream occupies (what a ranged read of
    the stored entry gives), at the block's offset in the chunk."""
    chunk, whole = pair
    h = parse_header(chunk, len(chunk))
    assert h is not None and h.nbytes == len(whole)
    spans = block_spans(h, chunk[: h.table_end])
    for j in range(h.nblocks):
        lo, hi = spans[j]
        piece = decode_blocks(h, spans, range(j, j + 1), chunk[lo:hi], base=lo)
        assert piece == whole[j * h.blocksize : j * h.blocksize + h.block_bytes(j)]


def test_a_plane_of_the_default_codec_has_many_blocks() -> None:
    plane = np.random.default_rng(1).integers(1000, 1064, (2048, 2048), dtype=np.uint16)
    chunk = bytes(CodecChoice().codec().encode(plane))
    h = parse_header(chunk, len(chunk))
    assert h is not None and h.nblocks > 8 and not h.memcpyed
    whole = plane.tobytes()
    for start in (0, 3, h.blocksize - 2, 5 * h.blocksize + 17, len(whole) - 4096):
        assert decode_range(chunk, start, start + 4096) == whole[start : start + 4096]


def test_memcpyed_chunk_has_no_table() -> None:
    data = np.arange(1000, dtype=np.uint16)
    chunk = bytes(numcodecs.Blosc("zstd", 0, 1).encode(data))  # clevel 0: copied
    h = parse_header(chunk, len(chunk))
    assert h is not None and h.memcpyed and h.table_end == HEADER_SIZE
    assert len(chunk) == HEADER_SIZE + data.nbytes
    assert decode_range(chunk, 10, 1500) == data.tobytes()[10:1500]


def _sample() -> bytes:
    data = (np.arange(40_000) % 251).astype(np.uint16)
    return bytes(numcodecs.Blosc("lz4", 5, 1, blocksize=4096).encode(data))


def _patched(chunk: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(chunk)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "reason"),
    [
        (12, "<i", 99, "says 99 bytes"),  # cbytes other than the chunk's length
        (4, "<i", -1, "nbytes -1"),
        (8, "<i", 0, "block size 0"),
        (8, "<i", 1 << 30, "block size"),
        (4, "<i", 1 << 30, "block table"),  # a table too large for the chunk: no allocation
        (3, "<B", 0, "typesize 0"),
        (16, "<i", 0, "outside"),  # a block starting inside the header
        (20, "<i", 1 << 30, "outside"),  # a block starting past the end
    ],
)
def test_hostile_headers_are_refused(offset: int, fmt: str, value: int, reason: str) -> None:
    chunk = _patched(_sample(), offset, fmt, value)
    with pytest.raises(BloscChunkError, match=reason):
        decode_range(chunk, 0, 100)


def test_duplicate_block_offsets_are_refused() -> None:
    chunk = _sample()
    first = struct.unpack_from("<i", chunk, HEADER_SIZE)[0]
    with pytest.raises(BloscChunkError, match="two blocks start"):
        decode_range(_patched(chunk, HEADER_SIZE + 4, "<i", first), 0, 100)


def test_memcpyed_payload_shorter_than_claimed() -> None:
    data = np.arange(1000, dtype=np.uint16)
    chunk = bytes(numcodecs.Blosc("zstd", 0, 1).encode(data))
    short = _patched(chunk[:-10], 12, "<i", len(chunk) - 10)
    with pytest.raises(BloscChunkError, match="cannot hold"):
        decode_range(short, 0, 10)


def test_other_formats_are_not_split() -> None:
    chunk = bytearray(_sample())
    chunk[0] = 5  # a version this module does not know
    assert parse_header(chunk, len(chunk)) is None
    chunk[0] = 2
    chunk[2] |= 0x05  # byte- and bit-shuffle together: a blosc2 extended header
    assert parse_header(chunk, len(chunk)) is None


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 1 << 16), st.binary(min_size=1, max_size=8))
def test_damaged_streams_raise_or_decode_to_size(position: int, garbage: bytes) -> None:
    """Bytes overwritten anywhere after the table: an error or some bytes of the right length,
    never a crash or a read past the chunk."""
    chunk = bytearray(_sample())
    h = parse_header(chunk, len(chunk))
    assert h is not None
    at = h.table_end + position % (len(chunk) - h.table_end)
    chunk[at : at + len(garbage)] = garbage
    chunk = chunk[: len(_sample())]
    try:
        got = decode_range(bytes(chunk), 0, h.nbytes)
    except BloscChunkError:
        return
    assert len(got) == h.nbytes


@pytest.mark.parametrize("shuffle", SHUFFLES)
@pytest.mark.parametrize("cname", CNAMES)
def test_short_last_block_of_every_codec(cname: str, shuffle: str) -> None:
    """Three 64 KiB blocks and a short one: codecs that split full blocks into per-byte streams
    (blosclz, lz4) do not split the short last one."""
    data = ((np.arange(100_003) * 7) % 1000).astype(np.uint16)
    config = {k: v for k, v in CodecChoice(cname, 5, shuffle).codec().get_config().items()}
    config.pop("id")
    chunk = bytes(numcodecs.Blosc(**{**config, "blocksize": 1 << 16}).encode(data))
    h = parse_header(chunk, len(chunk))
    assert h is not None and h.nblocks > 1 and h.nbytes % h.blocksize
    whole = data.tobytes()
    assert decode_range(chunk, len(whole) - 3000, len(whole)) == whole[-3000:]
    assert decode_range(chunk, 0, len(whole)) == whole
