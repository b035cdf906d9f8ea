"""The c4gh core and backend reading packages through byte sources (in memory, LocalFile), not
paths. Expected bytes come from the crypt4gh library's own decryption and from `tarfile`."""

from __future__ import annotations

import io
import random
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from crypt4gh import lib as c4gh_lib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.toolbox import load_tool
from tests.unit.c4gh_helpers import SEG, backend, files
from tests.unit.memory_store import MemoryFolder, MemorySource
from vfs.c4gh.header import open_package
from vfs.c4gh.segments import NOWAIT, SegmentReader
from vfs.c4gh.verify import verify_package
from vfs.cache import PageCache
from vfs.errors import CorruptArchiveError, DecryptError
from vfs.stores.local import LocalFile, LocalFolder

corpus = load_tool("make_c4gh_corpus")


def crypt4gh_decrypt(data: bytes, secret: bytes) -> bytes:
    """The plaintext as the crypt4gh library itself decrypts it."""
    out = io.BytesIO()
    c4gh_lib.decrypt([(0, secret, None)], io.BytesIO(data), out)
    return out.getvalue()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    d = tmp_path_factory.mktemp("c4src")
    node, other, writer = (corpus.make_keypair(d, n) for n in ("node", "other", "writer"))
    members = corpus.gdi_members(parquet_rows=(12000, 900))
    path = d / "DS1.tar.c4gh"
    corpus.write_package(path, members, writer, [node])
    data = path.read_bytes()
    plain = crypt4gh_decrypt(data, node.secret)
    return SimpleNamespace(
        dir=d, path=path, data=data, plain=plain, node=node, other=other, members=members
    )


def test_open_package_from_memory_reads_what_crypt4gh_decrypts(env) -> None:
    src = MemorySource("memory://b/DS1.tar.c4gh", env.data)
    header, rd = open_package(src, [env.node.secret], PageCache(64 * SEG))
    with rd:
        assert rd.size == len(env.plain)
        assert rd.read(0, rd.size) == env.plain
        assert rd.name == "DS1.tar.c4gh"
        assert rd.label == "memory://b/DS1.tar.c4gh"
    assert src.closed
    path_header, path_rd = open_package(env.path, [env.node.secret], PageCache(64 * SEG))
    path_rd.close()
    assert header == path_header


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(offset=st.integers(0, 40 * SEG), size=st.integers(0, 3 * SEG))
def test_random_reads_from_memory_equal_slices(env, offset: int, size: int) -> None:
    src = MemorySource("memory://b/x.tar.c4gh", env.data)
    _, rd = open_package(src, [env.node.secret], PageCache(8 * SEG))
    with rd:
        assert rd.read(offset, size) == env.plain[offset : offset + size]


def test_memory_source_reads_only_the_spans_touched(env) -> None:
    src = MemorySource("memory://b/x.tar.c4gh", env.data)
    _, rd = open_package(src, [env.node.secret], PageCache(64 * SEG))
    before = len(src.reads)
    with rd:
        rd.read(5 * SEG + 10, 100)  # one segment, not cached
        rd.read(5 * SEG + 200, 100)  # the same segment: from the cache
        rd.prefetch(0, 4)  # read-ahead works without fadvise
        assert rd.read_cached(SEG, 10) == env.plain[SEG : SEG + 10]
    reads = src.reads[before:]
    assert len(reads) == 2
    assert reads[0][1] == 65564  # exactly one cipher segment


def test_local_file_keeps_the_descriptor_fast_paths(env) -> None:
    src = LocalFile(env.path)
    _, rd = open_package(src, [env.node.secret], PageCache(64 * SEG))
    with rd:
        assert rd._local and rd._file is src and rd._descriptor() == src.fileno()
        assert rd._nowait == bool(NOWAIT)
        assert rd.segments >= 3
        rd.prefetch(0, 1)
        # WILLNEED was asked, as for a path, unless large loads read past the page cache
        assert rd._advised == ((0, 0) if rd._direct_ok else (1, 2))
        assert rd.read(0, rd.size) == env.plain
    assert src._fd == -1  # the reader owned the LocalFile and closed it


