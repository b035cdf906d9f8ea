"""`--listed-entries` through a real kernel: past the budget the kernel is asked to drop its
oldest entries and forgets their inodes (the daemon's table shrinks), every name is still
served, and a name made in SRC in a folder whose listing went shows at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mount.helpers import status, wait_for

FOLDERS, FILES, BUDGET = 4, 300, 200


def test_the_kernel_forgets_entries_past_the_budget_and_names_stay_served(
    tmp_path: Path,
    make_mount,  # type: ignore[no-untyped-def]
) -> None:
    src = tmp_path / "src"
    for d in range(FOLDERS):
        (src / f"d{d}").mkdir(parents=True)
        for i in range(FILES):
            (src / f"d{d}" / f"f{i:03d}").write_bytes(f"{d}/{i}".encode())
    m = make_mount(src, "--listed-entries", str(BUDGET))
    # A process working in a folder whose names go keeps its path (folders' entries stay).
    worker = subprocess.Popen(
        [sys.executable, "-c", "import os, sys; os.chdir(sys.argv[1]); print('in', flush=True);"
         " sys.stdin.readline(); print(os.getcwd(), flush=True)", str(m.mnt / "d0")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert worker.stdout is not None and worker.stdout.readline() == "in\n"
    with os.scandir(m.mnt / "d0") as it:
        assert len(list(it)) == FILES
    with pytest.raises(FileNotFoundError):
        os.stat(m.mnt / "d0" / "new")  # the kernel remembers it missing (10 s)
    for d in range(FOLDERS):  # `ls -l`: every name handed to the kernel, then stat'ed
        names = os.listdir(m.mnt / f"d{d}")
        assert sorted(names) == [f"f{i:03d}" for i in range(FILES)]
        for name in names:
            os.stat(m.mnt / f"d{d}" / name)

    # Before: 1,205 inodes held (every name listed), until the kernel felt memory pressure.
    wait_for("shrunk", lambda: status(m.mnt)["daemon"]["inodes"] <= BUDGET + 50, timeout=15)
    out, _ = worker.communicate("\n", timeout=10)
    assert out.strip() == str(m.mnt / "d0")  # before files only were let go: ENOENT

    (src / "d0" / "new").write_bytes(b"made in SRC")
    wait_for("shown", lambda: (m.mnt / "d0" / "new").exists(), timeout=5)
    assert (m.mnt / "d0" / "new").read_bytes() == b"made in SRC"
    for d in range(FOLDERS):
        assert (m.mnt / f"d{d}" / "f007").read_bytes() == f"{d}/7".encode()
