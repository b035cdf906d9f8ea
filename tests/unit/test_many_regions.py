"""Reads over many regions (red team 88, F2): strips laid out in reverse order with gaps
between them, one page's interleaved with another's, so no two segments join a region. Such a
read is copied with numpy from whole pages and one husk run (PixelReader._gather); it must
give the original's bytes, at any offset and size, as the region-at-a-time walk does."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import tifffile
from hypothesis import given, settings
from hypothesis import strategies as st

from vfs.cache import PageCache
from vfs.decant import reader as reader_module
from vfs.decant.packer import pack_file
from vfs.decant.reader import DecantArchive

ROWS, COLS = 48, 24  # a page of 48 one-row strips of 24 bytes


def _scattered_tiff(path: Path, pages: int, dtype: str = "u1") -> bytes:
    """A TIFF of `pages` pages of one-row strips (`dtype`: its byte order the file's), the
    strips of all pages written interleaved, last row first, a 3-byte gap before each."""
    dt = np.dtype(dtype)
    e = ">" if dt.byteorder == ">" else "<"
    rng = np.random.default_rng(88)
    planes = rng.integers(0, 250, (pages, ROWS, COLS)).astype(dt)
    row_bytes = COLS * dt.itemsize
    body = bytearray((b"MM\0*" if e == ">" else b"II*\0") + b"\0\0\0\0")
    offsets = [[0] * ROWS for _ in range(pages)]
    for row in reversed(range(ROWS)):
        for p in range(pages):
            body += b"\xee" * 3
            offsets[p][row] = len(body)
            body += planes[p, row].tobytes()
    first_ifd = len(body)
    for p in range(pages):
        here = len(body)
        tables = here + 2 + 10 * 12 + 4
        entries = [
            (256, 4, 1, COLS), (257, 4, 1, ROWS), (258, 3, 1, 8 * dt.itemsize), (259, 3, 1, 1),
            (262, 3, 1, 1), (273, 4, ROWS, tables), (277, 3, 1, 1), (278, 4, 1, 1),
            (279, 4, ROWS, tables + 4 * ROWS), (284, 3, 1, 1),
        ]  # fmt: skip
        ifd = struct.pack(e + "H", len(entries))
        for tag, kind, count, value in entries:
            if kind == 3 and count == 1:  # a SHORT sits in the first two bytes of the field
                ifd += struct.pack(e + "HHIHH", tag, kind, count, value, 0)
            else:
                ifd += struct.pack(e + "HHII", tag, kind, count, value)
        following = tables + 8 * ROWS if p + 1 < pages else 0
        ifd += struct.pack(e + "I", following)
        body += ifd + struct.pack(f"{e}{ROWS}I", *offsets[p])
        body += struct.pack(f"{e}{ROWS}I", *[row_bytes] * ROWS)
    body[4:8] = struct.pack(e + "I", first_ifd)
    path.write_bytes(bytes(body))
    with tifffile.TiffFile(path) as tif:  # an independent reader agrees on the pixels
        assert np.array_equal(np.stack([pg.asarray() for pg in tif.pages]), planes)
    return bytes(body)


@pytest.fixture(scope="module", params=[(1, "u1"), (2, "u1"), (2, ">u2"), (1, "<u4")])
def scattered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("scattered")
    tif = folder / "s.tif"
    original = _scattered_tiff(tif, *request.param)
    out = folder / "s.tif.zarr.zip"
    assert pack_file(tif, out).mode == "byte-exact"
    return out, original


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_reads_over_many_regions_are_the_original_bytes(scattered, data) -> None:  # type: ignore[no-untyped-def]
    path, original = scattered
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reader_module, "MANY_PARTS", data.draw(st.sampled_from([2, 64, 10**9])))
        mp.setattr(reader_module, "GATHER_BYTES", data.draw(st.sampled_from([7, 1000, 1 << 18])))
        mp.setattr(reader_module, "GATHER_REGIONS", data.draw(st.sampled_from([3, 50, 16384])))
        mp.setattr(reader_module, "GATHER_PAGES", data.draw(st.sampled_from([0, 1, 64])))
        with DecantArchive.open(path) as archive:
            (info,) = archive.originals()
            reader = archive.open_original(info.relpath, PageCache(8 << 20))
            assert len(reader.regions) > 2 * ROWS  # nothing joined: a region a strip and gap
            for _ in range(5):
                offset = data.draw(st.integers(0, len(original)))
                size = data.draw(st.integers(0, len(original) + 10))
                assert bytes(reader.read(offset, size)) == original[offset : offset + size]
                cached = reader.read_cached(offset, size)
                assert cached is None or bytes(cached) == original[offset : offset + size]
            reader.close()


def test_a_whole_read_of_many_regions_is_gathered(scattered, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    path, original = scattered
    calls = []
    real = reader_module._ranges
    monkeypatch.setattr(reader_module, "_ranges", lambda *a: calls.append(1) or real(*a))
    with DecantArchive.open(path) as archive:
        (info,) = archive.originals()
        reader = archive.open_original(info.relpath, PageCache(8 << 20))
        assert bytes(reader.read(0, len(original))) == original
        reader.close()
    assert calls  # more than MANY_PARTS regions: copied with numpy, not one at a time


def test_read_cached_leaves_a_read_over_many_regions_to_a_thread(scattered) -> None:  # type: ignore[no-untyped-def]
    """Red team 89, F1: copying many regions is CPU work, which read_cached did on the event
    loop; it declines such a read (None) even when everything is cached."""
    path, original = scattered
    with DecantArchive.open(path) as archive:
        (info,) = archive.originals()
        reader = archive.open_original(info.relpath, PageCache(8 << 20))
        assert bytes(reader.read(0, len(original))) == original  # every page cached now
        assert reader.read_cached(0, len(original)) is None
        first = reader.regions[1]  # a strip: one region
        got = reader.read_cached(first.start, first.length)
        assert got is not None and bytes(got) == original[first.start : first.start + first.length]
        reader.close()


def test_a_plane_read_block_by_block_reads_tile_by_tile_over_many_tiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team 89, F2: a read touching more than 64 tiles of a plane too large for the cache
    decoded the whole plane, again for every read. It reads each tile's blocks instead."""
    tif = tmp_path / "tiles.tif"
    plane = np.random.default_rng(89).integers(0, 256, (1024, 1024), np.uint8)
    tifffile.imwrite(tif, plane, tile=(16, 16), photometric="minisblack")
    out = tmp_path / "tiles.tif.zarr.zip"
    assert pack_file(tif, out).mode == "byte-exact"
    original = tif.read_bytes()

    def whole(self, index):  # type: ignore[no-untyped-def]
        raise AssertionError("the whole plane decoded")

    monkeypatch.setattr(reader_module.PixelReader, "_decode_page", whole)
    with DecantArchive.open(out) as archive:
        (info,) = archive.originals()
        reader = archive.open_original(info.relpath, PageCache(2 << 20))  # plane > cache/4
        at = len(original) // 3
        assert bytes(reader.read(at, 1 << 16)) == original[at : at + (1 << 16)]  # 256 tiles
        reader.close()
