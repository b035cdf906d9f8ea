"""Segment maths and SegmentReader: reads equal slices of the plaintext, decrypting only what
they touch. The session key and header length come from the crypt4gh library, not from vfs."""

from __future__ import annotations

import io
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from crypt4gh import header as c4gh_header
from crypt4gh import sodium
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.toolbox import load_tool
from vfs.c4gh.segments import (
    SegmentReader,
    cipher_offset,
    plaintext_capacity,
)
from vfs.cache import PageCache
from vfs.errors import CorruptArchiveError

SEG = 65536


corpus = load_tool("make_c4gh_corpus")
PLAIN = os.urandom(5 * SEG + 12345)  # five full segments and a short sixth


def expected_segments(offset: int, size: int, total: int) -> set[int]:
    end = min(offset + size, total)
    return set(range(offset // SEG, (end - 1) // SEG + 1)) if offset < end else set()


@pytest.fixture(scope="module")
def pkg(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    d = tmp_path_factory.mktemp("seg")
    node, writer = corpus.make_keypair(d, "node"), corpus.make_keypair(d, "writer")
    data = corpus.encrypt(PLAIN, writer.secret, [node.public])
    stream = io.BytesIO(data)
    session_keys, _ = c4gh_header.deconstruct(stream, [(0, node.secret, None)])
    path = d / "body.tar.c4gh"
    path.write_bytes(data)
    return SimpleNamespace(path=path, data=data, hlen=stream.tell(), key=bytes(session_keys[0]))


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
    assert ("c4gh", str(pkg.path), 0) in cache  # segment 1 lives in page 0
    second.read(SEG + 100, 10)
    assert first.stats.decrypted == 1
    first.close()
    second.close()


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
