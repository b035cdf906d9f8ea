"""Small reads of an archive in a bucket fetch blosc blocks, not whole chunks: every GET is
counted (a wrapper around the byte source's one GET call), so a regression to whole-chunk
fetches fails here; the bytes served are compared with the original TIFF's at random offsets
and at page and block boundaries."""

from __future__ import annotations

import errno
import itertools
import random
import struct
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numcodecs
import numpy as np
import obstore
import pytest
import tifffile

from tests.s3.conftest import S3Bucket
from vfs.cache import PageCache
from vfs.decant.blosc_blocks import HEADER_SIZE, block_spans, parse_header
from vfs.decant.packer import PackOptions, pack_file
from vfs.decant.reader import DecantArchive, OriginalReader
from vfs.decant.store import is_chunk_key
from vfs.decant.writer import CodecChoice
from vfs.stores import s3 as s3_module
from vfs.stores.s3 import S3Folder, S3Object

PAGES, Y, X = 5, 384, 512  # uint16: 384 KiB planes
BLOCK = 16 * 1024  # blosc block size asked for; the chunk header says what was used
KEY = "stack.tif.zarr.zip"


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A striped uint16 stack (noise on a ramp: compresses, but not to nothing), packed with
    small blosc blocks so each plane holds many."""
    out = tmp_path_factory.mktemp("ranged")
    rng = np.random.default_rng(7)
    ramp = np.arange(Y * X, dtype=np.uint16).reshape(Y, X) // 7
    stack = np.stack([ramp + rng.integers(0, 64, (Y, X), dtype=np.uint16) for _ in range(PAGES)])
    tif = out / "stack.tif"
    tifffile.imwrite(tif, stack, photometric="minisblack")

    def codec(choice: CodecChoice) -> numcodecs.Blosc:
        return numcodecs.Blosc(choice.cname, choice.clevel, 1, blocksize=BLOCK)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CodecChoice, "codec", codec)
        # One blosc thread: with several, c-blosc stores each block's stream where the thread
        # that compressed it got to write, so a chunk's streams may lie out of block order
        # (`scrambled` makes that case on purpose); the GET sizes counted here stay exact.
        mp.setattr(numcodecs.blosc, "use_threads", False)
        result = pack_file(tif, out / KEY, PackOptions())
    assert result.mode == "byte-exact"
    return tif, result.archive


class Gets:
    """Every ranged GET the S3 byte sources make, as (offset, size)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []  # (offset, size, thread)

    def take(self) -> list[tuple[int, int]]:
        calls, self.calls = self.calls, []
        return [(offset, size) for offset, size, _thread in calls]

    def take_mine(self) -> list[tuple[int, int]]:
        """The GETs this thread made (a read's own), leaving out any that a thread still busy
        from an earlier test made meanwhile (seen once under load: two stray pairs)."""
        calls, self.calls = self.calls, []
        me = threading.get_ident()
        return [(offset, size) for offset, size, thread in calls if thread == me]


@pytest.fixture
def gets(monkeypatch: pytest.MonkeyPatch) -> Gets:
    counter = Gets()
    real = S3Object._get

    def counted(self: S3Object, offset: int, size: int) -> bytes:
        counter.calls.append((offset, size, threading.get_ident()))
        return real(self, offset, size)

    monkeypatch.setattr(S3Object, "_get", counted)
    return counter


@pytest.fixture
def archive(s3_bucket: S3Bucket, packed: tuple[Path, Path]) -> Iterator[DecantArchive]:
    folder = S3Folder(s3_bucket.url())
    obstore.put(folder.client, folder.full_key(KEY), packed[1].read_bytes())
    with DecantArchive.open_at(folder, KEY) as opened:
        yield opened
    folder.close()


def _reader(archive: DecantArchive) -> OriginalReader:
    (info,) = archive.originals()
    return archive.open_original(info.relpath, PageCache(64 << 20))