def test_truncated_source_fails_the_cut_segments_only(env) -> None:
    cut = env.data[: len(env.data) - 3 * SEG]
    src = MemorySource("memory://b/cut.tar.c4gh", cut)
    _, rd = open_package(src, [env.node.secret], PageCache(64 * SEG))
    # The reader is told the full size (as a stale description would): reads past the cut fail.
    with SegmentReader(
        MemorySource("memory://b/cut.tar.c4gh", cut),
        rd.header_len,
        rd._key,
        PageCache(64 * SEG),
        file_size=len(env.data),
    ) as stale:
        assert stale.read(0, SEG) == env.plain[:SEG]
        stale.prefetch(stale.segments - 6, 6)  # read-ahead past the cut does not raise
        with pytest.raises(CorruptArchiveError, match=r"cut short|truncated|authentication"):
            stale.read(len(env.plain) - 100, 100)
    rd.close()


def test_wrong_key_closes_the_source(env) -> None:
    src = MemorySource("memory://b/x.tar.c4gh", env.data)
    with pytest.raises(DecryptError, match=r"x\.tar\.c4gh"):
        open_package(src, [env.other.secret], PageCache(8 * SEG))
    assert src.closed


def test_verify_package_from_a_source_matches_the_path(env) -> None:
    by_path = verify_package(env.path, [env.node.secret])
    src = MemorySource("memory://b/DS1.tar.c4gh", env.data)
    by_source = verify_package(src, [env.node.secret])
    assert by_source.package == "memory://b/DS1.tar.c4gh"
    assert by_source.problems == by_path.problems == []
    assert [m.name for m in by_source.members] == [m.name for m in by_path.members]
    assert by_source.writer_fingerprint == by_path.writer_fingerprint
    assert src.closed


def test_backend_describe_at_and_open_at_a_memory_folder(env) -> None:
    folder = MemoryFolder({"sub/DS1.tar.c4gh": env.data})
    be = backend(env.node)
    desc = be.describe_at(folder, "sub/DS1.tar.c4gh")
    assert desc == be.describe(env.path)
    with tarfile.open(fileobj=io.BytesIO(env.plain)) as tar:
        expected = {m.name: env.plain[m.offset_data : m.offset_data + m.size] for m in tar}
    got = files(desc.root)
    assert set(got) == set(expected)
    for name, entry in got.items():
        handle = be.open_at(folder, "sub/DS1.tar.c4gh", name, entry)
        offsets = list(range(0, entry.size, 50_000))
        random.Random(1).shuffle(offsets)
        parts = {off: bytes(handle.read(off, 50_000)) for off in offsets}
        handle.close()
        assert b"".join(parts[o] for o in sorted(parts)) == expected[name]
    assert all(s.closed for s in folder.opened)  # describe's reader and every member's


def test_backend_at_a_changed_object_reopens_its_header(env, tmp_path: Path) -> None:
    other = corpus.write_package(
        tmp_path / "o.tar.c4gh",
        corpus.gdi_members(parquet_rows=(50, 60), seed=3),
        env.node,
        [env.node],
    )
    folder = MemoryFolder({"p.tar.c4gh": env.data})
    be = backend(env.node)
    first = be.describe_at(folder, "p.tar.c4gh")
    folder.files["p.tar.c4gh"] = (tmp_path / "o.tar.c4gh").read_bytes()
    second = be.describe_at(folder, "p.tar.c4gh")
    assert first != second
    entry = files(second.root)["manifest.json"]
    handle = be.open_at(folder, "p.tar.c4gh", "manifest.json", entry)
    data = bytes(handle.read(0, entry.size))
    handle.close()
    with tarfile.open(fileobj=io.BytesIO(other)) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None and data == member.read()


def test_backend_at_a_local_folder_takes_the_path(env) -> None:
    be = backend(env.node)
    desc = be.describe_at(LocalFolder(env.dir), env.path.name)
    assert desc == be.describe(env.path)
    entry = files(desc.root)["manifest.json"]
    handle = be.open_at(LocalFolder(env.dir), env.path.name, "manifest.json", entry)
    # The local way: one descriptor on the package (the LocalFile the backend opened), with the
    # local fast paths, labelled by the path.
    assert handle._reader._local and handle._reader.label == str(env.path)
    handle.close()
