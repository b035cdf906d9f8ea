"""Segment maths and SegmentReader: reads equal slices of the plaintext, decrypting only what
they touch. The session key and header length come from the crypt4gh library, not from vfs."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from crypt4gh import header as c4gh_header
from crypt4gh import sodium
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.toolbox import load_tool
from vfs.c4gh import segments
from vfs.c4gh.buffers import BufferPool
from vfs.c4gh.segments import (
    MAX_SPAN_PAGES,
    PAGE_SEGMENTS,
    PAGE_SIZE,
    SegmentBuffers,
    SegmentReader,
    cipher_offset,
    plaintext_capacity,
)
from vfs.cache import PageCache
from vfs.errors import CorruptArchiveError
from vfs.stores import local
from vfs.stores.direct import DIRECT_ALIGN

SEG = 65536


corpus = load_tool("make_c4gh_corpus")
PLAIN = os.urandom(5 * SEG + 12345)  # five full segments and a short sixth


def expected_segments(offset: int, size: int, total: int) -> set[int]:
    end = min(offset + size, total)
    return set(range(offset // SEG, (end - 1) // SEG + 1)) if offset < end else set()


def encrypted_body(d: Path, plain: bytes, name: str) -> SimpleNamespace:
    """`plain` encrypted to a new node key as the crypt4gh file `d/name`: its path, bytes,
    header length and session key (what a SegmentReader needs)."""
    node, writer = corpus.make_keypair(d, "node"), corpus.make_keypair(d, "writer")
    data = corpus.encrypt(plain, writer.secret, [node.public])
    stream = io.BytesIO(data)
    session_keys, _ = c4gh_header.deconstruct(stream, [(0, node.secret, None)])
    path = d / name
    path.write_bytes(data)
    return SimpleNamespace(path=path, data=data, hlen=stream.tell(), key=bytes(session_keys[0]))


@pytest.fixture(scope="module")
def pkg(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    return encrypted_body(tmp_path_factory.mktemp("seg"), PLAIN, "body.tar.c4gh")


def reader(pkg: SimpleNamespace, path: Path | None = None, size: int | None = None):
    return SegmentReader(path or pkg.path, pkg.hlen, pkg.key, PageCache(64 * SEG), file_size=size)


def test_segment_maths_matches_the_cipher_text(pkg) -> None:
    assert plaintext_capacity(pkg.hlen, len(pkg.data)) == len(PLAIN)
    for n in range(6):
        start = cipher_offset(pkg.hlen, n)
        assert start == pkg.hlen + n * 65564
        cipher = pkg.data[start : start + 65564]
        out = bytearray(SEG)
        length = sodium.chacha20poly1305_decrypt(out, cipher, pkg.key)
        assert bytes(out[:length]) == PLAIN[n * SEG : (n + 1) * SEG]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    offset=st.integers(0, len(PLAIN) + SEG),
    size=st.one_of(st.integers(0, 3 * SEG), st.sampled_from([1, 4096, SEG - 1, SEG, SEG + 1])),
)
def test_read_is_a_slice_and_decrypts_only_touched_segments(pkg, offset: int, size: int) -> None:
    with reader(pkg) as rd:
        assert rd.read(offset, size) == PLAIN[offset : offset + size]
        touched = expected_segments(offset, size, len(PLAIN))
        assert rd.stats.decrypted == len(touched)
        assert rd.read(offset, size) == PLAIN[offset : offset + size]
        assert rd.stats.decrypted == len(touched)  # the second read is served from the cache


def test_cache_keys_and_shared_counter(pkg) -> None:
    cache = PageCache(64 * SEG)
    first = SegmentReader(pkg.path, pkg.hlen, pkg.key, cache)
    second = SegmentReader(pkg.path, pkg.hlen, pkg.key, cache, stats=first.stats)
    first.read(SEG + 5, 10)
    assert first.cache_key(0) in cache  # segment 1 lives in page 0
    assert first.cache_key(0)[:2] == ("c4gh", str(pkg.path))
    second.read(SEG + 100, 10)
    assert first.stats.decrypted == 1
    other = SegmentReader(pkg.path, pkg.hlen, bytes(32), cache)  # another package's session
    assert other.cache_key(0) != first.cache_key(0)
    first.close()
    second.close()
    other.close()


def test_prefetch_warms_what_later_reads_need(pkg) -> None:
    with reader(pkg) as rd:
        rd.prefetch(1, 3)
        assert rd.stats.decrypted == 3
        assert rd.read(SEG, 3 * SEG) == PLAIN[SEG : 4 * SEG]
        assert rd.stats.decrypted == 3
        rd.prefetch(5, 10)  # clipped at the last segment
        assert rd.stats.decrypted == 4


def test_tampered_segment_fails_alone(pkg, tmp_path: Path) -> None:
    bad = tmp_path / "tampered.tar.c4gh"
    bad.write_bytes(corpus.tamper(pkg.data, 2))
    with reader(pkg, bad) as rd:
        with pytest.raises(CorruptArchiveError, match=r"tampered\.tar\.c4gh: segment 2 fails"):
            rd.read(2 * SEG + 10, 5)
        with pytest.raises(CorruptArchiveError, match="segment 2"):
            rd.read(2 * SEG - 5, 10)  # a read spanning into it fails, never returns garbage
        for start in (0, SEG, 3 * SEG, 5 * SEG):
            assert rd.read(start, 100) == PLAIN[start : start + 100]
        assert rd.verified_end() == len(PLAIN)


def test_truncated_body(pkg, tmp_path: Path) -> None:
    cut = tmp_path / "cut.tar.c4gh"
    cut.write_bytes(pkg.data[: cipher_offset(pkg.hlen, 3) + 1000])
    with reader(pkg, cut) as rd:
        assert rd.size == 3 * SEG + 1000 - 28
        assert rd.read(3 * SEG - 10, 10) == PLAIN[3 * SEG - 10 : 3 * SEG]
        with pytest.raises(CorruptArchiveError, match="segment 3"):
            rd.read(3 * SEG, 10)
        assert rd.verified_end() == 3 * SEG
        assert rd.read(rd.size + 5, 10) == b""


# -- pages of segments: a read's span from one pread, cached 16 segments to a page -----------

BIG = os.urandom(2 * PAGE_SIZE + 7 * SEG + 777)  # two full pages, a partial third


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    return encrypted_body(tmp_path_factory.mktemp("pages"), BIG, "big.tar.c4gh")


def big_reader(
    big: SimpleNamespace, path: Path | None = None, buffers: SegmentBuffers | None = None
) -> SegmentReader:
    cache = PageCache(64 * PAGE_SIZE)
    return SegmentReader(path or big.path, big.hlen, big.key, cache, buffers=buffers)


boundaries = st.sampled_from(
    [0, SEG, PAGE_SIZE, 2 * PAGE_SIZE, len(BIG), PAGE_SIZE - 1, PAGE_SIZE + 1, 3 * SEG + 5]
)


@settings(max_examples=120, deadline=None)
@given(
    offset=st.one_of(st.integers(0, len(BIG) + SEG), boundaries),
    size=st.one_of(
        st.integers(0, 3 * PAGE_SIZE),
        st.sampled_from([1, 4096, SEG, PAGE_SIZE - 1, PAGE_SIZE, PAGE_SIZE + 1]),
    ),
    recycle=st.booleans(),
    data=st.data(),
)
def test_reads_across_pages_are_slices_and_decrypt_only_touched(
    big, offset, size, recycle, data
) -> None:
    pool = BufferPool(PAGE_SIZE)
    with big_reader(big, buffers=SegmentBuffers(64 * PAGE_SIZE) if recycle else None) as rd:
        warm = data.draw(st.integers(0, len(BIG)), label="a read before")
        rd.read(warm, SEG)
        before = rd.stats.decrypted
        touched = expected_segments(offset, size, len(BIG)) - expected_segments(warm, SEG, len(BIG))
        want = BIG[offset : offset + size]
        assert rd.read_view(offset, size, pool) == want
        assert rd.stats.decrypted - before == len(touched)
        assert rd.read(offset, size) == want
        assert rd.read_cached(offset, size, pool) in (None, want)
        if size <= MAX_SPAN_PAGES * PAGE_SIZE:
            assert rd.read_cached(offset, size, pool) == want
        assert rd.stats.decrypted - before == len(touched)


def evicted(path: Path) -> bool:
    """Drop the file's pages from the kernel's cache; True if a non-blocking read now fails."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        try:
            os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT)
        except BlockingIOError:
            return True
        return False
    finally:
        os.close(fd)


