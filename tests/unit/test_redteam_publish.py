"""Publishing builds a file at a temp name, then gives it the spooled file's mode, owner and
mtime (`apply_metadata`). With the spool's staging folder on another filesystem than the target
folder, that temp name sits in the target folder, which its owner (the writer) may rename
entries of: swapped for a symlink between the copy and `apply_metadata`, the daemon (root)
would chmod and chown the link's target to the writer. It must act on the file, never a link."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from vfs.ingest.publish import apply_metadata


def test_apply_metadata_never_follows_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's\n")
    victim.chmod(0o600)
    before = victim.stat()
    spooled = tmp_path / "spooled"
    spooled.write_bytes(b"the writer's\n")
    spooled.chmod(0o666)
    os.utime(spooled, ns=(1, 1))
    staged = tmp_path / ".decant-tmp-staged"
    staged.symlink_to(victim)  # swapped in by the folder's owner
    with pytest.raises(OSError):
        apply_metadata(staged, spooled.stat())
    after = victim.stat()
    assert stat.S_IMODE(after.st_mode) == 0o600
    assert after.st_mtime_ns == before.st_mtime_ns


def test_apply_metadata_sets_a_regular_file(tmp_path: Path) -> None:
    spooled = tmp_path / "spooled"
    spooled.write_bytes(b"x")
    spooled.chmod(0o640)
    os.utime(spooled, ns=(10**18, 2 * 10**18))
    staged = tmp_path / "staged"
    staged.write_bytes(b"x")
    apply_metadata(staged, spooled.stat())
    st = staged.stat()
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_mtime_ns == 2 * 10**18