def _pixel_spans(reader: OriginalReader) -> list[tuple[int, int, int]]:
    """Each pixel segment (a strip or tile) as (offset, length, page), in file order: from the
    manifest, as the region index joins segments that follow one another."""
    pages = reader.archive.manifest.pages
    segments = (zip(p.dataoffsets, p.databytecounts, [p.index] * len(p.dataoffsets), strict=True)
                for p in pages)  # fmt: skip
    return sorted(s for each in segments for s in each if s[1])


def _chunk_info(archive: Path) -> tuple[int, int]:
    """(blosc block size, smallest stored chunk size) of array 0's chunks."""
    with zipfile.ZipFile(archive) as zf:
        chunks = [i for i in zf.infolist() if is_chunk_key(i.filename) and i.filename[:2] == "0/"]
        header = zf.read(chunks[0])[:16]
    blocksize = struct.unpack_from("<i", header, 8)[0]
    return blocksize, min(i.file_size for i in chunks)


def test_a_cold_small_read_costs_small_gets_per_chunk(
    archive: DecantArchive, packed: tuple[Path, Path], gets: Gets
) -> None:
    _small_gets_per_chunk(archive, packed, gets)


def test_a_verified_archive_is_read_by_block_too(
    s3_bucket: S3Bucket, packed: tuple[Path, Path], gets: Gets
) -> None:
    """With the digest map the mount records once an original verified, a small read checks
    its block against its own digest, and takes the chunk's header and table (and where its
    bytes start) from the map's layout entry: one GET per chunk first read, never the whole
    chunk; without layout entries (a map recorded before them) the same GETs as unverified,
    the header and table checked against their digest."""
    from vfs.decant.digests import archive_digests

    folder = S3Folder(s3_bucket.url())
    try:
        obstore.put(folder.client, folder.full_key(KEY), packed[1].read_bytes())
        recorded = archive_digests(packed[1])
        assert recorded is not None and any(k.endswith("/l") for k in recorded)
        with DecantArchive.open_at(folder, KEY, recorded) as opened:
            _small_gets_per_chunk(opened, packed, gets, first_gets=1)
        older = {k: v for k, v in recorded.items() if not k.endswith("/l")}
        with DecantArchive.open_at(folder, KEY, older) as opened:
            assert opened.digests is not None and any(k.startswith(".b/") for k in opened.digests)
            _small_gets_per_chunk(opened, packed, gets)
    finally:
        folder.close()


def _small_gets_per_chunk(
    archive: DecantArchive, packed: tuple[Path, Path], gets: Gets, first_gets: int = 2
) -> None:
    original = packed[0].read_bytes()
    blocksize, smallest = _chunk_info(packed[1])
    assert smallest > 4 * blocksize // 2, "planes should hold several compressed blocks"
    reader = _reader(archive)
    gets.take()  # the archive's opening (its tail, the manifest): not what is measured
    for start, length, _page in _pixel_spans(reader):
        offset = start + length // 3
        assert bytes(reader.read(offset, 4096)) == original[offset : offset + 4096]
        first = gets.take()
        # The local header and the block table in one GET (unless the map keeps them), the
        # block (or two adjacent blocks when the read straddles them) in a second: never the
        # chunk.
        assert len(first) == first_gets, first
        assert sum(n for _off, n in first) < smallest // 2, first
        offset = start + 2 * length // 3  # another block of the same chunk: the table is kept
        assert bytes(reader.read(offset, 4096)) == original[offset : offset + 4096]
        second = gets.take()
        assert len(second) == 1 and second[0][1] < smallest // 2, second
        assert bytes(reader.read(offset, 4096)) == original[offset : offset + 4096]
        assert gets.take() == []  # decoded blocks are cached


