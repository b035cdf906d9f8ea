"""Small reads decode only the blosc blocks they need (vfs.decant.partial via the reader): over
the whole corpus (striped and tiled, chunky and planar, edge tiles, big-endian), packed with tiny
blosc blocks so a plane has many, a read of (offset, size) by blocks equals the original bytes
and the whole-plane path, unverified or with the digest map a verified archive is opened with
(block digests check each block read; chunk digests alone, the whole chunk)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numcodecs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vfs import threads as threads_module
from vfs.cache import PageCache
from vfs.decant import partial as partial_module
from vfs.decant import reader as reader_module
from vfs.decant.blosc_blocks import BloscChunkError, block_spans, parse_header
from vfs.decant.digestmap import chunk_digests
from vfs.decant.digests import archive_digests
from vfs.decant.packer import PackOptions, pack_file
from vfs.decant.reader import DecantArchive, OriginalReader
from vfs.decant.writer import CodecChoice
from vfs.errors import CorruptArchiveError

CODECS = ["zstd:byteshuffle", "lz4:bitshuffle", "blosclz:noshuffle", "zlib:byteshuffle:1"]


def _tiny_blocks(choice: CodecChoice) -> numcodecs.Blosc:
    shuffle = {"noshuffle": 0, "byteshuffle": 1, "bitshuffle": 2}[choice.shuffle]
    return numcodecs.Blosc(choice.cname, choice.clevel, shuffle, blocksize=256)


@pytest.fixture(scope="session")
def tiny_block_archives(
    tmp_path_factory: pytest.TempPathFactory, corpus: dict[str, Path]
) -> dict[tuple[str, str], Path]:
    """(corpus name, codec) → its byte-exact archive, blosc blocks of 256 bytes (splitting
    codecs keep 64 KiB blocks), for each codec the packer offers in CODECS."""
    out = tmp_path_factory.mktemp("tiny-blocks")
    archives = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CodecChoice, "codec", _tiny_blocks)
        for codec in CODECS:
            for name, path in corpus.items():
                dest = out / f"{name}.{codec.replace(':', '-')}.zarr.zip"
                options = PackOptions(codec=CodecChoice.parse(codec))
                result = pack_file(path, dest, options)
                if result.mode == "byte-exact":
                    archives[(name, codec)] = result.archive
    return archives


def _reader(archive: DecantArchive, cache: PageCache, partial: bool) -> OriginalReader:
    (info,) = archive.originals()
    reader = archive.open_original(info.relpath, cache)
    reader.partial_limit = 1 << 30 if partial else 0
    return reader


@pytest.fixture
def every_read_partial(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No run of sequential reads switches a reader to whole planes."""
    monkeypatch.setattr(reader_module, "SEQUENTIAL_RUN", 1 << 62)
    yield


def _pixel_spans(reader: OriginalReader) -> list[tuple[int, int, int]]:
    """Each pixel segment (a strip or tile) as (offset, length, page), in file order: from the
    manifest, as the region index joins segments that follow one another."""
    pages = reader.archive.manifest.pages
    segments = (zip(p.dataoffsets, p.databytecounts, [p.index] * len(p.dataoffsets), strict=True)
                for p in pages)  # fmt: skip
    return sorted(s for each in segments for s in each if s[1])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(data=st.data())
