"""vfs/decant/output.py: what `decant restore` writes is the views' bytes in order, at the file's
position, through O_DIRECT staging or the page cache, whatever the views' sizes and types."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vfs.decant import output
from vfs.decant.output import ALIGN, Output

STAGE = 2 * ALIGN  # small, so a few KiB of views fill and write it many times


def _write(path: Path, prefix: bytes, views: list[bytes | memoryview], direct: bool) -> Output:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, prefix)
        out = Output(fd, direct)
        out.write(views)
        out.close()
        assert os.lseek(fd, 0, os.SEEK_CUR) == len(prefix) + sum(len(bytes(v)) for v in views)
        assert not fcntl.fcntl(fd, fcntl.F_GETFL) & output.O_DIRECT  # off again after close
    finally:
        os.close(fd)
    return out


def _view(data: bytes, kind: int) -> bytes | memoryview:
    """The same bytes as bytes, a plain memoryview, or a uint16 array's (format 'H') view."""
    if kind == 0 or len(data) % 2:
        return data
    if kind == 1:
        return memoryview(data)
    return memoryview(np.frombuffer(data, dtype=np.uint16))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.integers(0, 3 * STAGE + 7), max_size=8),
    kinds=st.lists(st.integers(0, 2), min_size=8, max_size=8),
    prefix=st.sampled_from([0, 1, ALIGN, ALIGN + 513]),
    direct=st.booleans(),
)
def test_output_is_the_views_in_order(
    sizes: list[int],
    kinds: list[int],
    prefix: int,
    direct: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(output, "STAGE", STAGE)
    monkeypatch.setattr(output, "WRITEBACK", 5)
    rng = np.random.default_rng(len(sizes) * 1000 + prefix)
    chunks = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    head = b"h" * prefix
    path = tmp_path / "out.bin"
    _write(path, head, [_view(c, k) for c, k in zip(chunks, kinds, strict=False)], direct)
    assert path.read_bytes() == head + b"".join(chunks)


def test_direct_is_used_where_the_filesystem_takes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Aligned writes go out with O_DIRECT set, only the unaligned tail without it; an unaligned
    start position means no O_DIRECT at all."""
    monkeypatch.setattr(output, "STAGE", STAGE)
    try:
        os.close(os.open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT | output.O_DIRECT, 0o644))
    except OSError as exc:
        pytest.skip(f"{tmp_path}: no O_DIRECT here ({exc})")
    seen: list[tuple[int, bool]] = []
    real = os.pwrite

    def pwrite(fd: int, data: memoryview, at: int) -> int:
        seen.append((len(data), bool(fcntl.fcntl(fd, fcntl.F_GETFL) & output.O_DIRECT)))
        return real(fd, data, at)

    monkeypatch.setattr(output.os, "pwrite", pwrite)
    data = bytes(range(256)) * 41  # 10496 bytes: two stages and a 2304-byte tail
    path = tmp_path / "out.bin"
    out = _write(path, b"", [data], True)
    assert out.direct is False  # turned off for the tail
    assert seen == [(STAGE, True), (len(data) - STAGE, False)]
    assert path.read_bytes() == data
    seen.clear()
    _write(path, b"x", [data], True)
    assert all(not direct for _n, direct in seen)
    assert path.read_bytes() == b"x" + data


def test_a_refused_direct_write_goes_on_buffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem may accept the flag and refuse the I/O (EINVAL): the bytes still land."""
    monkeypatch.setattr(output, "STAGE", STAGE)
    real = os.pwrite

    def pwrite(fd: int, data: memoryview, at: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & output.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data, at)

    monkeypatch.setattr(output.os, "pwrite", pwrite)
    data = os.urandom(5 * STAGE + 99)
    path = tmp_path / "out.bin"
    _write(path, b"", [data[:3], data[3:]], True)
    assert path.read_bytes() == data


def test_other_write_errors_are_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def pwrite(fd: int, data: memoryview, at: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(output.os, "pwrite", pwrite)
    for direct in (True, False):
        fd = os.open(tmp_path / "out.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            out = Output(fd, direct)
            with pytest.raises(OSError, match="No space"):
                out.write([os.urandom(output.STAGE + 1)])
                out.close()
        finally:
            os.close(fd)
