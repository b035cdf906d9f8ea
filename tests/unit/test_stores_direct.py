"""Reads past the page cache (vfs.stores.direct): exactly the bytes a plain pread gives, at any
offset and size."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vfs.stores import direct


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

