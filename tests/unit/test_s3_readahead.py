"""S3Object's read-ahead window, without a server: `_get` serves a blob in memory and counts.

The decant store asks for the chunks after the ones being decoded (`prefetch`) while the
reader takes earlier ones (`read`); the window is bounded in bytes. These check that a
sequential reader never fetches a chunk twice when the budget is smaller than the read-ahead
asked for (room is made only behind the reader), that a reader who jumps back gets the room,
and that sizes from the archive beyond the limits are never fetched ahead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from vfs.cache import PageCache
from vfs.stores import s3 as s3_module
from vfs.stores.base import ObjectInfo
from vfs.stores.s3 import S3Folder, S3Object, S3Options

CHUNK = 1000
COUNT = 40
BLOB = bytes(i % 251 for i in range(CHUNK * COUNT))


@pytest.fixture
def obj(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[S3Object, list[tuple[int, int]]]]:
    calls: list[tuple[int, int]] = []

    def fake_get(self: S3Object, offset: int, size: int) -> bytes:
        calls.append((offset, size))
        return BLOB[offset : offset + size]

    monkeypatch.setattr(S3Object, "_get", fake_get)
    folder = S3Folder("s3://bucket", S3Options(endpoint="http://127.0.0.1:9"))  # never reached
    source = S3Object(folder, "blob", ObjectInfo("blob", len(BLOB), 0.0, '"etag"'))
    source.readahead_bytes = 4 * CHUNK
    yield source, calls
    source.close()
    folder.close()


def _settle(source: S3Object) -> None:
    for future in list(source._ahead.values()):
        future.result()


@pytest.mark.parametrize("lead", [1, 3])
def test_a_sequential_reader_fetches_each_chunk_once_past_the_budget(
    obj: tuple[S3Object, list[tuple[int, int]]], lead: int
) -> None:
    """As the decant store does: before chunk i is read, the chunks from i + lead on are asked
    for, more than the budget holds. The old policy made room by dropping the oldest ranges
    ahead, the very next reads, so each became a second GET."""
    source, calls = obj
    out = []
    for i in range(COUNT):
        for j in range(i + lead, min(COUNT, i + lead + 8)):
            source.prefetch(j * CHUNK, CHUNK)
        _settle(source)
        out.append(source.read(i * CHUNK, CHUNK))
    assert b"".join(out) == BLOB
    assert sorted(calls) == [(i * CHUNK, CHUNK) for i in range(COUNT)]  # each exactly once
    assert sum(n for _o, n in source._ahead) <= source.readahead_bytes


def test_a_reader_that_jumps_back_gets_the_room(
    obj: tuple[S3Object, list[tuple[int, int]]],
) -> None:
    source, calls = obj
    source.read(20 * CHUNK, CHUNK)
    for j in range(21, 25):
        source.prefetch(j * CHUNK, CHUNK)
    _settle(source)
    source.read(0, CHUNK)  # back to the start: ranges 21-24 are now far ahead of the reader
    source.prefetch(CHUNK, CHUNK)
    assert (CHUNK, CHUNK) in source._ahead
    assert len(source._ahead) == 4  # one far range gave way, the farthest
    assert (24 * CHUNK, CHUNK) not in source._ahead
    _settle(source)
    calls.clear()
    assert source.read(CHUNK, CHUNK) == BLOB[CHUNK : 2 * CHUNK]
    assert calls == []


def test_ranges_beyond_the_limits_are_never_fetched_ahead(
    obj: tuple[S3Object, list[tuple[int, int]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk size comes from the archive: a huge one, one past the end, or a negative one
    is not prefetched (the read that needs it fails or fetches it then)."""
    source, calls = obj
    source.readahead_bytes = 1 << 40
    monkeypatch.setattr(s3_module, "PREFETCH_MAX", 2 * CHUNK)
    for offset, size in [(0, 3 * CHUNK), (len(BLOB) - CHUNK, 2 * CHUNK), (-1, CHUNK),
                         (0, 0), (0, -5)]:  # fmt: skip
        source.prefetch(offset, size)
    monkeypatch.setattr(s3_module, "READAHEAD_TOTAL", CHUNK)  # the connection's budget
    source.prefetch(0, CHUNK)
    source.prefetch(CHUNK, CHUNK)
    _settle(source)
    assert list(source._ahead) == [(0, CHUNK)]
    assert calls == [(0, CHUNK)]
    source.close()
    assert source._folder.conn._held == 0


