"""Reads past the page cache (vfs.stores.direct, LocalFile.read_past_cache): exactly the bytes
a plain pread gives, at any offset and size, and the page cache where O_DIRECT is refused."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from vfs.stores import LocalFile, direct, local


@pytest.fixture
def data_file(tmp_path: Path) -> tuple[Path, bytes]:
    data = os.urandom(300_000)
    path = tmp_path / "f"
    path.write_bytes(data)
    return path, data


@pytest.mark.parametrize("offset", [0, 1, 4095, 4096, 65563, 100_000])
def test_pread_direct_returns_exactly_the_bytes_asked(data_file, offset: int) -> None:
    path, data = data_file
    fd = os.open(path, os.O_RDONLY)
    try:
        fast = direct.open_direct(fd)
        if fast is None:
            pytest.skip("no O_DIRECT on this file system")
        try:
            for size in (1, 4096, 70_000, len(data)):  # the last runs past the end: short
                got = direct.pread_direct(fast, size, offset, 1 << 20)
                assert bytes(got) == data[offset : offset + size]
        finally:
            os.close(fast)
    finally:
        os.close(fd)


def test_local_file_reads_past_the_cache_the_same_bytes(data_file) -> None:
    path, data = data_file
    with LocalFile(path) as f:
        got = f.read_past_cache(12_345, 200_000, 1 << 20)
        if got is None:
            pytest.skip("no O_DIRECT on this file system")
        assert bytes(got) == data[12_345:212_345] == f.read(12_345, 200_000)
        assert f._direct is not None
        assert os.fstat(f._direct).st_ino == f.stat.st_ino  # the very file opened, not its path
    assert f._direct is None  # closed with the file
    assert f.read_past_cache(0, 10, 1 << 20) is None  # and never reopened after


def test_refused_o_direct_is_decided_once(data_file, monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = data_file
    opened: list[int] = []
    monkeypatch.setattr(local, "open_direct", lambda fd: opened.append(fd))
    with LocalFile(path) as f:
        assert f.read_past_cache(0, 4096, 1 << 20) is None
        assert f.read_past_cache(0, 4096, 1 << 20) is None
    assert len(opened) == 1


def test_read_errors_other_than_einval_are_not_swallowed(
    data_file, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = data_file

    def failing(*args: object) -> memoryview:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(local, "pread_direct", failing)
    with LocalFile(path) as f, pytest.raises(OSError) as info:
        f.read_past_cache(0, 4096, 1 << 20)
    assert info.value.errno == errno.EIO
