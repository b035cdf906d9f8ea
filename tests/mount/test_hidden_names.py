"""A user writing through a root mount (`-o allow_other`, no --allow-delete) under a name that
SRC holds but the mount shows otherwise: an archive shown under its original's name (a series
`run.zarr.zip` shown as `run/`, `data.zarr.zip` showing `scan.tif`). The kernel checked the
user only against what it was shown there (nothing), so the daemon refuses (EEXIST) rather
than publish over root's archive, or set it aside as the archive of a plain file's name."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tests.mount.conftest import SYSTEM_PYTHON, Mount, User, open_tmp
from vfs.decant.packer import pack_file
from vfs.decant.series import PackOptions, pack_series


@dataclass(frozen=True)
class Shared:
    m: Mount
    drop: Path  # SRC's sticky (1777) folder
    work: Path  # root's originals


def _tiff(path: Path, seed: int) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = np.random.default_rng(seed).integers(0, 60000, (2, 24, 16), dtype=np.uint16)
    tifffile.imwrite(path, data, photometric="minisblack")
    return path.read_bytes()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, unprivileged: User) -> Iterator[Shared]:
    base = open_tmp(tmp_path_factory, "hidden-names")
    src, work = base / "src", base / "work"
    drop = src / "drop"
    drop.mkdir(parents=True)
    drop.chmod(0o1777)
    _tiff(work / "run" / "a.tif", 1)
    _tiff(work / "run" / "b.tif", 2)
    pack_series(work / "run", drop / "run.zarr.zip", PackOptions())
    _tiff(work / "scan.tif", 3)
    pack_file(work / "scan.tif", drop / "data.zarr.zip")
    m = Mount(src, base / "mnt", base / "mnt.log", base / "mnt-index")
    m.start("-o", "allow_other", "--settle", "0.3")
    try:
        yield Shared(m, drop, work)
    finally:
        m.stop()


def errnos(user: User, code: str, **paths: Path) -> dict[str, int]:
    """Run `code` as the user; each `step(name, fn)` records 0 or the errno fn() raised."""
    prelude = (
        "import json, os, sys\n"
        "p, out = json.loads(sys.argv[1]), {}\n"
        "def step(name, fn):\n"
        "    try:\n"
        "        fn()\n"
        "        out[name] = 0\n"
        "    except OSError as exc:\n"
        "        out[name] = exc.errno\n"
        "def make(path, data=b'the user s bytes\\n'):\n"
        "    with open(path, 'wb') as fh:\n"
        "        fh.write(data)\n"
    )
    args = json.dumps({k: str(v) for k, v in paths.items()})
    done = user.run(str(SYSTEM_PYTHON), "-I", "-c", prelude + code + "\nprint(json.dumps(out))",
                    args, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, int] = json.loads(done.stdout)
    return result


def snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    return {p.name: (p.stat().st_ino, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.iterdir())}  # fmt: skip


def test_a_name_src_holds_but_the_mount_shows_otherwise_is_not_taken(
    shared: Shared, unprivileged: User
) -> None:
    mnt = shared.m.mnt / "drop"
    assert sorted(os.listdir(mnt)) == ["run", "scan.tif"]
    before = snapshot(shared.drop)
    got = errnos(unprivileged, """
step("create the series archive's name", lambda: make(p["series"]))
step("create the archive name of 'data'", lambda: make(p["data"]))
step("create a name of its own", lambda: make(p["mine"]))
step("rename onto the series archive's name", lambda: os.rename(p["mine"], p["series"]))
step("rename onto 'data'", lambda: os.rename(p["mine"], p["data"]))
step("rename a TIFF onto 'data'", lambda: (make(p["tif"], open(p["tiff"], "rb").read()),
                                           os.rename(p["tif"], p["data"])))
