"""What the mount shows: series folders, clashes, damaged archives, and SRC changing underneath."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tests.mount.helpers import edit_manifest, flip_byte, rewrite_zip
from vfs.decant.packer import pack_file
from vfs.decant.series import PackOptions, pack_series


def _tiff(path: Path, seed: int, shape: tuple[int, ...] = (3, 40, 30)) -> Path:
    data = np.random.default_rng(seed).integers(0, 60000, shape, dtype=np.uint16)
    tifffile.imwrite(path, data, photometric="minisblack")
    return path


def _wait_for(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_series_appear_as_folders(tmp_path: Path, make_mount) -> None:  # type: ignore[no-untyped-def]
    same, mixed, src = tmp_path / "run1", tmp_path / "run2", tmp_path / "src"
    (same / "day1").mkdir(parents=True)
    mixed.mkdir()
    src.mkdir()
    members = [_tiff(same / "a.tif", 1), _tiff(same / "b.tif", 2), _tiff(same / "day1/c.tif", 3)]
    pack_series(same, src / "run1.zarr.zip", PackOptions())
    _tiff(mixed / "small.tif", 4, (2, 10, 12))
    (mixed / "notes.txt").write_text("not a tiff\n")
    pack_series(mixed, src / "run2.zarr", PackOptions())
    m = make_mount(src)
    assert sorted(os.listdir(m.mnt)) == ["run1", "run2"]
    for path in members:
        rel = path.relative_to(same)
        assert (m.mnt / "run1" / rel).read_bytes() == path.read_bytes()
    assert (m.mnt / "run2/notes.txt").read_text() == "not a tiff\n"
    assert (m.mnt / "run2/small.tif").read_bytes() == (mixed / "small.tif").read_bytes()


def test_clashes_keep_real_files_and_archive_names(tmp_path: Path, make_mount) -> None:  # type: ignore[no-untyped-def]
    work, src = tmp_path / "work", tmp_path / "src"
    work.mkdir()
    src.mkdir()
    first = _tiff(work / "scan.tif", 1)
    pack_file(first, src / "scan.tif.zarr.zip")
    (work / "other").mkdir()
    second = _tiff(work / "other" / "scan.tif", 2)
    pack_file(second, src / "scan-copy.zarr.zip")  # also presents "scan.tif"
    _tiff(work / "real.tif", 3)
    pack_file(work / "real.tif", src / "real.tif.zarr.zip")
    (src / "real.tif").write_bytes(b"the real file wins")
    m = make_mount(src)
    names = sorted(os.listdir(m.mnt))
    assert names == ["real.tif", "real.tif.zarr.zip", "scan-copy.zarr.zip", "scan.tif"]
    assert (m.mnt / "real.tif").read_bytes() == b"the real file wins"
    assert (m.mnt / "real.tif.zarr.zip").read_bytes() == (work / "real.tif").read_bytes()
    assert (m.mnt / "scan.tif").read_bytes() == first.read_bytes()
    assert (m.mnt / "scan-copy.zarr.zip").read_bytes() == second.read_bytes()
    assert "shown under its archive name" in m.log_text()


def test_damaged_archives_fail_alone(tmp_path: Path, make_mount) -> None:  # type: ignore[no-untyped-def]
    work, src = tmp_path / "work", tmp_path / "src"
    work.mkdir()
    src.mkdir()
    good = _tiff(work / "good.tif", 1)
    pack_file(good, src / "good.tif.zarr.zip")
    for seed, name in enumerate(("fmt", "nofield", "husk", "digest", "trunc"), start=10):
        pack_file(_tiff(work / f"{name}.tif", seed), work / f"{name}.zarr.zip")
    rewrite_zip(
        work / "fmt.zarr.zip", src / "fmt.zarr.zip", edit_manifest(lambda d: d.update(format=2))
    )
    rewrite_zip(work / "nofield.zarr.zip", src / "nofield.zarr.zip",
                edit_manifest(lambda d: d.pop("original_size")))  # fmt: skip
    rewrite_zip(work / "husk.zarr.zip", src / "husk.zarr.zip", {"husk/0": flip_byte(-40)})
    rewrite_zip(work / "digest.zarr.zip", src / "digest.zarr.zip",
                edit_manifest(lambda d: d.update(original_sha256="0" * 64)))  # fmt: skip
    raw = (work / "trunc.zarr.zip").read_bytes()
    (src / "trunc.zarr.zip").write_bytes(raw[: len(raw) // 2])

    m = make_mount(src)
    names = set(os.listdir(m.mnt))
    # Unopenable archives are shown raw under their own names.
    assert {"fmt.zarr.zip", "nofield.zarr.zip", "trunc.zarr.zip", "good.tif"} <= names
    assert (m.mnt / "fmt.zarr.zip").read_bytes() == (src / "fmt.zarr.zip").read_bytes()
    # Archives that open but reconstruct wrong bytes never copy out successfully.
    for shown, original in (("husk.tif", work / "husk.tif"), ("digest.tif", work / "digest.tif")):
        assert shown in names
        out = subprocess.run(["cat", str(m.mnt / shown)], capture_output=True)
        assert out.returncode != 0 or out.stdout == original.read_bytes()
        assert out.returncode != 0, f"{shown}: cat succeeded"
        again = subprocess.run(["cat", str(m.mnt / shown)], capture_output=True)
        assert again.returncode != 0, f"{shown}: a second cat succeeded"
    assert (m.mnt / "good.tif").read_bytes() == good.read_bytes()
    log = m.log_text()
    for name in ("fmt.zarr.zip", "nofield.zarr.zip", "trunc.zarr.zip", "digest.zarr.zip"):
        assert name in log
    assert "format 2" in log
    assert m.proc.poll() is None  # still serving


@pytest.mark.parametrize("extra", [(), ("--no-watch",)], ids=["inotify", "no-watch"])
def test_archives_added_and_removed_while_mounted(tmp_path: Path, make_mount, extra) -> None:  # type: ignore[no-untyped-def]
    """With inotify, or without it (NFS: --no-watch), changes to SRC show within seconds: the
    kernel keeps entries of unwatched folders for 1 s only."""
    work, src = tmp_path / "work", tmp_path / "src"
    (src / "deep").mkdir(parents=True)
    work.mkdir()
    pack_file(_tiff(work / "later.tif", 5), work / "later.tif.zarr.zip")
    m = make_mount(src, *extra)
    assert os.listdir(m.mnt / "deep") == []
    # Looked up while absent: a negative entry the kernel may keep must not hide it either.
    assert not os.path.exists(m.mnt / "deep" / "later.tif")
    shutil.copy(work / "later.tif.zarr.zip", src / "deep" / "later.tif.zarr.zip")
    assert _wait_for(lambda: os.path.exists(m.mnt / "deep" / "later.tif"), timeout=5.0)
    digest = hashlib.sha256((m.mnt / "deep" / "later.tif").read_bytes()).hexdigest()
    assert digest == hashlib.sha256((work / "later.tif").read_bytes()).hexdigest()
    (src / "deep" / "later.tif.zarr.zip").unlink()
    assert _wait_for(lambda: not os.path.exists(m.mnt / "deep" / "later.tif"), timeout=5.0)
    assert "later.tif" not in os.listdir(m.mnt / "deep")
    assert ("not watching" in m.log_text()) == bool(extra)


def test_watching_survives_folders_removed_while_it_rewalks(tmp_path: Path, make_mount) -> None:  # type: ignore[no-untyped-def]
    """`rm -r` of a tree of folders: each removal makes the watcher walk SRC again, and folders
    the walk found are gone before they are watched. That once ended watching for good."""
    work, src = tmp_path / "work", tmp_path / "src"
    src.mkdir()
    work.mkdir()
    pack_file(_tiff(work / "later.tif", 5), work / "later.tif.zarr.zip")
    m = make_mount(src)
    for round_no in range(3):
        trees = [src / f"t{round_no}-{i}" for i in range(10)]
        for tree in trees:
            for j in range(20):
                (tree / f"a{j}" / "b" / "c").mkdir(parents=True)
        time.sleep(0.5)  # watched: the walk found them all
        for tree in trees:  # removed over ~1 s, so removals race the watcher's walks
            for j in range(20):
                shutil.rmtree(tree / f"a{j}")
                time.sleep(0.005)
            tree.rmdir()
    time.sleep(1.0)
    assert "watching" not in m.log_text() or "failed" not in m.log_text(), m.log_text()
    (src / "deep").mkdir()
    assert _wait_for(lambda: os.path.isdir(m.mnt / "deep"), timeout=5.0)
    assert os.listdir(m.mnt / "deep") == []
    shutil.copy(work / "later.tif.zarr.zip", src / "deep" / "later.tif.zarr.zip")
    assert _wait_for(lambda: os.path.exists(m.mnt / "deep" / "later.tif"), timeout=5.0)
    # Names a generic file watcher ignores (editor backups, .git) are SRC's names too.
    for name in ("draft.txt~", ".git", "x.swp"):
        (src / "deep" / name).write_bytes(b"x")
    assert _wait_for(lambda: {"draft.txt~", ".git", "x.swp"} <= set(os.listdir(m.mnt / "deep")))


@pytest.mark.parametrize("extra", [(), ("--no-watch",)], ids=["inotify", "no-watch"])
def test_an_archive_rewritten_in_place_is_served_again(tmp_path: Path, make_mount, extra) -> None:  # type: ignore[no-untyped-def]
    """`cp new.zarr.zip old.zarr.zip` writes into the same inode and leaves the folder's
    mtime alone: the mount must take the new version (once ESTALE until the folder changed).
    Without a watcher, the open that finds the archive changed lists it again."""
    work, src = tmp_path / "work", tmp_path / "src"
    (work / "v1").mkdir(parents=True)
    (work / "v2").mkdir()
    src.mkdir()
    pack_file(_tiff(work / "v1" / "scan.tif", 1), src / "scan.tif.zarr.zip")
    pack_file(_tiff(work / "v2" / "scan.tif", 2, (4, 40, 30)), work / "new.zarr.zip")
    m = make_mount(src, *extra)
    assert (m.mnt / "scan.tif").read_bytes() == (work / "v1" / "scan.tif").read_bytes()
    ino = (src / "scan.tif.zarr.zip").stat().st_ino
    shutil.copyfile(work / "new.zarr.zip", src / "scan.tif.zarr.zip")
    assert (src / "scan.tif.zarr.zip").stat().st_ino == ino

    def new_version() -> bool:
        try:
            return (m.mnt / "scan.tif").read_bytes() == (work / "v2" / "scan.tif").read_bytes()
        except OSError:
            return False

    assert _wait_for(new_version, timeout=10.0), m.log_text()[-1500:]