def test_read_cached_decrypts_only_small_spans_and_never_waits(big, tmp_path: Path) -> None:
    with big_reader(big) as rd:
        assert rd.read_cached(PAGE_SIZE - 10, 2 * SEG) is None  # three segments: a thread's job
        assert rd.stats.decrypted == 0
        rd.read(PAGE_SIZE - 10, 5)  # segment 15
        assert rd.read_cached(PAGE_SIZE - 10, 5) == BIG[PAGE_SIZE - 10 : PAGE_SIZE - 5]
        assert rd.stats.decrypted == 1
        # Segment 16 is missing, its cipher text in the page cache: decrypted here, no thread.
        # A blocking read puts it there first, and waits for any read-ahead of it still in
        # flight (a non-blocking read of a page under I/O gets EAGAIN: None here, once, in a
        # loaded full run).
        big.path.read_bytes()
        assert rd.read_cached(PAGE_SIZE - 10, 20) == BIG[PAGE_SIZE - 10 : PAGE_SIZE + 10]
        assert rd.stats.decrypted == 2
        page = rd._page(2)
        with page.lock:  # another thread is loading page 2: no waiting for it
            assert rd.read_cached(2 * PAGE_SIZE + 5, 10) is None
        assert rd.read_cached(len(BIG), 10) == b""
        assert rd.stats.decrypted == 2
    copy = tmp_path / "copy.tar.c4gh"
    copy.write_bytes(big.data)
    if not evicted(copy):
        pytest.skip("the kernel kept the file's pages; the disk case cannot be set up here")
    with big_reader(big, copy) as rd:
        assert rd.read_cached(5 * SEG + 1, 10) is None  # on disk: no waiting on the event loop
        assert rd.stats.decrypted == 0
        assert rd.read(5 * SEG + 1, 10) == BIG[5 * SEG + 1 : 5 * SEG + 11]