def test_read_ahead_counts_against_the_page_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the mount's page cache as the budget, prefetched bytes are at most a quarter of it,
    lent by it while held (cached pages make room), and given back when taken or dropped."""
    monkeypatch.setattr(S3Object, "_get", lambda self, off, n: BLOB[off : off + n])
    cache = PageCache(8 * CHUNK)
    for i in range(8):
        cache.put(("page", i), bytes(CHUNK))
    folder = S3Folder("s3://bucket", S3Options(endpoint="http://127.0.0.1:9"), budget=cache)
    source = S3Object(folder, "blob", ObjectInfo("blob", len(BLOB), 0.0, '"etag"'))
    source.readahead_bytes = 10 * CHUNK
    for j in range(1, 6):
        source.prefetch(j * CHUNK, CHUNK)
    assert sorted(source._ahead) == [(CHUNK, CHUNK), (2 * CHUNK, CHUNK)]  # 8 // BUDGET_SHARE
    assert cache._reserved == 2 * CHUNK
    assert cache.current_bytes + cache._reserved <= cache.max_bytes  # two pages gave way
    assert source.read(CHUNK, CHUNK) == BLOB[CHUNK : 2 * CHUNK]
    assert cache._reserved == CHUNK
    source.close()
    assert cache._reserved == 0 and folder.conn._held == 0
    folder.close()


def test_ranges_that_follow_each_other_go_out_as_one_get_each_read_alone(
    obj: tuple[S3Object, list[tuple[int, int]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of adjacent chunks (a zip's entries, in order) is fetched in GETs of up to
    GET_SPAN bytes, not one per chunk (a GET costs the server CPU of its own); a range past a
    larger gap starts a GET of its own. Each chunk is then read alone, the right bytes, with
    no GET more, and the span's budget is given back once every chunk of it was taken."""
    source, calls = obj
    source.readahead_bytes = 1 << 30
    monkeypatch.setattr(s3_module, "GET_SPAN", 4 * CHUNK)
    far = 30 * CHUNK + s3_module.SPAN_GAP + 1  # past the gap a span may skip
    run = [(i * CHUNK, CHUNK) for i in range(10)] + [(far, 100)]
    source.prefetch_run(list(reversed(run)))  # any order
    _settle(source)
    assert sorted(calls) == [(0, 4 * CHUNK), (4 * CHUNK, 4 * CHUNK), (8 * CHUNK, 2 * CHUNK),
                             (far, 100)]  # fmt: skip
    calls.clear()
    source.prefetch_run(run)  # asked again (the next chunk's read-ahead): nothing new
    for offset, size in run[:5]:
        assert source.read(offset, size) == BLOB[offset : offset + size]
    assert sorted(source._ahead) == [(4 * CHUNK, 4 * CHUNK), (8 * CHUNK, 2 * CHUNK), (far, 100)]
    assert source._folder.conn._held == 6 * CHUNK + 100  # the first span given back, whole
    for offset, size in run[5:]:
        assert bytes(source.read_buffer(offset, size)) == BLOB[offset : offset + size]
    assert calls == []
    assert source._ahead == {} and source._folder.conn._held == 0


def test_a_span_is_cut_to_the_room_left(obj: tuple[S3Object, list[tuple[int, int]]]) -> None:
    """The budget bounds the spans too: what does not fit is not fetched ahead."""
    source, calls = obj
    source.readahead_bytes = 3 * CHUNK + CHUNK // 2
    source.prefetch_run([(i * CHUNK, CHUNK) for i in range(8)])
    _settle(source)
    assert calls == [(0, 3 * CHUNK)]
    assert source._folder.conn._held == 3 * CHUNK


def test_with_a_disk_cache_each_range_is_a_get_and_an_entry_of_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A span's bounds depend on the budget left when it was asked for: cached whole, it would
    not serve the next reader (another mount, a restart), whose spans differ. So with
    --disk-cache the ranges are fetched (and kept) one by one, and serve again from disk."""
    calls: list[tuple[int, int]] = []

    def fake_get(self: S3Object, offset: int, size: int) -> bytes:
        calls.append((offset, size))
        return BLOB[offset : offset + size]

    monkeypatch.setattr(S3Object, "_get", fake_get)
    options = S3Options(endpoint="http://127.0.0.1:9", disk_cache=tmp_path / "cache")
    run = [(i * CHUNK, CHUNK) for i in range(4)]
    for _host in range(2):
        folder = S3Folder("s3://bucket", options)
        source = S3Object(folder, "blob", ObjectInfo("blob", len(BLOB), 0.0, '"etag"'))
        source.prefetch_run(run)
        _settle(source)
        assert [source.read(off, n) for off, n in run] == [BLOB[o : o + n] for o, n in run]
        source.close()
        folder.close()
    assert sorted(calls) == run  # the first fetched each once; the second read them from disk


def test_a_span_behind_the_reader_and_after_the_run_gives_its_room_back_once(
    obj: tuple[S3Object, list[tuple[int, int]]],
) -> None:
    """Room for a run is made from spans the reader left behind and from spans past the run:
    a span that is both was counted twice, and the run took the budget and that much more."""
    source, _calls = obj
    source.prefetch(10 * CHUNK, CHUNK)
    source.read(20 * CHUNK, CHUNK)  # the reader passed it: behind, and after what comes next
    source.prefetch_run([(i * CHUNK, CHUNK) for i in range(5)])
    _settle(source)
    assert sorted(source._ahead) == [(0, 4 * CHUNK)]
    assert sum(n for _o, n in source._ahead) <= source.readahead_bytes
    assert source._folder.conn._held == 4 * CHUNK
