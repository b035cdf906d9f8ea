"""Issue "Ingest that keeps every file": a full disk is a clear state. SRC is a small
loop-mounted ext4 made by the test: writes through the mount are refused with ENOSPC at the
--min-free reserve (not at 0 bytes); a TIFF that cannot be packed for lack of room waits, named
with its reason in the status, with one log line and no retry storm; once space is freed by other
means the queue drains by itself. Also: the daemon stops promptly while packing (unmount and
SIGTERM), and a 1 TiB sparse file is published without being copied.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile

from tests.mount.test_write_side import (
    FAST,
    SPOOL,
    MakeMount,
    archived_sha,
    drained,
    rsync,
    sha256,
    spooled,
    status,
    temps,
    wait_drained,
    wait_status,
    write_file,
)

MiB = 1 << 20


@pytest.fixture
def ext4_src(tmp_path: Path) -> Iterator[Path]:
    """SRC on a 64 MiB ext4 image, loop-mounted. Request it before make_mount: fixtures tear
    down in reverse, so the FUSE mount on top is gone before this unmounts."""
    image, folder = tmp_path / "src.img", tmp_path / "ext4-src"
    folder.mkdir()
    with open(image, "wb") as fh:
        fh.truncate(64 * MiB)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"mkfs.ext4 failed: {made.stderr.strip()}")
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(folder)],
                             capture_output=True, text=True, check=False)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot loop-mount ext4 here: {mounted.stderr.strip()}")
    shutil.rmtree(folder / "lost+found", ignore_errors=True)
    try:
        yield folder
    finally:
        if subprocess.run(["umount", str(folder)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(folder)], check=False)
        image.unlink(missing_ok=True)


def free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def noise_tiff(path: Path, nbytes: int, seed: int = 1) -> Path:
    """An uncompressible uint16 stack: its archive is as big as it is."""
    planes = max(1, nbytes // (512 * 512 * 2))
    data = np.random.default_rng(seed).integers(0, 65535, (planes, 512, 512), dtype=np.uint16)
    path.parent.mkdir(parents=True, exist_ok=True)
    tifffile.imwrite(path, data)
    return path


def fill_until_refused(path: Path, chunk: int = 256 * 1024) -> OSError:
    """Write to a new `path` until refused; the create itself may be (below the reserve)."""
    data = os.urandom(chunk)
    fd = -1
    try:
        with pytest.raises(OSError) as caught:
            fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
            while True:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
    finally:
        if fd >= 0:
            os.close(fd)
    return caught.value


def _a_tiff_waiting_for_room(
    src: Path, tmp_path: Path, make_mount: MakeMount
) -> tuple[Path, Any, Path, dict[str, Any]]:
    """A 16 MiB TIFF rsynced in with room left for it and the 4 MiB reserve, not for its
    archive too: (the TIFF, the mount, the filler taking the rest, the status once it waits)."""
    stack = noise_tiff(tmp_path / "in" / "stack.tif", 16 * MiB)
    m = make_mount(src, "--settle", "0.5", "--min-free", "4M")
    filler = src / "filler.bin"
    write_file(filler, bytes(free(src) - stack.stat().st_size - 10 * MiB))
    rsync(stack.parent, m.mnt)
    return stack, m, filler, wait_status(m.mnt, lambda d: bool(d["waiting_for_space"]))


def test_a_full_disk_refuses_writes_at_the_reserve_waits_and_drains_by_itself(
    ext4_src: Path, tmp_path: Path, make_mount: MakeMount
) -> None:
    src = ext4_src
    stack, m, filler, doc = _a_tiff_waiting_for_room(src, tmp_path, make_mount)
    (waiting,) = doc["waiting_for_space"]
    assert waiting["path"] == "stack.tif" and "needs about 17" in waiting["reason"]
    assert doc["failed"] == [] and doc["queued"] == 1
    assert sha256(m.mnt / "stack.tif") == sha256(stack)  # readable while it waits

    refused = fill_until_refused(m.mnt / "more.bin")  # new data stops at the reserve
    assert refused.errno == errno.ENOSPC
    assert free(src) >= 4 * MiB - 256 * 1024
    assert status(m.mnt)["space"]["refusing_writes"]
    with contextlib.suppress(FileNotFoundError):  # refused at its create, or later
        os.unlink(m.mnt / "more.bin")  # frees what it took: tried at once, still lacks room
    doc = wait_status(m.mnt, lambda d: bool(d["waiting_for_space"]))
    assert doc["waiting_for_space"][0]["path"] == "stack.tif" and doc["failed"] == []

    filler.unlink()  # an operator frees space by other means: the queue resumes by itself
    doc = wait_drained(m.mnt, src, timeout=120)
    assert doc["failed"] == [] and doc["waiting_for_space"] == []
    assert archived_sha(src / "stack.tif.zarr.zip") == sha256(stack)
    assert sha256(m.mnt / "stack.tif") == sha256(stack)
    assert temps(src) == [] and spooled(src) == []
    log = m.log_text()
    assert log.count("waiting for space") == 1  # one line, however many retries
    assert "room again" in log and "new data is refused" in log
    write_file(m.mnt / "after.csv", b"accepted again")
    wait_drained(m.mnt, src)
    assert (src / "after.csv").read_bytes() == b"accepted again"


@pytest.mark.parametrize("how", ["unmount", "sigterm"])
def test_the_daemon_stops_promptly_while_packing(
    how: str, tmp_path: Path, make_mount: MakeMount
) -> None:
    """The pack worker checks for shutdown between blocks: the daemon exits without finishing
    the pack, nothing half is published, and the file is still spooled for the next start."""
    src = tmp_path / "src"
    src.mkdir()
    stack = noise_tiff(tmp_path / "in" / "stack.tif", 160 * MiB, seed=2)
    want = sha256(stack)
    m = make_mount(src, *FAST)
    rsync(stack.parent, m.mnt)
    staging = src / ".decant-spool" / "staging"
    wait_status(m.mnt, lambda d: d["packing"] == 1 and any(staging.glob("*")), timeout=60)
    assert m.proc is not None
    if how == "unmount":
        subprocess.run(["fusermount3", "-u", str(m.mnt)], check=True)
    else:
        m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(timeout=30) == 0  # not the minute a 160 MiB pack and verify could take
    assert not (src / "stack.tif.zarr.zip").exists()
    assert spooled(src) == ["stack.tif"] and sha256(src / SPOOL / "stack.tif") == want
    assert temps(src) == []
    m.stop()

    m.start(*FAST)  # packed after the restart
    wait_drained(m.mnt, src, timeout=180)
    assert archived_sha(src / "stack.tif.zarr.zip") == want


def test_a_1_tib_sparse_file_is_published_without_a_copy(
    tmp_path: Path, make_mount: MakeMount
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    m = make_mount(src, *FAST)
    subprocess.run(["truncate", "-s", "1T", str(m.mnt / "x.bin")], check=True)
    with open(m.mnt / "x.bin", "r+b") as fh:
        fh.seek(123 << 30)
        fh.write(b"data in the middle")
    wait_drained(m.mnt, src)
    st = os.stat(src / "x.bin")
    assert st.st_size == 1 << 40 and st.st_blocks * 512 < 16 * MiB
    with open(m.mnt / "x.bin", "rb") as fh:
        fh.seek(123 << 30)
        assert fh.read(18) == b"data in the middle"
    assert drained(status(m.mnt)) and spooled(src) == []