def test_partial_reads_equal_the_original_and_the_whole_plane_path(
    data: st.DataObject,
    tiny_block_archives: dict[tuple[str, str], Path],
    corpus: dict[str, Path],
    every_read_partial: None,
) -> None:
    name, codec = data.draw(st.sampled_from(sorted(tiny_block_archives)))
    original = corpus[name].read_bytes()
    path = tiny_block_archives[(name, codec)]
    # As the mount opens it: unverified (no map), verified (chunk and block digests), or
    # verified by an index of before block digests (chunk digests only).
    kind = data.draw(st.sampled_from(["none", "blocks", "chunks only"]))
    recorded = None if kind == "none" else archive_digests(path)
    if kind == "chunks only":
        recorded = chunk_digests(recorded)
    with DecantArchive.open(path, recorded) as archive:
        cache = PageCache(64 << 20)
        partial, whole = _reader(archive, cache, True), _reader(archive, PageCache(0), False)
        spans = _pixel_spans(partial)
        for _ in range(8):
            start, length, page = data.draw(st.sampled_from(spans))
            plane = partial.pages[page].nbytes
            offset = start + data.draw(st.integers(0, length - 1))
            size = data.draw(st.integers(1, max(1, plane // 4)))
            got = bytes(partial.read(offset, size))
            assert got == original[offset : offset + size]
            assert got == bytes(whole.read(offset, size))
            cached = partial.read_cached(offset, size)  # the blocks are cached now
            assert cached is not None and bytes(cached) == got


def test_a_small_read_decodes_blocks_not_the_plane(
    tiny_block_archives: dict[tuple[str, str], Path], corpus: dict[str, Path]
) -> None:
    path = tiny_block_archives[("tiled_planar_rgb_u16_edge.tif", "zstd:byteshuffle")]
    original = corpus["tiled_planar_rgb_u16_edge.tif"].read_bytes()
    with DecantArchive.open(path) as archive:
        cache = PageCache(64 << 20)
        reader = _reader(archive, cache, True)
        start, length, _page = max(_pixel_spans(reader), key=lambda s: s[1])
        offset = start + length // 2
        assert bytes(reader.read(offset, 100)) == original[offset : offset + 100]
        keys: list[Any] = list(cache._data)
        assert not any(k[1] == "p" for k in keys), "the whole plane was decoded"
        assert 0 < sum(k[1] == "bb" for k in keys) < 10  # of the plane's 74 blocks


def test_sequential_reads_switch_to_whole_planes(
    tiny_block_archives: dict[tuple[str, str], Path],
) -> None:
    path = tiny_block_archives[("zstack_u16.tif", "zstd:byteshuffle")]
    with DecantArchive.open(path) as archive:
        cache = PageCache(64 << 20)
        (info,) = archive.originals()
        reader = archive.open_original(info.relpath, cache)
        pos = 0
        while pos < reader.size:
            pos += len(reader.read(pos, 4096))
        assert any(k[1] == "p" for k in cache._data)


@pytest.mark.parametrize("digests", ["none", "chunks only", "blocks"])
@pytest.mark.parametrize("size", [32 << 10, 4 << 20])
def test_planes_larger_than_a_quarter_of_the_cache_are_read_block_by_block(
    tiny_block_archives: dict[tuple[str, str], Path],
    corpus: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    digests: str,
    size: int,
) -> None:
    """A forward reader of planes the cache cannot keep gets the blocks it needs, not a whole
    plane per request: each such plane was decoded again for every read (`sha256sum`'s
    32 KiB reads of 8 MiB planes under `--cache-size 8M`: 106 s for 256 MiB)."""
    name = "zstack_u16.tif"
    path = tiny_block_archives[(name, "zstd:byteshuffle")]
    original = corpus[name].read_bytes()
    decoded: list[int] = []
    whole = reader_module.PixelReader._decode_page

    def counted(self: Any, index: int) -> memoryview:
        decoded.append(index)
        return whole(self, index)

    monkeypatch.setattr(reader_module.PixelReader, "_decode_page", counted)
    recorded = None if digests == "none" else archive_digests(path)
    if digests == "chunks only":
        recorded = chunk_digests(recorded)
    with DecantArchive.open(path, recorded) as archive:
        (info,) = archive.originals()
        plane = archive.open_original(info.relpath, PageCache(0)).pages[0].nbytes
        cache = PageCache(3 * plane)  # a plane is more than a quarter of it
        reader = archive.open_original(info.relpath, cache)
        got, pos = bytearray(), 0
        while pos < reader.size:
            assert not reader.readahead_needed(pos)  # nothing read ahead: it would not stay
            data = reader.read(pos, size)
            got += data
            pos += len(data)
        assert got == original
        assert decoded == [], "whole planes were decoded"
        roomy = archive.open_original(info.relpath, PageCache(64 << 20))
        pos = 0
        while pos < roomy.size:  # the same reads, planes fitting: whole planes, as before
            pos += len(roomy.read(pos, size))
        assert decoded


def _flipped(good: Path, dest: Path, at: int) -> Path:
    """`good` with one byte of chunk 0/0.0.0's stored bytes flipped (the zip's CRC made anew)."""
    from tests.toolbox import load_tool

    def flip(name: str, data: bytes) -> bytes:
        if name != "0/0.0.0":
            return data
        out = bytearray(data)
        out[at] ^= 0xFF
        return bytes(out)

    return load_tool("fuzz").rewrite_zip(good, dest, flip)  # type: ignore[no-any-return]


def _in_file(reader: OriginalReader, pos: int) -> int:
    """The file offset of byte `pos` of page 0's bytes (its strips may lie apart in the file)."""
    for r in reader.regions:
        if r.page == 0 and r.pos <= pos < r.pos + r.length:
            return int(r.start + pos - r.pos)
    raise AssertionError(f"page 0 has no byte {pos}")


@pytest.fixture
def gray(
    tiny_block_archives: dict[tuple[str, str], Path], corpus: dict[str, Path]
) -> tuple[Path, bytes, bytes]:
    """A striped 8-bit archive of 256-byte blocks, its original, and its chunk 0/0.0.0."""
    import zipfile

    good = tiny_block_archives[("striped_chunky_gray_u8.tif", "zstd:byteshuffle")]
    with zipfile.ZipFile(good) as zf:
        raw = zf.read("0/0.0.0")
    return good, corpus["striped_chunky_gray_u8.tif"].read_bytes(), raw


@pytest.mark.parametrize("digests", ["none", "chunks only", "blocks"])
def test_a_damaged_block_is_an_error(
    gray: tuple[Path, bytes, bytes], tmp_path: Path, digests: str, every_read_partial: None
) -> None:
    """A byte flipped inside a block's stream after the map was recorded. With block entries,
    the read of that block fails its check before decoding, naming the block, and a read of
    another block of the same chunk returns the right bytes (its own stream checked). With the
    chunk's digest only (a map recorded before block entries), any read of the chunk fails.
    Without a map, the block fails to decode (or decodes to other bytes the file's sha256
    catches): never a crash, never a read past the entry."""
    good, original, raw = gray
    h = parse_header(raw, len(raw))
    assert h is not None and h.nblocks > 2
    spans = block_spans(h, raw)
    mid = len(raw) // 2
    j = next(k for k, (a, b) in enumerate(spans) if a <= mid < b)
    other = (j + 1) % h.nblocks
    recorded = {"none": None, "chunks only": chunk_digests(archive_digests(good)),
                "blocks": archive_digests(good)}[digests]  # fmt: skip
    bad = _flipped(good, tmp_path / "bad.zarr.zip", mid)
    with DecantArchive.open(bad, recorded) as archive:
        reader = _reader(archive, PageCache(64 << 20), True)
        at, fine = _in_file(reader, j * h.blocksize), _in_file(reader, other * h.blocksize)
        if digests == "blocks":
            with pytest.raises(CorruptArchiveError, match=rf"block {j} does not match its record"):
                reader.read(at, 16)
            assert bytes(reader.read(fine, 16)) == original[fine : fine + 16]
        elif digests == "chunks only":
            for offset in (at, fine):
                with pytest.raises(CorruptArchiveError, match="does not match its recorded xxh3"):
                    reader.read(offset, 16)
        else:
            try:
                reader.read(at, 16)
            except CorruptArchiveError as exc:
                assert "0/0.0.0" in str(exc)


MANY_BLOCKS = ("tiled_planar_rgb_u16_edge.tif", "zstd:byteshuffle")


@pytest.fixture
def decoding_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads that decode blosc blocks for reads, in order."""
    threads: list[str] = []
    real = partial_module.decode_blocks

    def noted(*args: Any, **kwargs: Any) -> bytearray:
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(partial_module, "decode_blocks", noted)
    return threads


def _read_over_blocks(archives: dict[tuple[str, str], Path]) -> tuple[bytes, int]:
    """1500 bytes from the middle of MANY_BLOCKS's longest pixel run, read block by block (its
    blocks are 256 bytes), and their offset."""
    with DecantArchive.open(archives[MANY_BLOCKS]) as archive:
        reader = _reader(archive, PageCache(64 << 20), True)
        start, length, _page = max(_pixel_spans(reader), key=lambda s: s[1])
        at = start + length // 2
        return bytes(reader.read(at, 1500)), at


def test_a_read_over_several_blocks_decodes_some_on_the_helper_and_its_errors_name_the_chunk(
    tiny_block_archives: dict[tuple[str, str], Path],
    corpus: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    decoding_threads: list[str],
    every_read_partial: None,
) -> None:
    """A read over a few blocks decodes half of the others on the shared helper thread while
    the reading thread decodes the rest: the bytes are the original's, and a block that fails
    to decode there is the same CorruptArchiveError naming the chunk as on the reading thread."""
    original = corpus[MANY_BLOCKS[0]].read_bytes()
    got, at = _read_over_blocks(tiny_block_archives)
    assert got == original[at : at + 1500]
    assert len(decoding_threads) > 2
    assert any(name.startswith("decant-blocks") for name in decoding_threads)
    assert any(not name.startswith("decant-blocks") for name in decoding_threads)

    noted = partial_module.decode_blocks

    def broken(*args: Any, **kwargs: Any) -> bytearray:
        if threading.current_thread().name.startswith("decant-blocks"):
            raise BloscChunkError("block 4 does not decode (test)")
        return noted(*args, **kwargs)

    monkeypatch.setattr(partial_module, "decode_blocks", broken)
    with pytest.raises(CorruptArchiveError, match=r"chunk '.+' block 4 does not"):
        _read_over_blocks(tiny_block_archives)


def test_a_read_does_not_wait_behind_another_read_on_the_busy_helper(
    tiny_block_archives: dict[tuple[str, str], Path],
    corpus: dict[str, Path],
    decoding_threads: list[str],
    every_read_partial: None,
) -> None:
    """The helper busy with another read's blocks (held here until the read is done): this read
    decodes all its blocks itself, right, instead of queueing behind (one user's small reads
    must not slow another's)."""
    release = threading.Event()
    busy = threads_module.aside(release.wait, 30.0)
    assert busy is not None
    try:
        got, at = _read_over_blocks(tiny_block_archives)
    finally:
        release.set()
        busy.result()
    assert got == corpus[MANY_BLOCKS[0]].read_bytes()[at : at + 1500]
    assert len(decoding_threads) > 2
    assert not any(name.startswith("decant-blocks") for name in decoding_threads)


@pytest.mark.parametrize("layouts", [False, True], ids=["table-read", "table-recorded"])
def test_a_damaged_block_table_fails_every_read_of_the_chunk(
    gray: tuple[Path, bytes, bytes], tmp_path: Path, every_read_partial: None, layouts: bool
) -> None:
    """A flipped byte in the block table (or the header) would send a block's decode to other
    bytes: with block entries no read of the chunk that reads the table is served, whichever
    block it needs. With layout entries small reads take the table recorded when the archive
    verified, so they serve the right bytes (each block still checked), and a whole read of
    the chunk fails on the chunk's digest."""
    good, original, _raw = gray
    recorded = archive_digests(good)
    assert recorded is not None
    if not layouts:
        recorded = {k: v for k, v in recorded.items() if not k.endswith("/l")}
    for at in (3, 16 + 4 * 1 + 1):  # the typesize; block 1's offset
        bad = _flipped(good, tmp_path / f"bad-{at}.zarr.zip", at)
        with DecantArchive.open(bad, recorded) as archive:
            reader = _reader(archive, PageCache(64 << 20), True)
            at_300 = _in_file(reader, 300)
            if layouts:
                assert bytes(reader.read(at_300, 16)) == original[at_300 : at_300 + 16]
                reader = _reader(archive, PageCache(64 << 20), False)
            with pytest.raises(CorruptArchiveError, match=r"chunk '0/0\.0\.0'"):
                reader.read(at_300, 16)


def test_a_small_read_of_a_verified_archive_reads_its_blocks_not_the_chunk(
    tiny_block_archives: dict[tuple[str, str], Path],
    corpus: dict[str, Path],
    every_read_partial: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With block entries a small read fetches the header, the table and its blocks, not the
    whole stored chunk; with only chunk digests it reads the chunk whole to check it."""
    import zipfile

    from vfs.decant import partial as partial_module
    from vfs.decant import store as store_module

    name = "tiled_planar_rgb_u16_edge.tif"
    good, original = tiny_block_archives[(name, "zstd:byteshuffle")], corpus[name].read_bytes()
    with zipfile.ZipFile(good) as zf:
        stored = {i.filename: i.file_size for i in zf.infolist()}
    fetched: dict[str, int] = {}
    for cls in (store_module.Store, *store_module.Store.__subclasses__()):
        for method in ("get", "get_range"):
            fn = cls.__dict__.get(method)
            if fn is None:
                continue

            def counted(self: Any, key: str, *args: Any, _fn: Any = fn) -> Any:
                out = _fn(self, key, *args)
                if out is not None and store_module.is_chunk_key(key):
                    fetched[key] = fetched.get(key, 0) + len(out)
                return out

            monkeypatch.setattr(cls, method, counted)
    full = archive_digests(good)
    for recorded, whole in ((full, False), (chunk_digests(full), True)):
        fetched.clear()
        with DecantArchive.open(good, recorded) as archive:
            reader = _reader(archive, PageCache(64 << 20), True)
            start, length, _page = max(_pixel_spans(reader), key=lambda s: s[1])
            at = start + length // 2
            assert bytes(reader.read(at, 100)) == original[at : at + 100]
        ((key, n),) = fetched.items()
        if whole:
            assert n == stored[key]
        else:
            assert n <= partial_module._FIRST_READ + 8 * 256 < stored[key], (n, stored[key])


def test_range_reads_stay_inside_the_entry(
    tiny_block_archives: dict[tuple[str, str], Path],
) -> None:
    import zipfile

    from vfs.decant.store import open_store

    path = tiny_block_archives[("zstack_u16.tif", "zstd:byteshuffle")]
    with zipfile.ZipFile(path) as zf:
        want = zf.read("0/0.0.0")
    with open_store(path) as store:
        size = store.entry_size("0/0.0.0")
        assert size == len(want) and store.entry_size("0/9.9.9") is None
        assert store.get_range("0/0.0.0", 3, 10) == want[3:13]
        for start, n in ((size - 1, 2), (-1, 1), (0, size + 1)):
            with pytest.raises(CorruptArchiveError, match="not within entry"):
                store.get_range("0/0.0.0", start, n)


def test_readahead_decodes_the_next_planes_and_asks_for_the_chunk_after(
    packed_corpus: dict[str, Any], corpus: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = packed_corpus["zstack_u16.tif"].archive
    original = corpus["zstack_u16.tif"].read_bytes()
    with DecantArchive.open(path) as archive:
        cache = PageCache(64 << 20)
        (info,) = archive.originals()
        reader = archive.open_original(info.relpath, cache)
        asked: list[str] = []
        monkeypatch.setattr(archive.store, "prefetch", asked.append)
        first = min(p for p in reader.pages)
        start = reader.regions.page_start(first)
        reader.readahead(start, 2)  # inside page 0: pages 1 and 2 decoded, page 3's chunk asked
        reader.readahead_wait()
        decoded = {k[2] for k in cache._data if k[1] == "p"}
        assert decoded == {first + 1, first + 2}
        assert asked == [reader._pixels.chunk_key(reader._chunk_index(reader.pages[first + 3]))]
        reader.readahead(start + 1, 2)  # same place again: nothing new asked
        assert len(asked) == 1
        assert bytes(reader.read(0, reader.size)) == original


def test_a_read_names_the_read_ahead_decode_it_waits_for(
    packed_corpus: dict[str, Any], corpus: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`loading`: the queued decode of a page a read needs, for the mount to await on its
    event loop; None once it is done, and for a page nothing decodes."""
    import threading

    path = packed_corpus["zstack_u16.tif"].archive
    original = corpus["zstack_u16.tif"].read_bytes()
    with DecantArchive.open(path) as archive:
        (info,) = archive.originals()
        reader = archive.open_original(info.relpath, PageCache(64 << 20))
        gate = threading.Event()
        real = reader._decode_page
        monkeypatch.setattr(reader, "_decode_page", lambda p: gate.wait(30) and real(p))
        first = min(reader.pages)
        start, second = reader.regions.page_start(first), reader.regions.page_start(first + 1)
        try:
            assert reader.loading(second, 10) is None  # nothing queued yet
            reader.readahead(start, 1)  # queues page first + 1, held at the gate
            future = reader.loading(second, 10)
            assert future is not None and not future.done()
            assert reader.loading(start, 10) is None  # page `first` is not being decoded
            assert reader.read_cached(second, 10) is None
            gate.set()
            future.result(30)
            assert reader.loading(second, 10) is None
            assert bytes(reader.read_cached(second, 10) or b"") == original[second : second + 10]
        finally:
            gate.set()
            reader.close()


@pytest.mark.parametrize("layouts", [True, False], ids=["layout-recorded", "no-layout"])
def test_a_cold_small_read_of_a_verified_archive_reads_the_file_once(
    tiny_block_archives: dict[tuple[str, str], Path],
    corpus: dict[str, Path],
    every_read_partial: None,
    monkeypatch: pytest.MonkeyPatch,
    layouts: bool,
) -> None:
    """With the layout entries a verified archive's map keeps (each chunk's header and table,
    and where its bytes start in the file), the first small read of a chunk reads the archive
    file once, for its block; without them twice: the entry's local header with the table,
    then the block. Both serve the original's bytes."""
    from vfs.stores.local import LocalFile

    name = "zstack_u16.tif"
    good, original = tiny_block_archives[(name, "zstd:byteshuffle")], corpus[name].read_bytes()
    recorded = archive_digests(good)
    assert recorded is not None and any(k.endswith("/l") for k in recorded)
    if not layouts:
        recorded = {k: v for k, v in recorded.items() if not k.endswith("/l")}
    reads: list[tuple[int, int]] = []
    plain_read = LocalFile.read

    def counted(self: LocalFile, offset: int, size: int) -> bytes:
        reads.append((offset, size))
        return plain_read(self, offset, size)

    with DecantArchive.open(good, recorded) as archive:
        reader = _reader(archive, PageCache(64 << 20), True)
        monkeypatch.setattr(LocalFile, "read", counted)
        for start, length, _page in _pixel_spans(reader)[:3]:
            at = start + length // 2
            before = len(reads)
            assert bytes(reader.read(at, 100)) == original[at : at + 100]
            assert len(reads) - before == (1 if layouts else 2), reads[before:]
