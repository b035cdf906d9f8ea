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
from vfs.decant.reader import READAHEAD_PLANES, DecantArchive, PixelReader

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
        first = reader.regions.page_start[0]
        assert reader.readahead_needed(first)
        reader.readahead(first)
        assert not reader.readahead_needed(first)  # pages 1 and 2 are in the cache
        second = reader.regions.page_start[1]
        assert reader.readahead_needed(second)  # page 3 is not
        last = reader.regions.page_start[PLANES - 1]
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
