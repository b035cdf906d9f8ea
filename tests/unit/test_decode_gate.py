"""Decodes in flight, every reader's together, are held within the cache's decode gate (half
its budget): many readers of originals under a small cache once held six planes beside it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile

import vfs.decant.chunks as chunks_module
from vfs.cache import ByteGate, PageCache
from vfs.decant.packer import pack_file
from vfs.decant.reader import DecantArchive, PixelReader

PLANES = 12
PLANE_BYTES = 256 * 256 * 2


def _packed(tmp_path: Path, **write: Any) -> tuple[Path, bytes]:
    original = tmp_path / "stack.tif"
    rng = np.random.default_rng(5)
    tifffile.imwrite(original, rng.integers(0, 4000, (PLANES, 256, 256), dtype=np.uint16), **write)
    archive = tmp_path / "stack.tif.zarr.zip"
    pack_file(original, archive)
    return archive, original.read_bytes()


def _concurrent_decodes(
    archive: Path, data: bytes, cache_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> int:
    """Read every plane of the original on its own thread at once; the most pixel chunks
    decoding at one time (their reads may overlap: only decodes are gated)."""
    lock, now, peak = threading.Lock(), [0], [0]
    real = chunks_module._decode

    def counted(spec: Any, *rest: Any) -> Any:
        pixels = len(spec.shape) > 1  # the husk is one-dimensional, and not gated
        with lock:
            now[0] += pixels
            peak[0] = max(peak[0], now[0])
        try:
            time.sleep(0.02)  # long enough for every thread to be asking at once
            return real(spec, *rest)
        finally:
            with lock:
                now[0] -= pixels

    monkeypatch.setattr(chunks_module, "_decode", counted)
    with DecantArchive.open(archive) as opened:
        reader = opened.open_original("", PageCache(cache_bytes))
        assert isinstance(reader, PixelReader)
        reader.partial_limit = 0  # whole planes, as a large read decodes them
        starts = [reader.regions.page_start(p) for p in range(PLANES)]
        got: dict[int, bytes] = {}

        def read(start: int) -> None:
            got[start] = bytes(reader.read(start, PLANE_BYTES))

        threads = [threading.Thread(target=read, args=(s,)) for s in starts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        reader.close()
    assert all(got[s] == data[s : s + PLANE_BYTES] for s in starts)  # the bytes, right
    return peak[0]


def test_decodes_of_whole_planes_stay_within_half_a_small_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive, data = _packed(tmp_path)
    # A cache of four planes: the gate holds two (stripped uint16, the plane is the chunk).
    assert _concurrent_decodes(archive, data, 4 * PLANE_BYTES, monkeypatch) == 2


def test_a_decode_that_copies_its_plane_out_holds_twice_the_plane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive, data = _packed(tmp_path, tile=(64, 64))  # tiles: the file's bytes are a copy
    assert _concurrent_decodes(archive, data, 4 * PLANE_BYTES, monkeypatch) == 1


def test_the_default_cache_does_not_gate_a_few_planes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive, data = _packed(tmp_path)
    assert _concurrent_decodes(archive, data, 512 << 20, monkeypatch) > 2


def test_a_thread_holding_the_gate_passes_it_again() -> None:
    gate, finished = ByteGate(10), threading.Event()

    def nested() -> None:
        with gate.held(8), gate.held(8):  # 16 > 10: a second hold would wait for the first
            finished.set()

    worker = threading.Thread(target=nested, daemon=True)
    worker.start()
    worker.join(5)
    assert finished.is_set()
    assert gate.used == 0


def test_readahead_queues_no_more_decodes_than_the_gate_has_room_for(tmp_path: Path) -> None:
    """Queued read-ahead decodes would only wait in the gate before the decodes readers need:
    gated, with read-ahead queued regardless, 24 readers under `--cache-size 32M` read about
    half as much as before the gate; with this, more than before."""
    archive, data = _packed(tmp_path)
    with DecantArchive.open(archive) as opened:
        cache = PageCache(4 * PLANE_BYTES)  # a gate of two planes
        reader = opened.open_original("", cache)
        assert isinstance(reader, PixelReader)
        first = reader.regions.page_start(0)
        with cache.decodes.held(2 * PLANE_BYTES):  # a reader's decode fills it
            reader.readahead(first)
            assert reader._queued == {}
        with cache.decodes.held(PLANE_BYTES):  # room for one more
            reader.readahead(first)
        reader.readahead_wait()
        assert [cache.present_or_loading(reader._page_key(p)) for p in (1, 2, 3)] == [
            True,
            False,
            False,
        ]
        assert bytes(reader.read(0, reader.size)) == data
        reader.close()


def test_decodes_waiting_at_the_gate_evict_nothing_from_the_cache(tmp_path: Path) -> None:
    """Red team 54: a decode's room in the cache was taken before it reached the gate, so every
    decode waiting there evicted a plane. Twenty-four readers of a tiled original under a
    32 MiB cache kept it empty, each read decoded its plane again, and the daemon peaked at
    351 MiB (511 before the gate); with the room taken past the gate, at 166-168 MiB."""
    archive, data = _packed(tmp_path)
    with DecantArchive.open(archive) as opened:
        cache = PageCache(4 * PLANE_BYTES)  # a gate of two planes
        reader = opened.open_original("", cache)
        assert isinstance(reader, PixelReader)
        reader.partial_limit = 0
        cache.put("kept-1", memoryview(bytearray(PLANE_BYTES)))
        cache.put("kept-2", memoryview(bytearray(PLANE_BYTES)))
        starts = [reader.regions.page_start(p) for p in range(6)]
        got: dict[int, bytes] = {}
        gate = cache.decodes.held(2 * PLANE_BYTES)
        gate.__enter__()  # the gate is full: the six reads below wait at it
        threads = [
            threading.Thread(target=lambda s=s: got.update({s: bytes(reader.read(s, 4096))}))
            for s in starts
        ]
        for t in threads:
            t.start()
        time.sleep(0.3)
        try:
            assert "kept-1" in cache and "kept-2" in cache  # nothing evicted for them yet
        finally:
            gate.__exit__(None, None, None)
            for t in threads:
                t.join(30)
        assert got == {s: data[s : s + 4096] for s in starts}
        reader.close()