def test_tampered_segment_is_never_decrypted_inline(big, tmp_path: Path) -> None:
    bad = tmp_path / "tampered.tar.c4gh"
    bad.write_bytes(corpus.tamper(big.data, 3))
    with big_reader(big, bad) as rd:
        assert rd.read_cached(3 * SEG + 5, 10) is None  # the worker thread's read reports it
        with pytest.raises(CorruptArchiveError, match="segment 3 fails"):
            rd.read(3 * SEG + 5, 10)
        assert rd.read_cached(4 * SEG + 5, 10) == BIG[4 * SEG + 5 : 4 * SEG + 15]


def test_prefetch_fills_pages_and_one_pread_serves_a_span(big, monkeypatch) -> None:
    calls: list[int] = []
    real = os.preadv

    def counting(fd: int, buffers: list, offset: int) -> int:
        calls.append(offset)
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", counting)
    with big_reader(big) as rd:
        n = PAGE_SEGMENTS
        rd.read(SEG + 3, PAGE_SIZE)  # segments 1..n+1, across two pages: one pread
        # (an O_DIRECT one where the file system allows it: from the block before)
        assert len(calls) == 1 and rd.stats.decrypted == n + 1
        assert 0 <= cipher_offset(big.hlen, 1) - calls[0] < DIRECT_ALIGN
        rd.prefetch(n, 2 * n)  # to the end; n and n+1 are there already
        assert rd.stats.decrypted == rd.segments - 1  # all but segment 0
        assert len(calls) == 3  # a pread a page: the rest of page 1, then page 2
        assert rd.read_cached(0, len(BIG)) is None  # too large for the event loop
        assert rd.read(0, len(BIG)) == BIG
        assert rd.stats.decrypted == rd.segments  # segment 0 came last, through the read


