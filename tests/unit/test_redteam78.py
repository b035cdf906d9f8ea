"""Red team 78 without a mount: the index's filesystem filled by a user."""

from __future__ import annotations

import logging
import os
import subprocess
import time
from pathlib import Path

import pytest

from vfs.mount import daemon
from vfs.mount.config import MountConfig


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")
def test_a_full_index_filesystem_starts_the_mount_without_the_index(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A user who fills the filesystem the index lives on (a tmpfs, /tmp, an ext4 without a
    root reserve) held every start of the daemon off: 30 s of retries, then "disk I/O
    error", exit 1, no mount for anyone. Now it starts without the index, saying why."""
    disk = tmp_path / "idx"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(disk)],
                   check=True)  # fmt: skip
    try:
        first = daemon.open_index(MountConfig(tmp_path, tmp_path / "m", index_dir=disk))
        assert first is not None
        first.close()
        (disk / "index.sqlite").unlink()  # a fresh index must be made on the full disk
        with open(disk / "fill", "wb") as fh, pytest.raises(OSError):
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        caplog.set_level(logging.WARNING)
        start = time.monotonic()
        index = daemon.open_index(MountConfig(tmp_path, tmp_path / "m", index_dir=disk))
        took = time.monotonic() - start
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    assert index is None
    assert took < 10, f"{took:.1f} s before the mount could start"
    assert "its filesystem is full" in caplog.text and "without a persistent index" in caplog.text
