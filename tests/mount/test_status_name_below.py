"""An entry named `.decant-status` below the top of SRC is not shown either: `decant-mount
--status MNT/sub` printed one a user made there as the daemon's status (red team 50)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_a_status_name_below_the_top_is_not_shown(tmp_path: Path, make_mount) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    fake = {"daemon": {"reads": 1}, "failed": [{"path": "everything", "error": "FAKE"}]}
    (src / "sub" / ".decant-status").write_text(json.dumps(fake))
    (src / "sub" / "kept.txt").write_text("kept\n")
    mnt = make_mount(src).mnt
    assert os.listdir(mnt / "sub") == ["kept.txt"]
    with pytest.raises(OSError) as caught:
        os.stat(mnt / "sub" / ".decant-status")
    assert caught.value.errno == errno.ENOENT
    run = subprocess.run([sys.executable, "-m", "vfs.cli", "--status", str(mnt / "sub")],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert run.returncode == 1 and "FAKE" not in run.stdout and "no status" in run.stderr
    top = subprocess.run([sys.executable, "-m", "vfs.cli", "--status", str(mnt)],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert top.returncode == 0 and "FAKE" not in top.stdout