def test_tampered_segment_inside_a_page_fails_alone(big, tmp_path: Path) -> None:
    bad = tmp_path / "tampered.tar.c4gh"
    n = PAGE_SEGMENTS
    b = n + 4  # page 1, slot 4
    bad.write_bytes(corpus.tamper(big.data, b))
    with big_reader(big, bad, SegmentBuffers(PAGE_SIZE)) as rd:
        rd.prefetch(n, n)  # read-ahead over it does not raise
        assert rd.stats.decrypted == n - 1
        with pytest.raises(CorruptArchiveError, match=rf"tampered\.tar\.c4gh: segment {b} fails"):
            rd.read(PAGE_SIZE, PAGE_SIZE)  # the whole page, the bad segment in the middle
        with pytest.raises(CorruptArchiveError, match=f"segment {b}"):
            rd.read(b * SEG - 1, 2)  # one byte of it is enough
        assert rd.read_cached((b - 1) * SEG, 2 * SEG) is None  # never garbage, nor partial
        for start in (n * SEG, (b - 1) * SEG, (b + 1) * SEG, 0, 2 * PAGE_SIZE):
            assert rd.read(start, SEG) == BIG[start : start + SEG]
        assert rd.read((b - 1) * SEG, SEG) == BIG[(b - 1) * SEG : b * SEG]


def test_file_cut_after_it_was_measured(big, tmp_path: Path) -> None:
    cut = tmp_path / "cut.tar.c4gh"
    cut.write_bytes(big.data[: cipher_offset(big.hlen, 20) + 100])
    rd = SegmentReader(cut, big.hlen, big.key, PageCache(PAGE_SIZE), file_size=len(big.data))
    with rd:
        assert rd.read(19 * SEG, SEG) == BIG[19 * SEG : 20 * SEG]
        with pytest.raises(CorruptArchiveError, match="segment 20 is cut short on disk"):
            rd.read(19 * SEG, 2 * SEG)
        with pytest.raises(CorruptArchiveError, match="segment 20 is cut short on disk"):
            rd.read(10 * SEG, 20 * SEG)  # a large load (O_DIRECT where allowed) as well
        assert rd.read(2 * SEG, 8 * SEG) == BIG[2 * SEG : 10 * SEG]


def test_pool_never_hands_out_a_buffer_in_use(big) -> None:
    pool = BufferPool(size=PAGE_SIZE, limit=2)
    with big_reader(big) as rd:
        first = rd.read_view(100, PAGE_SIZE, pool)
        assert isinstance(first, memoryview) and first == BIG[100 : 100 + PAGE_SIZE]
        second = rd.read_view(SEG + 100, PAGE_SIZE, pool)
        third = rd.read_view(2 * SEG + 100, PAGE_SIZE, pool)  # both pooled buffers are held
        assert isinstance(third, bytes)
        assert first == BIG[100 : 100 + PAGE_SIZE]  # not overwritten by the later reads
        assert second == BIG[SEG + 100 : SEG + 100 + PAGE_SIZE]
        held = first[10:20]  # a slice of a view holds the buffer as well
        del first
        fourth = rd.read_view(3 * SEG + 100, PAGE_SIZE, pool)
        assert isinstance(fourth, bytes)
        assert held == BIG[110:120]
        del held
        fifth = rd.read_view(4 * SEG + 100, PAGE_SIZE, pool)
        assert (
            isinstance(fifth, memoryview)
            and fifth == BIG[4 * SEG + 100 : 4 * SEG + 100 + PAGE_SIZE]
        )
        assert second == BIG[SEG + 100 : SEG + 100 + PAGE_SIZE]
        one = rd.read_view(5 * SEG + 1, 100, pool)  # inside one segment: a view of the cache
        assert isinstance(one, memoryview) and one == BIG[5 * SEG + 1 : 5 * SEG + 101]