""", series=mnt / "run.zarr.zip", data=mnt / "data", mine=mnt / "mine.txt",
        tif=mnt / "t.tif", tiff=mnt / "scan.tif")  # fmt: skip
    assert got == {
        "create the series archive's name": errno.EEXIST,
        "create the archive name of 'data'": errno.EEXIST,
        "create a name of its own": 0,
        "rename onto the series archive's name": errno.EEXIST,
        "rename onto 'data'": errno.EEXIST,
        "rename a TIFF onto 'data'": errno.EEXIST,
    }
    # What the user may write is published; root's archives stay, unchanged, and shown.
    deadline = time.monotonic() + 20
    while not {"mine.txt", "t.tif.zarr.zip"} <= set(os.listdir(shared.drop)):
        assert time.monotonic() < deadline, sorted(os.listdir(shared.drop))
        time.sleep(0.2)
    time.sleep(1)  # a publish over root's names would have happened by now
    after = snapshot(shared.drop)
    assert {k: after.get(k) for k in before} == before
    assert sorted(os.listdir(mnt)) == ["mine.txt", "run", "scan.tif", "t.tif"]
    for name in ("a.tif", "b.tif"):
        assert (mnt / "run" / name).read_bytes() == (shared.work / "run" / name).read_bytes()
    assert (mnt / "scan.tif").read_bytes() == (shared.work / "scan.tif").read_bytes()
    assert (shared.drop / "mine.txt").stat().st_uid == unprivileged.uid


def test_the_user_still_replaces_its_own_files_by_rename(
    shared: Shared, unprivileged: User
) -> None:
    """What rsync does to update a published file (and an archived TIFF) still works."""
    mnt = shared.m.mnt / "drop"
    tiff = (shared.work / "scan.tif").read_bytes()
    got = errnos(unprivileged, """
step("first", lambda: (make(p["own"], b"v1\\n"), make(p["img"], open(p["tiff"], "rb").read())))
""", own=mnt / "own.txt", img=mnt / "img.tif", tiff=mnt / "scan.tif")  # fmt: skip
    assert got == {"first": 0}
    deadline = time.monotonic() + 20
    while not {"own.txt", "img.tif.zarr.zip"} <= set(os.listdir(shared.drop)):
        assert time.monotonic() < deadline, sorted(os.listdir(shared.drop))
        time.sleep(0.2)
    got = errnos(unprivileged, """
step("update", lambda: (make(p["tmp"], b"v2\\n"), os.rename(p["tmp"], p["own"])))
step("update the TIFF", lambda: (make(p["tmp2"], b"not a tiff any more\\n"),
                                 os.rename(p["tmp2"], p["img"])))
step("again", lambda: (make(p["tmp"], b"v3\\n"), os.rename(p["tmp"], p["own"])))
""", own=mnt / "own.txt", tmp=mnt / ".own.txt.AbC123", img=mnt / "img.tif",
        tmp2=mnt / ".img.tif.XyZ789")  # fmt: skip
    assert got == {"update": 0, "update the TIFF": 0, "again": 0}
    deadline = time.monotonic() + 20
    while "img.tif.zarr.zip" in os.listdir(shared.drop) or not (shared.drop / "img.tif").exists():
        assert time.monotonic() < deadline, sorted(os.listdir(shared.drop))
        time.sleep(0.2)
    assert (mnt / "own.txt").read_bytes() == b"v3\n"
    assert (mnt / "img.tif").read_bytes() == b"not a tiff any more\n"
    assert tiff == (shared.work / "scan.tif").read_bytes()


def test_a_user_s_archive_does_not_take_over_a_name_root_s_archive_presents(
    shared: Shared, unprivileged: User, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Root's `data.zarr.zip` presents `scan.tif`. The user puts an archive of other bytes
    named `scan.tif.zarr.zip` (a name free in SRC) into the sticky folder: of two archives
    presenting one name, the one named after it used to win, so everyone reading `scan.tif`
    got the user's bytes. (Copied in through the mount, it is wrapped in an archive of its
    own and shown as itself: tests/mount/test_redteam56.py.)"""
    crafted = open_tmp(tmp_path_factory, "crafted")
    _tiff(crafted / "scan.tif", 9)
    pack_file(crafted / "scan.tif", crafted / "scan.tif.zarr.zip")
    (crafted / "scan.tif.zarr.zip").chmod(0o644)
    mnt = shared.m.mnt / "drop"
    done = unprivileged.run("cp", str(crafted / "scan.tif.zarr.zip"), str(shared.drop))
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 20  # the watcher saw it
    while "scan.tif.zarr.zip" not in os.listdir(mnt):
        assert time.monotonic() < deadline, sorted(os.listdir(mnt))
        time.sleep(0.2)
    assert sorted(n for n in os.listdir(mnt) if n.startswith("scan")) == [
        "scan.tif", "scan.tif.zarr.zip"]  # fmt: skip
    assert (mnt / "scan.tif").read_bytes() == (shared.work / "scan.tif").read_bytes()
    assert (mnt / "scan.tif").stat().st_uid == 0
    assert (mnt / "scan.tif.zarr.zip").stat().st_uid == unprivileged.uid
