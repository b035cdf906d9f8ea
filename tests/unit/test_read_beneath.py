"""read_beneath: a whole small file, never more than its limit, even when it grows while read."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vfs.beneath as beneath
from vfs.beneath import read_beneath


@settings(max_examples=60, deadline=None)
@given(size=st.integers(0, 3000), limit=st.integers(0, 3000))
def test_a_file_is_read_whole_up_to_its_limit(tmp_path_factory, size: int, limit: int) -> None:
    root = tmp_path_factory.mktemp("r")
    data = os.urandom(size)
    (root / "f").write_bytes(data)
    if size <= limit:
        assert read_beneath(root, root / "f", limit) == data
    else:
        with pytest.raises(OSError) as err:
            read_beneath(root, root / "f", limit)
        assert err.value.errno == errno.EFBIG


@pytest.mark.parametrize(("grow", "limit", "fits"), [(10, 200, True), (500, 200, False)])
def test_a_file_grown_after_its_stat_is_read_to_the_limit_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, grow: int, limit: int, fits: bool
) -> None:
    """fstat says 100 bytes; by the read it holds 100 + `grow`."""
    path = tmp_path / "f"
    path.write_bytes(b"a" * 100)
    real_fstat = os.fstat

    def fstat_then_grow(fd: int) -> os.stat_result:
        st = real_fstat(fd)
        with open(path, "ab") as fh:
            fh.write(b"b" * grow)
        return st

    monkeypatch.setattr(beneath.os, "fstat", fstat_then_grow)
    if fits:
        assert read_beneath(tmp_path, path, limit) == b"a" * 100 + b"b" * grow
    else:
        with pytest.raises(OSError) as err:
            read_beneath(tmp_path, path, limit)
        assert err.value.errno == errno.EFBIG
