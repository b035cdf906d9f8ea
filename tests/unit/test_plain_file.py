"""PlainFile.read_cached: the bytes of a mirrored file from the page cache, on the event loop,
or None whenever the disk would have to be waited on; never bytes a `pread` would not give."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vfs.backends.plain import PlainFile

DATA = bytes(range(256)) * 40 + b"tail"  # 10,244 bytes: not a whole number of pages


@pytest.fixture
def plain(tmp_path: Path) -> PlainFile:
    path = tmp_path / "f.bin"
    path.write_bytes(DATA)
    with path.open("rb") as fh:
        fh.read()  # its pages in the page cache
    reader = PlainFile(path, tmp_path)
    yield reader
    reader.close()


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)  # read-only: shared is fine
@given(offset=st.integers(0, len(DATA) + 8192), size=st.integers(0, 3 * 4096))
def test_cached_reads_give_what_pread_gives(plain: PlainFile, offset: int, size: int) -> None:
    got = plain.read_cached(offset, size)
    assert got is not None  # every page is cached: nothing to wait for
    assert bytes(got) == DATA[offset : offset + size] == plain.read(offset, size)


def test_pages_not_cached_are_left_to_a_thread(tmp_path: Path) -> None:
    path = tmp_path / "cold.bin"
    path.write_bytes(DATA)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # written back, so the pages can be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    reader = PlainFile(path, tmp_path)
    try:
        if reader.read_cached(0, 4096) is not None:
            pytest.skip("this filesystem kept the pages (tmpfs, or DONTNEED ignored)")
        assert reader.read(0, 4096) == DATA[:4096]  # the thread's read, as before
    finally:
        reader.close()


def test_a_filesystem_without_nowait_reads_go_to_threads(
    plain: PlainFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def unsupported(*args: object) -> int:
        calls.append(args)
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(os, "preadv", unsupported)
    assert plain.read_cached(0, 10) is None
    assert plain.read_cached(0, 10) is None
    assert len(calls) == 1  # asked once, then no more for this file
    assert plain.read(0, 10) == DATA[:10]


def test_plain_files_start_no_read_ahead(plain: PlainFile) -> None:
    """The kernel reads ahead in real files; a read-ahead task would only hop to a thread."""
    assert plain.readahead_needed(0) is False
