"""Issue "Ingest that keeps every file": `rsync -a` of 3,000 small files (1 KiB text, 20 KiB
TIFFs) into a writable mount while its folders are changed and rescanned behind its back keeps
every file under its name with its bytes, leaves no temp name in SRC or the spool, and a second
`rsync -a` transfers nothing. The old code lost files here: a folder rescan raced a rename.

No timing assertions: waits poll the status with generous timeouts.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tests.mount.helpers import folder_archive, tiff
from tests.mount.test_write_side import (
    MakeMount,
    files_of,
    spooled,
    status,
    temps,
    wait_drained,
)

N_FILES = 3000
FOLDERS = 15


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3,000 files in 15 folders: every tenth a 20 KiB uint16 TIFF, the rest 1 KiB of text,
    each with its own mtime (rsync -a keeps them: a second run compares them)."""
    root = tmp_path_factory.mktemp("small-tree") / "data"
    rng = np.random.default_rng(3)
    for i in range(N_FILES):
        folder = root / f"run{i % FOLDERS:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        if i % 10 == 9:
            path = folder / f"img{i:05d}.tif"
            tifffile.imwrite(path, rng.integers(0, 4096, (128, 80), dtype=np.uint16))
        else:
            path = folder / f"rec{i:05d}.csv"
            line = f"{i},{rng.random():.12f},sample\n".encode()
            path.write_bytes((line * 64)[:1024])
        os.utime(path, ns=(1_600_000_000_000_000_000 + i, 1_600_000_000_000_000_000 + i * 7))
    return root


@pytest.fixture
def src(tmp_path: Path) -> Path:
    folder = tmp_path / "src"
    folder.mkdir()
    return folder


def churn(src: Path, mnt: Path, stop: threading.Event) -> None:
    """Change SRC's folders by other means and list them through the mount, so the mount
    rescans them while rsync renames its temp files in them."""
    while not stop.is_set():
        for folder in sorted(p for p in src.iterdir() if p.name.startswith("run")):
            extra = folder / "zz-churn.txt"
            extra.write_bytes(b"x")
            with contextlib.suppress(OSError):  # not shown yet
                os.listdir(mnt / folder.name)
            extra.unlink()
        stop.wait(0.01)


def test_rsync_of_3000_small_files_keeps_every_file(
    small_tree: Path, src: Path, make_mount: MakeMount
) -> None:
    m = make_mount(src, "--settle", "0.2")
    stop = threading.Event()
    churner = threading.Thread(target=churn, args=(src, m.mnt, stop))
    churner.start()
    try:
        done = subprocess.run(["rsync", "-a", f"{small_tree}/", f"{m.mnt}/"],
                              capture_output=True, text=True, check=False)  # fmt: skip
    finally:
        stop.set()
        churner.join()
    assert done.returncode == 0, done.stderr[-2000:]
    doc = wait_drained(m.mnt, src, timeout=240)
    assert doc["failed"] == [] and doc["done"] == N_FILES and doc["temp"] == 0

    names = files_of(small_tree)
    assert files_of(m.mnt) == names  # every file, under its own name, nothing else

    def differs(rel: str) -> str | None:
        """What is wrong with `rel` through the mount and in SRC (None: nothing)."""
        if (m.mnt / rel).read_bytes() != (small_tree / rel).read_bytes():
            return f"{rel}: other bytes"
        if not (src / (f"{rel}.zarr.zip" if rel.endswith(".tif") else rel)).is_file():
            return f"{rel}: not in SRC as itself or its archive"
        if os.stat(m.mnt / rel).st_mtime_ns != os.stat(small_tree / rel).st_mtime_ns:
            return f"{rel}: another mtime"
        return None

    with ThreadPoolExecutor(4) as pool:  # four readers at once, as a copy tool with threads
        assert [d for d in pool.map(differs, names) if d] == []
    hidden = [p for p in src.rglob(".*") if ".decant-spool" not in p.parts]
    assert hidden == [] and temps(src) == [] and spooled(src) == []
    assert not any((src / ".decant-spool" / "staging").glob("*"))

    again = subprocess.run(["rsync", "-a", "--stats", f"{small_tree}/", f"{m.mnt}/"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert "Number of regular files transferred: 0" in again.stdout
    assert status(m.mnt)["done"] == N_FILES


def test_a_name_looked_up_before_its_publish_still_opens_after_it(
    src: Path, make_mount: MakeMount
) -> None:
    """The kernel keeps a looked-up name's inode for a while: once the file is published (its
    spooled copy unlinked) that same inode must serve the published file, not fail with ENOENT."""
    m = make_mount(src, "--settle", "0.2")
    path = m.mnt / "d.csv"
    path.write_bytes(b"x,y\n1,2\n")
    before = os.stat(path)
    wait_drained(m.mnt, src)
    assert os.stat(path).st_ino == before.st_ino  # no new inode: nothing went stale
    assert path.read_bytes() == b"x,y\n1,2\n"
    assert (src / "d.csv").read_bytes() == b"x,y\n1,2\n" and spooled(src) == []


def test_a_folder_archive_copied_in_reads_back_as_the_folder_written(
    tmp_path: Path, src: Path, make_mount: MakeMount
) -> None:
    """`rsync -a` of a `NAME.zarr/` folder archive into the mount reads back under the names
    written, after its publish and after a remount, and a second `rsync -a` sends nothing, as
    for a `x.tif.zarr.zip` written in (red team 61, F3: it became `x.tif` once published, its
    names gone, and every later rsync failed). Its attribute removed in SRC, it shows as its
    original."""
    data = tmp_path / "data"
    data.mkdir()
    tif = tmp_path / "x.tif"
    tif.write_bytes(tiff(11))
    original = folder_archive(tif, data / "x.tif.zarr")
    m = make_mount(src, "--settle", "0.2")
    done = subprocess.run(["rsync", "-a", f"{data}/", f"{m.mnt}/"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    wait_drained(m.mnt, src)
    assert (src / "x.tif.zarr" / ".decant" / "manifest.json").is_file()
    assert os.listdir(m.mnt) == ["x.tif.zarr"]
    assert files_of(m.mnt) == files_of(data)
    assert all((m.mnt / rel).read_bytes() == (data / rel).read_bytes() for rel in files_of(data))
    again = subprocess.run(["rsync", "-a", "--stats", f"{data}/", f"{m.mnt}/"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert "Number of regular files transferred: 0" in again.stdout
    # A folder renamed to such a name through the mount is one written there too.
    subprocess.run(["cp", "-a", f"{data}/x.tif.zarr", f"{m.mnt}/y"], check=True)
    wait_drained(m.mnt, src)
    os.rename(m.mnt / "y", m.mnt / "y.tif.zarr")
    assert sorted(os.listdir(m.mnt)) == ["x.tif.zarr", "y.tif.zarr"]
    m.stop()
    m.start(*m.extra)
    assert sorted(os.listdir(m.mnt)) == ["x.tif.zarr", "y.tif.zarr"]
    m.stop()
    os.removexattr(src / "x.tif.zarr", "user.decant.written")
    m.start(*m.extra)
    assert sorted(os.listdir(m.mnt)) == ["x.tif", "y.tif.zarr"]
    assert (m.mnt / "x.tif").read_bytes() == original
