"""Read-ahead of a sequential reader: the next planes decode on other threads, and a request
hands a read-ahead to a thread only when one of them is not decoded or decoding already."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tests.unit.inprocess import InProcessMount
from vfs.cache import PageCache
from vfs.decant.packer import pack_file
from vfs.decant.reader import DROP_BEHIND, READAHEAD_PLANES, DecantArchive, PixelReader

PLANES = 12


@pytest.fixture
def stack(tmp_path: Path) -> tuple[Path, bytes]:
    """(SRC holding a packed 12-plane stack, the original's bytes)."""
    original = tmp_path / "stack.tif"
    rng = np.random.default_rng(3)
    tifffile.imwrite(original, rng.integers(0, 4000, (PLANES, 128, 128), dtype=np.uint16))
    src = tmp_path / "src"
    src.mkdir()
    pack_file(original, src / "stack.tif.zarr.zip")
    return src, original.read_bytes()


def test_readahead_needed_until_the_next_planes_are_decoded(stack: tuple[Path, bytes]) -> None:
    src, data = stack
    with DecantArchive.open(src / "stack.tif.zarr.zip") as archive:
        reader = archive.open_original("", PageCache(64 << 20))
        assert isinstance(reader, PixelReader)
        first = reader.regions.page_start(0)
        assert reader.readahead_needed(first)
        reader.readahead(first)
        assert not reader.readahead_needed(first)  # pages 1 and 2 are in the cache
        second = reader.regions.page_start(1)
        assert reader.readahead_needed(second)  # page 3 is not
        last = reader.regions.page_start(PLANES - 1)
        assert not reader.readahead_needed(last)  # nothing follows the last plane
        assert bytes(reader.read(0, reader.size)) == data


def test_a_sequential_read_hands_a_readahead_to_a_thread_per_plane_not_per_request(
    stack: tuple[Path, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, data = stack
    calls: list[int] = []
    original = PixelReader.readahead

    def counted(self: PixelReader, offset: int, depth: int = READAHEAD_PLANES) -> None:
        calls.append(offset)
        original(self, offset, depth)

    monkeypatch.setattr(PixelReader, "readahead", counted)
    m = InProcessMount(src, tmp_path / "work", read_only=True)

    async def read_all() -> bytes:
        ino = await m.resolve("stack.tif")
        info = await m.ops.open(ino, os.O_RDONLY, m.ctx)
        out, off = [], 0
        try:
            while chunk := bytes(await m.ops.read(info.fh, off, 4096)):
                out.append(chunk)
                off += len(chunk)
        finally:
            await m.ops.release(info.fh)
        return b"".join(out)

    assert m.run(read_all) == data
    requests = len(data) // 4096
    assert 0 < len(calls) <= PLANES, (len(calls), requests)


def stream(reader: PixelReader, upto: int, step: int = 1 << 16) -> bytes:
    """Read [0, upto) in order as the mount does: each request, then a read-ahead after it."""
    out, off = [], 0
    while off < upto:
        out.append(bytes(reader.read(off, min(step, upto - off))))
        off += len(out[-1])
        reader.readahead(off - 1)
        reader.readahead_wait()
    return b"".join(out)


@pytest.mark.parametrize("fits", [True, False], ids=["file-fits", "file-too-large"])
def test_planes_behind_a_forward_reader_are_dropped_when_the_file_does_not_fit(
    stack: tuple[Path, bytes], fits: bool
) -> None:
    src, data = stack
    plane = 128 * 128 * 2
    # Too large: the 12 planes fit in 14 planes' room, but not with the read-ahead window.
    cache = PageCache((PLANES + READAHEAD_PLANES + DROP_BEHIND + 1 if fits else 14) * plane)
    with DecantArchive.open(src / "stack.tif.zarr.zip") as archive:
        reader = archive.open_original("", cache)
        assert isinstance(reader, PixelReader)
        keys = [reader._page_key(p) for p in range(PLANES)]
        middle = reader.regions.page_start(6) + 100  # into plane 6
        assert stream(reader, middle) == data[:middle]
        kept = [k in cache for k in keys]
        if fits:
            assert all(kept[:10])  # planes 0-6 read, 7-9 read ahead: all still cached
        else:
            assert not any(kept[: 6 - DROP_BEHIND]) and all(kept[6 - DROP_BEHIND : 10])
        assert stream(reader, reader.size) == data
        assert bytes(reader.read(0, reader.size)) == data  # dropped planes decode again
        reader.close()


def test_dropped_planes_buffers_decode_the_planes_ahead(tmp_path: Path) -> None:
    """A file larger than the cache, streamed: planes of 1 MiB (BufferPool's minimum) decode into
    the buffers of planes dropped behind, long before the cache is full."""
    original = tmp_path / "big.tif"
    rng = np.random.default_rng(5)
    planes = rng.integers(0, 4000, (16, 512, 1024), dtype=np.uint16)
    tifffile.imwrite(original, planes)
    pack_file(original, tmp_path / "big.tif.zarr.zip")
    cache = PageCache(18 << 20)  # room for 16 planes, not with the read-ahead window
    with DecantArchive.open(tmp_path / "big.tif.zarr.zip") as archive:
        reader = archive.open_original("", cache)
        assert isinstance(reader, PixelReader)
        assert stream(reader, reader.size, 1 << 20) == original.read_bytes()
        reader.close()
    assert cache.stats.evictions == 0  # never full: every reuse came from dropping behind
    assert cache.buffers.reused >= 16 - (READAHEAD_PLANES + DROP_BEHIND + 2) - 1
    assert cache.current_bytes <= (READAHEAD_PLANES + DROP_BEHIND + 1) * (1 << 20) + (1 << 20)
