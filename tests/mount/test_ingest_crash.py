"""Issue "Ingest that keeps every file": a partial rsync temp file left by a crash is never
published as data. The daemon is killed (-9) while rsync writes `.stack3.tif.XXXXXX`; after the
restart the partial file stays spooled and visible under its temp name, is never archived or
moved into SRC, and is deleted once unchanged for --stale-temp. A second rsync then brings the
whole file in.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from tests.mount.test_ingest_space import MiB, noise_tiff
from tests.mount.test_write_side import (
    FAST,
    SLOW,
    SPOOL,
    MakeMount,
    archived_sha,
    sha256,
    spooled,
    status,
    temps,
    wait_drained,
    wait_status,
)

TEMP_NAME = re.compile(r"^\.stack3\.tif\.[A-Za-z0-9]{6}$")


def partial_temp(src: Path, at_least: int, timeout: float = 60.0) -> Path:
    """rsync's temp file in the spool, once it holds `at_least` bytes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in (src / SPOOL).glob(".stack3.tif.*"):
            if TEMP_NAME.match(path.name) and path.stat().st_size >= at_least:
                return path
        time.sleep(0.05)
    raise AssertionError(f"no rsync temp file of {at_least} bytes in the spool")


def test_a_partial_rsync_temp_file_is_never_published_and_goes_once_stale(
    tmp_path: Path, make_mount: MakeMount
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    stack = noise_tiff(tmp_path / "in" / "stack3.tif", 64 * MiB, seed=3)
    m = make_mount(src, *FAST)
    copying = subprocess.Popen(["rsync", "-a", "--bwlimit=8192", f"{stack.parent}/",
                                f"{m.mnt}/"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        temp = partial_temp(src, 8 * MiB)
        assert m.proc is not None
        m.proc.send_signal(signal.SIGKILL)
        m.proc.wait()
    finally:
        copying.wait(timeout=60)  # fails: its mount is gone
    m.stop()
    partial = temp.read_bytes()
    assert 0 < len(partial) < stack.stat().st_size
    assert stack.read_bytes().startswith(partial)

    m.start(*FAST, "--stale-temp", "8s")
    shown = m.mnt / temp.name
    assert temp.name in os.listdir(m.mnt)  # visible under its temp name, readable
    assert shown.read_bytes() == partial
    doc = wait_status(m.mnt, lambda d: d["temp"] == 1)
    assert doc["queued"] == 0 and doc["packing"] == 0 and doc["done"] == 0
    assert sorted(os.listdir(src)) == [".decant-spool"]  # neither archived nor moved in

    doc = wait_status(m.mnt, lambda d: d["temp"] == 0)
    assert doc["done"] == 0 and spooled(src) == [] and temps(src) == []
    assert temp.name not in os.listdir(m.mnt)
    assert sorted(os.listdir(src)) == [".decant-spool"]
    assert f"{temp.name}: an rsync temp file unchanged for 8 s" in m.log_text()

    subprocess.run(["rsync", "-a", f"{stack.parent}/", f"{m.mnt}/"], check=True)
    wait_drained(m.mnt, src, timeout=120)
    assert archived_sha(src / "stack3.tif.zarr.zip") == sha256(stack)
    assert status(m.mnt)["failed"] == []


def test_files_spooled_hundreds_of_folders_deep_are_published_after_a_kill(
    tmp_path: Path, make_mount: MakeMount
) -> None:
    """Red team 53: files spooled 258 and 300 folders deep when the daemon was killed stayed in
    the spool after the restart, neither published nor reported (the walk that finds what a
    crash left stopped at 256 levels). Every one is published byte-exact now."""
    src = tmp_path / "src"
    src.mkdir()
    m = make_mount(src, *SLOW)  # spooled, not yet published, when the daemon is killed
    wrote = {}
    for depth in (250, 258, 300):
        rel = Path(f"k{depth}", *["y"] * depth, "leaf.txt")
        (m.mnt / rel.parent).mkdir(parents=True)
        (m.mnt / rel).write_bytes(data := os.urandom(1000 + depth))
        wrote[rel] = data
    assert len(spooled(src)) == 3
    assert m.proc is not None
    m.proc.send_signal(signal.SIGKILL)
    m.proc.wait()
    m.stop()

    m.start(*FAST)
    wait_drained(m.mnt, src)
    for rel, data in wrote.items():
        assert (src / rel).read_bytes() == data  # in SRC itself, not the spool
        assert (m.mnt / rel).read_bytes() == data