def test_a_read_over_many_blocks_is_one_get(
    archive: DecantArchive, packed: tuple[Path, Path], gets: Gets, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No read-ahead: a prefetch of the next chunk, when the reader asks for one, would race in
    # as a GET of its own (seen under load in the full suite); this test is about one read.
    monkeypatch.setattr(S3Object, "readahead_bytes", 0)
    original = packed[0].read_bytes()
    blocksize, _smallest = _chunk_info(packed[1])
    reader = _reader(archive)
    start, _length, _page = _pixel_spans(reader)[1]
    offset, size = start + blocksize // 2, 3 * blocksize
    gets.take()
    assert bytes(reader.read(offset, size)) == original[offset : offset + size]
    mine = gets.take_mine()
    # The table, then the four blocks' streams together (stored in order: see `packed`):
    # 2 GETs, where one per block would be 5.
    assert len(mine) == 2, mine
    assert sum(1 for _off, n in mine if n >= 3 * blocksize // 4) <= 1, mine


@pytest.fixture(scope="module")
def scrambled(packed: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`packed` with each chunk of array 0 storing its block streams in reverse order, as
    c-blosc's threads may store them (in the order they finished: `decant pack` compresses with
    several; 4 of 20 such planes came out of order in one try). Same decoded bytes, so the
    same original; rewritten whole (stored entries, the same order) for the new CRCs."""
    out = tmp_path_factory.mktemp("scrambled") / KEY
    with zipfile.ZipFile(packed[1]) as src, zipfile.ZipFile(out, "w") as dst:
        for info in sorted(src.infolist(), key=lambda i: i.header_offset):
            data = src.read(info)
            if is_chunk_key(info.filename) and info.filename[:2] == "0/":
                data = _reversed_streams(data)
            dst.writestr(zipfile.ZipInfo(info.filename, info.date_time), data)
    return out


def _reversed_streams(chunk: bytes) -> bytes:
    h = parse_header(chunk, len(chunk))
    assert h is not None and not h.memcpyed and h.nblocks > 4
    spans = block_spans(h, chunk)
    streams, starts, at = [], [0] * h.nblocks, h.table_end
    for j in reversed(range(h.nblocks)):
        starts[j] = at
        streams.append(chunk[spans[j][0] : spans[j][1]])
        at += len(streams[-1])
    table = struct.pack(f"<{h.nblocks}i", *starts)
    out = chunk[:HEADER_SIZE] + table + b"".join(streams)
    assert len(out) == len(chunk)
    assert numcodecs.Blosc().decode(out) == numcodecs.Blosc().decode(chunk)
    return out


def test_a_read_over_blocks_stored_out_of_order_is_one_get(
    s3_bucket: S3Bucket, packed: tuple[Path, Path], scrambled: Path, gets: Gets,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The blocks a read needs, stored apart or out of order in their chunk (c-blosc threads),
    are read in one range when their streams lie near each other: the table, then one GET for
    the four blocks, where one per block made 5 (6 with the table)."""
    monkeypatch.setattr(S3Object, "readahead_bytes", 0)  # one read's own GETs only
    original = packed[0].read_bytes()
    blocksize, _smallest = _chunk_info(packed[1])
    folder = S3Folder(s3_bucket.url())
    obstore.put(folder.client, folder.full_key(KEY), scrambled.read_bytes())
    with DecantArchive.open_at(folder, KEY) as opened:
        reader = _reader(opened)
        for start, length, _page in _pixel_spans(reader):
            offset, size = start + blocksize // 2, 3 * blocksize
            gets.take()
            assert bytes(reader.read(offset, size)) == original[offset : offset + size]
            mine = gets.take_mine()
            assert len(mine) == 2, mine
            for offset in (start, start + length // 2, start + length - 4096):
                assert bytes(reader.read(offset, 4096)) == original[offset : offset + 4096]
        reader.close()
    folder.close()


def test_small_reads_equal_the_original_at_boundaries_and_random_offsets(
    archive: DecantArchive, packed: tuple[Path, Path], gets: Gets
) -> None:
    original = packed[0].read_bytes()
    blocksize, _smallest = _chunk_info(packed[1])
    reader = _reader(archive)
    spans = _pixel_spans(reader)
    cases: list[tuple[int, int]] = []
    for start, length, _page in spans:
        end = start + length
        cases += [(start, 4096), (end - 4096, 4096), (end - 1, 2), (max(0, start - 100), 200)]
        for k in range(1, length // blocksize, 3):  # around block boundaries
            cases += [(start + k * blocksize - 1, 2), (start + k * blocksize - 4000, 8192)]
    rng = random.Random(3)
    cases += [(rng.randrange(len(original) - 1), rng.choice([1, 17, 4096, 65536]))
              for _ in range(150)]  # fmt: skip
    rng.shuffle(cases)
    for offset, size in cases:
        want = original[offset : offset + size]
        assert bytes(reader.read(offset, size)) == want, (offset, size)
    assert all(n <= 4 * blocksize for _off, n in gets.take()), "a whole chunk was fetched"


def test_read_ahead_keeps_several_gets_in_flight_and_never_fetches_twice(
    archive: DecantArchive, packed: tuple[Path, Path], gets: Gets
) -> None:
    """The reader's read-ahead asks the store for one chunk; a bucket source fetches the chunks
    stored after it too (up to its read-ahead budget), each exactly once (chunks that follow
    each other in the archive in one GET), and a sequential read then takes them instead of
    GETting again."""
    original = packed[0].read_bytes()
    reader = _reader(archive)
    store = archive.store
    chunks = sorted((k for k in store.all_keys() if is_chunk_key(k) and k[:2] == "0/"),
                    key=lambda k: store._entries.get(k).header_offset)  # type: ignore[attr-defined]  # fmt: skip
    gets.take()
    store.prefetch(chunks[0])
    ahead = store.source._ahead  # type: ignore[attr-defined]
    for future in list(ahead.values()):
        future.result()
    entries = [store._entries.get(k) for k in chunks]  # type: ignore[attr-defined]
    first = [store._first_read(e, e.file_size) for e in entries]  # type: ignore[attr-defined]
    # All of them fit the budget here, and they follow each other: one GET of exactly them.
    assert gets.take() == [(first[0][0], sum(n for _off, n in first))]
    pos, parts = 0, []
    while pos < reader.size:
        parts.append(bytes(reader.read(pos, 256 * 1024)))
        pos += len(parts[-1])
    assert b"".join(parts) == original
    again = gets.take()
    assert len(again) <= 2, again  # the husk (TIFF headers) only: no chunk twice


def test_read_ahead_is_bounded_per_connection_and_given_back(
    archive: DecantArchive, monkeypatch: pytest.MonkeyPatch, gets: Gets
) -> None:
    store = archive.store
    chunks = sorted((k for k in store.all_keys() if is_chunk_key(k) and k[:2] == "0/"),
                    key=lambda k: store._entries.get(k).header_offset)  # type: ignore[attr-defined]  # fmt: skip
    source = store.source  # type: ignore[attr-defined]
    conn = source._folder.conn
    biggest = max(store._entries.get(k).compress_size for k in chunks)  # type: ignore[attr-defined]
    monkeypatch.setattr(s3_module, "READAHEAD_TOTAL", biggest + 1024)
    store.prefetch(chunks[0])
    assert len(source._ahead) == 1  # the rest would pass the connection's budget
    for key in chunks:  # taken (or refetched): the budget is given back either way
        assert store.get(key, 1 << 30) is not None
        store.prefetch(key)
    source.close()
    assert conn._held == 0


def test_a_whole_first_read_of_a_bucket_archive_notes_its_digest_map(
    s3_bucket: S3Bucket, packed: tuple[Path, Path]
) -> None:
    """The mount records a verified archive's chunk digests from the reads that verified it:
    for an object, only when the ETag its GETs were pinned to is the one its listing gave. An
    object that is not the version listed is not opened at all (ESTALE: the mount lists the
    folder again); a handle that cannot tell its listing notes nothing."""
    from vfs.backends.decant import DecantBackend
    from vfs.backends.objects import BoundBackend
    from vfs.decant.digests import archive_digests
    from vfs.stores.base import ObjectPath

    folder = S3Folder(s3_bucket.url())
    try:
        obstore.put(folder.client, folder.full_key(KEY), packed[1].read_bytes())
        path = ObjectPath.of_url(f"{s3_bucket.url()}/{KEY}")
        info = folder.stat(KEY)
        assert info is not None and info.etag
        want = archive_digests(packed[1])
        stale = BoundBackend(DecantBackend(PageCache(64 << 20)), folder, lambda p: p.name,
                             (".zarr.zip",))  # fmt: skip
        path.info = replace(info, etag='"other"')
        with pytest.raises(OSError) as raised:
            stale.open(path, "", stale.describe(path).root)
        assert raised.value.errno == errno.ESTALE
        # The digests a verdict records when its reads noted none: of the listed version only.
        with pytest.raises(OSError) as raised:
            stale.chunk_digests(path)
        assert raised.value.errno == errno.ESTALE
        path.info = info
        assert stale.chunk_digests(path) == want
        for listed, noted in ((info, want), (None, None)):
            # A fresh cache each time: the handle must read every chunk itself.
            backend = BoundBackend(DecantBackend(PageCache(64 << 20)), folder,
                                   lambda p: p.name, (".zarr.zip",))  # fmt: skip
            path.info = listed
            handle = backend.open(path, "", backend.describe(path).root)
            try:
                assert handle.seen_digests() is None  # nothing read yet
                assert bytes(handle.read(0, handle.size)) == packed[0].read_bytes()
                assert handle.seen_digests() == noted
            finally:
                handle.close()
    finally:
        folder.close()


def test_a_late_read_ahead_fetches_nothing_the_reader_took(
    s3_bucket: S3Bucket, tmp_path: Path, gets: Gets
) -> None:
    """The mount's read-ahead runs in a thread of its own, from where the reader was when it
    started: on a busy machine the decoders have taken the chunks it then asks for (by their
    data offsets by then: their first reads found them). A cold `dd` of a 512 MiB original
    fetched 278-392 MiB of its 270 MiB archive so. Here the late read-ahead comes after the
    whole file was read: it fetches nothing, and no GET of the read overlaps another."""
    rng = np.random.default_rng(11)
    stack = rng.integers(0, 4096, (16, 128, 512), dtype=np.uint16)  # 128 KiB planes
    tif = tmp_path / "stack.tif"
    tifffile.imwrite(tif, stack, photometric="minisblack")
    packed = pack_file(tif, tmp_path / KEY, PackOptions()).archive
    folder = S3Folder(s3_bucket.url())
    obstore.put(folder.client, folder.full_key(KEY), packed.read_bytes())
    original = tif.read_bytes()
    with DecantArchive.open_at(folder, KEY) as archive:
        reader = _reader(archive)
        gets.take()  # the opening: the tail and the manifest
        pos, parts = 0, []
        while pos < reader.size:  # as the mount: read-ahead after each sequential read
            parts.append(bytes(reader.read(pos, 256 * 1024)))
            pos += len(parts[-1])
            reader.readahead(pos - 1)
            reader.readahead_wait()
        assert b"".join(parts) == original
        _settle(archive.store.source)  # type: ignore[attr-defined]
        read = gets.take()
        reader.readahead(_pixel_spans(reader)[2][0])  # late: from the third page
        _settle(archive.store.source)  # type: ignore[attr-defined]
        late = gets.take()
        reader.close()
    folder.close()
    assert late == []
    ordered = sorted(read)
    overlaps = [(a, b) for a, b in itertools.pairwise(ordered) if sum(a) > b[0]]
    assert overlaps == []
    assert sum(n for _off, n in read) <= packed.stat().st_size


def _settle(source: S3Object) -> None:
    for future in list(source._ahead.values()):
        future.result()
