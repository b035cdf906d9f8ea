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


def test_entry_path_reaches_only_the_file_listed_there(tmp_path: Path) -> None:
    """Red team 66: the daemon chmodded whatever was at a name. With the inode and owner the
    mount listed there, another file at the name is ESTALE: another inode, or the same inode
    number given to a new file of another owner once the first was deleted (ext4 reuses them)."""
    from vfs.beneath import entry_path

    path = tmp_path / "mine.txt"
    path.write_bytes(b"mine")
    st = path.stat()
    with entry_path(tmp_path, path, st.st_ino, st.st_uid) as target:
        os.chmod(target, 0o640)
    for ino, uid in ((st.st_ino + 1, st.st_uid), (st.st_ino, st.st_uid + 1)):
        with pytest.raises(OSError) as caught, entry_path(tmp_path, path, ino, uid):
            pass
        assert caught.value.errno == errno.ESTALE
    assert path.stat().st_mode & 0o777 == 0o640