def test_segment_buffers_are_recycled_only_once_nothing_holds_them(big) -> None:
    buffers = SegmentBuffers(2 * PAGE_SIZE)  # as many as a two-page cache holds, and a margin
    cache = PageCache(2 * PAGE_SIZE)
    held = []
    with SegmentReader(big.path, big.hlen, big.key, cache, buffers=buffers) as rd:
        for round_no in range(3):
            for pos in range(0, len(BIG), SEG // 2):
                view = rd.read_view(
                    pos, SEG // 2, BufferPool(PAGE_SIZE)
                )  # one segment: a view of it
                assert view == BIG[pos : pos + SEG // 2]
                if round_no == 0 and pos % (2 * PAGE_SIZE) == 0:
                    held.append((pos, view))  # outlives its page in the cache
        for pos, view in held:
            assert view == BIG[pos : pos + SEG // 2]  # its buffer was never handed out again
        assert rd.read(0, len(BIG)) == BIG
        assert len(buffers) <= buffers.limit
        assert rd.stats.decrypted > rd.segments  # pages were evicted and decrypted again
        assert len(buffers) < rd.stats.decrypted  # so buffers were handed out again


# -- large loads past the page cache (O_DIRECT) ----------------------------------------------


def test_large_loads_read_the_opened_file_even_after_its_path_is_replaced(
    big, tmp_path: Path
) -> None:
    """The O_DIRECT descriptor is reopened from the reader's own descriptor (its LocalFile's),
    never the path: a package renamed over it after opening is not what a later large load
    decrypts."""
    path = tmp_path / "swapped.tar.c4gh"
    path.write_bytes(big.data)
    other = tmp_path / "other.tar.c4gh"
    other.write_bytes(corpus.tamper(big.data, 20))  # same size and header, one bad segment
    with big_reader(big, path) as rd:
        assert rd.read(0, 10) == BIG[:10]  # opens the descriptor
        os.replace(other, path)
        assert rd.read(PAGE_SIZE, PAGE_SIZE) == BIG[PAGE_SIZE : 2 * PAGE_SIZE]  # segment 20 too
        file = rd._file
        assert file is not None
        if file._direct is not None:  # the file system took O_DIRECT
            assert os.fstat(file._direct).st_ino == os.fstat(file.fileno()).st_ino
    assert file._direct is None and file.fileno() == -1 and rd._file is None  # both closed


def test_o_direct_refused_falls_back_to_the_page_cache(big, monkeypatch) -> None:
    monkeypatch.setattr(local, "open_direct", lambda fd: None)
    with big_reader(big) as rd:
        assert rd.read(SEG + 3, PAGE_SIZE) == BIG[SEG + 3 : SEG + 3 + PAGE_SIZE]
        assert not rd._direct_ok  # decided once: later loads go straight to the page cache
        rd.prefetch(0, 4)
        assert rd._advised == (4, 8)  # and the disk is asked to read ahead again
        assert rd.read(0, len(BIG)) == BIG


def test_direct_read_errors_other_than_einval_are_not_swallowed(big, monkeypatch) -> None:
    def failing(*args: object) -> memoryview:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(local, "pread_direct", failing)
    with big_reader(big) as rd:
        if not rd._direct_ok:
            pytest.skip("no O_DIRECT on this platform")
        with pytest.raises(OSError) as info:
            rd.read(0, PAGE_SIZE)
        assert info.value.errno == errno.EIO
        assert rd.read(5, 10) == BIG[5:15]  # a small load reads through the page cache


# -- whole pages decrypted into one buffer; the two ciphers -----------------------------------


def library_plaintext(big: SimpleNamespace, n: int) -> bytes:
    """Segment n decrypted on its own by the crypt4gh library (independent of SegmentReader)."""
    start = cipher_offset(big.hlen, n)
    cipher = big.data[start : start + 65564]
    out = bytearray(SEG)
    return bytes(out[: sodium.chacha20poly1305_decrypt(out, cipher, big.key)])


@settings(max_examples=100, deadline=None)
@given(
    loaded=st.lists(st.integers(0, 2), max_size=3),
    released=st.lists(st.integers(0, 2), max_size=2),
    small=st.lists(st.integers(0, len(BIG)), max_size=3),
    offset=st.one_of(st.integers(0, len(BIG) + SEG), boundaries),
    size=st.one_of(st.integers(0, 2 * PAGE_SIZE), st.sampled_from([1, SEG, 1 << 20])),
)
def test_whole_page_loads_serve_what_segment_by_segment_decryption_gives(
    big, loaded, released, small, offset, size
) -> None:
    """Pages loaded whole (read-ahead), given back, and partly filled by small reads before, in
    any order: every read equals the library's own segment-by-segment decryption, and a read
    inside a page loaded whole is a view of that page's buffer."""
    segments_total = -(-len(BIG) // SEG)
    expect = b"".join(library_plaintext(big, n) for n in range(segments_total))
    assert expect == BIG
    pool = BufferPool(2 * PAGE_SIZE)
    with big_reader(big, buffers=SegmentBuffers(64 * PAGE_SIZE)) as rd:
        for pos in small:
            rd.read(pos, 10)  # a segment or two decrypted on its own, before any page load
        for page in loaded:
            rd.load_span((page * PAGE_SEGMENTS, min((page + 1) * PAGE_SEGMENTS, rd.segments)))
        for page in released:
            rd.release(page, page + 1)
        want = expect[offset : offset + size]
        view = rd.read_view(offset, size, pool)
        assert view == want
        assert rd.read(offset, size) == want
        if size <= MAX_SPAN_PAGES * PAGE_SIZE:
            assert rd.read_cached(offset, size, pool) == want
        page = offset // PAGE_SIZE
        touched = {p // PAGE_SIZE for q in small if q < len(BIG) for p in (q, q + 9)}
        whole = page in loaded and page not in released and page not in touched
        end = min(offset + size, len(BIG))
        if whole and offset < end and (end - 1) // PAGE_SIZE == page:
            assert isinstance(view, memoryview) and len(view.obj) == PAGE_SIZE


@pytest.mark.parametrize("page", [0, 1, 2])
def test_read_inside_a_page_loaded_whole_is_a_view_of_its_buffer(big, page) -> None:
    with big_reader(big, buffers=SegmentBuffers(64 * PAGE_SIZE)) as rd:
        stop = min((page + 1) * PAGE_SEGMENTS, rd.segments)
        rd.load_span((page * PAGE_SEGMENTS, stop))
        before = rd.stats.decrypted
        start = page * PAGE_SIZE + 1000
        size = min(PAGE_SIZE - 2000, len(BIG) - start)
        view = rd.read_cached(start, size)
        assert isinstance(view, memoryview) and len(view.obj) == PAGE_SIZE
        assert view == BIG[start : start + size]
        assert rd.read_view(start, size, BufferPool(PAGE_SIZE)).obj is view.obj
        assert rd.stats.decrypted == before  # nothing decrypted again


def test_page_buffer_is_never_handed_out_while_a_view_of_it_is_held(big) -> None:
    buffers = SegmentBuffers(PAGE_SIZE)  # a budget of one page and the margin
    cache = PageCache(PAGE_SIZE)
    with SegmentReader(big.path, big.hlen, big.key, cache, buffers=buffers) as rd:
        rd.load_span((0, PAGE_SEGMENTS))
        held = rd.read_cached(100, 1000)
        assert isinstance(held, memoryview)
        for _ in range(3):  # pages loaded, given back and loaded again, over and over
            for page in (1, 0, 2, 1):
                stop = min((page + 1) * PAGE_SEGMENTS, rd.segments)
                rd.release(0, 3)
                rd.load_span((page * PAGE_SEGMENTS, stop))
                start = page * PAGE_SIZE
                assert rd.read(start, min(PAGE_SIZE, len(BIG) - start)) == BIG[start:][:PAGE_SIZE]
        assert held == BIG[100:1100]  # its buffer was never decrypted into again
        assert len(buffers.pages) <= buffers.pages.limit


def test_tampered_segment_in_a_page_loaded_whole_fails_alone(big, tmp_path: Path) -> None:
    bad = tmp_path / "tampered.tar.c4gh"
    b = PAGE_SEGMENTS + 7
    bad.write_bytes(corpus.tamper(big.data, b))
    with big_reader(big, bad, SegmentBuffers(64 * PAGE_SIZE)) as rd:
        rd.load_span((PAGE_SEGMENTS, 2 * PAGE_SEGMENTS))  # read-ahead over it does not raise
        assert rd.read_cached(PAGE_SIZE, PAGE_SIZE) is None  # never a view over the bad bytes
        assert rd.read_cached(b * SEG - 5, 10) is None
        with pytest.raises(CorruptArchiveError, match=f"segment {b} fails"):
            rd.read(PAGE_SIZE + 5, PAGE_SIZE - 10)
        good = (b + 1) * SEG
        assert rd.read_cached(good, SEG) == BIG[good : good + SEG]
        assert rd.read(PAGE_SIZE, 7 * SEG) == BIG[PAGE_SIZE : PAGE_SIZE + 7 * SEG]


def test_the_cipher_opens_every_segment_and_refuses_a_tampered_one(big) -> None:
    cipher = segments._OpenSSLAead(big.key)
    for n in range(-(-len(BIG) // SEG)):
        start = cipher_offset(big.hlen, n)
        piece = memoryview(big.data[start : start + 65564])
        assert cipher.open(piece) == library_plaintext(big, n)
        out = bytearray(len(piece) - 28)
        cipher.open_into(piece, memoryview(out))
        assert out == library_plaintext(big, n)
        bad = bytearray(piece)
        bad[100] ^= 1
        with pytest.raises(segments._BadTag):
            cipher.open(memoryview(bad))
        with pytest.raises(segments._BadTag):
            cipher.open_into(memoryview(bad), memoryview(out))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["load", "read", "release"]), st.integers(0, 2 * PAGE_SIZE)),
        max_size=5,
    ),
    first=st.integers(0, 80),
    count=st.integers(0, 80),
)
def test_missing_names_every_span_a_segment_of_needs_decrypting(
    big, tampered_big, steps, first, count
) -> None:
    """`missing` (asked on the event loop before each read-ahead) against a plain look at every
    slot, whatever mix of whole-page loads, small reads, give-backs and a failed segment."""
    with big_reader(big, tampered_big, SegmentBuffers(64 * PAGE_SIZE)) as rd:
        for op, pos in steps:
            page = pos // PAGE_SIZE
            if op == "load":
                rd.load_span((page * PAGE_SEGMENTS, min((page + 1) * PAGE_SEGMENTS, rd.segments)))
            elif op == "read":
                with contextlib.suppress(CorruptArchiveError):
                    rd.read(pos, 10)
            else:
                rd.release(page, page + 1)
        expected = []
        n, stop = first, min(first + count, rd.segments)
        while n < stop:
            hi = min((n // PAGE_SEGMENTS + 1) * PAGE_SEGMENTS, stop)
            page = rd._cache.get(rd.cache_key(n // PAGE_SEGMENTS))
            if page is None or any(
                page.slots[k % PAGE_SEGMENTS] is None and k not in rd._failed for k in range(n, hi)
            ):
                expected.append((n, hi))
            n = hi
        assert rd.missing(first, count) == expected


@pytest.fixture(scope="module")
def tampered_big(big, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The big package with segment PAGE_SEGMENTS + 3 (page 1) tampered."""
    path = tmp_path_factory.mktemp("tampered") / "tampered.tar.c4gh"
    path.write_bytes(corpus.tamper(big.data, PAGE_SEGMENTS + 3))
    return path


def test_a_read_on_disk_is_asked_for_and_then_served_without_a_thread(big, tmp_path: Path) -> None:
    """`disk_asked` starts the disk read of a small span `read_cached` declined: polling
    `read_cached` then serves exactly its bytes. A span of more segments than are decrypted
    inline is never asked for (polling could not serve it)."""
    copy = tmp_path / "copy.tar.c4gh"
    copy.write_bytes(big.data)
    if not evicted(copy):
        pytest.skip("the kernel kept the file's pages; the disk case cannot be set up here")
    with big_reader(big, copy) as rd:
        offset = 7 * SEG + 100
        assert rd.read_cached(offset, 4096) is None
        assert not rd.disk_asked(PAGE_SIZE - 10, 2 * SEG)  # three segments: a thread's job
        assert not rd.disk_asked(len(BIG), 10)
        assert rd.disk_asked(offset, 4096)
        deadline = time.monotonic() + 10
        got = None
        while got is None and time.monotonic() < deadline:
            got = rd.read_cached(offset, 4096)
        assert got == BIG[offset : offset + 4096]
        assert rd.stats.decrypted == 1
