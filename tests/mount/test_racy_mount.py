"""An archive described while it was being written in place, through a real mount: the read of
that description fails (EIO, never wrong bytes), and a read 2 s later gets the new file. Before,
every read gave EIO until the archive changed again, across remounts (red team, round 47, F1).

A parse racing the write is made deterministic here: the daemon, started with a `sitecustomize`
on its path, describes a copy of the old archive the first time it describes the new one (what
a parse during a one-`write()` rewrite reads: the new stat, the old bytes). Expected bytes come
from the TIFFs written here, never from vfs."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tests.mount.conftest import Mount, settle
from vfs.decant.packer import pack_file

RACY = 2.0  # vfs/mount/racy.py RACY_NS

SITECUSTOMIZE = """
import os
from vfs.backends.decant import DecantBackend

_real = DecantBackend.describe_listed
_done = []


def _racing(self, path, listed):
    if path.name == "x.tif.zarr.zip" and not _done:
        _done.append(path)
        old = os.environ.get("DECANT_TEST_OLD_ARCHIVE")
        if old is None:  # a parse that failed on the half-written file
            from vfs.errors import CorruptArchiveError
            raise CorruptArchiveError(f"{path}: zip entry not served: written since opened")
        return _real(self, type(path)(old), os.stat(old))
    return _real(self, path, listed)


DecantBackend.describe_listed = _racing
"""


def _old_and_new_mounted(
    tmp_path: Path,
    make_mount: object,
    monkeypatch: pytest.MonkeyPatch,
    seeds: tuple[int, int],
    mtime: float | None,
) -> tuple[Mount, Path, dict[str, Path]]:
    """SRC holding the new version of d/x.tif.zarr.zip (its mtime set to `mtime` if given),
    mounted by a daemon that describes the old version the first time: the mount, the shown
    original and both TIFFs."""
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    tifs = {}
    for version, seed in zip(("old", "new"), seeds, strict=True):
        tif = tmp_path / version / "x.tif"
        tif.parent.mkdir()
        tifffile.imwrite(tif, np.random.default_rng(seed).integers(0, 4000, (3, 64, 48), np.uint16))
        tifs[version] = tif
        pack_file(tif, tif.parent / "x.tif.zarr.zip")
    archive = src / "d" / "x.tif.zarr.zip"
    archive.write_bytes((tmp_path / "new" / "x.tif.zarr.zip").read_bytes())
    if mtime is not None:
        os.utime(archive, (mtime, mtime))
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", str(hook))
    monkeypatch.setenv("DECANT_TEST_OLD_ARCHIVE", str(tmp_path / "old" / "x.tif.zarr.zip"))
    mount: Mount = make_mount(src)  # type: ignore[operator]
    return mount, mount.mnt / "d" / "x.tif", tifs


def test_an_archive_described_mid_write_serves_its_new_bytes_once_the_write_is_past(
    tmp_path: Path, make_mount: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    mount, shown, tifs = _old_and_new_mounted(tmp_path, make_mount, monkeypatch, (1, 2), None)
    archive = mount.src / "d" / "x.tif.zarr.zip"
    want = hashlib.sha256(tifs["new"].read_bytes()).hexdigest()

    os.utime(archive)  # written a moment ago, whatever the machine's speed so far
    during = subprocess.run(["sha256sum", str(shown)], capture_output=True, text=True)
    assert during.returncode != 0 and "Input/output error" in during.stderr, during
    time.sleep(RACY + 0.2)
    after = subprocess.run(["sha256sum", str(shown)], capture_output=True, text=True)
    assert after.returncode == 0, (after.stderr, mount.log_text())
    assert after.stdout.split()[0] == want
    assert os.stat(shown).st_size == tifs["new"].stat().st_size

    mount.stop()  # the description kept in the index is the trusted one
    monkeypatch.delenv("PYTHONPATH")
    mount.start()
    again = subprocess.run(["sha256sum", str(shown)], capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout.split()[0] == want, again.stderr


def test_an_archive_shown_raw_for_a_parse_failed_mid_write_appears_without_a_folder_change(
    tmp_path: Path, make_mount: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team 48, F1: shown raw, `x.tif` stayed missing (ENOENT) until the folder changed."""
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    tif = tmp_path / "x.tif"
    tifffile.imwrite(tif, np.random.default_rng(3).integers(0, 4000, (3, 64, 48), np.uint16))
    archive = pack_file(tif, src / "d" / "x.tif.zarr.zip").archive
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", str(hook))
    monkeypatch.delenv("DECANT_TEST_OLD_ARCHIVE", raising=False)
    mount: Mount = make_mount(src)  # type: ignore[operator]
    folder = mount.mnt / "d"

    os.utime(archive)
    assert os.listdir(folder) == ["x.tif.zarr.zip"]
    assert not (folder / "x.tif").exists()  # the kernel now holds a negative entry too
    deadline = time.monotonic() + RACY + 3
    while os.listdir(folder) != ["x.tif"]:
        assert time.monotonic() < deadline, (os.listdir(folder), mount.log_text())
        time.sleep(0.1)
    assert (folder / "x.tif").read_bytes() == tif.read_bytes()
    assert (src / "d").stat().st_mtime_ns < archive.stat().st_mtime_ns  # no folder change


def test_an_archive_shown_raw_written_over_in_place_with_one_that_parses_appears(
    tmp_path: Path, make_mount: object
) -> None:
    """The watcher's word of the write: only a raw entry's owner and bits were compared, so it
    stayed raw (and `x.tif` missing) until the folder changed."""
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    tif = tmp_path / "x.tif"
    tifffile.imwrite(tif, np.random.default_rng(4).integers(0, 4000, (3, 64, 48), np.uint16))
    good = pack_file(tif, tmp_path / "x.tif.zarr.zip").archive.read_bytes()
    archive = src / "d" / "x.tif.zarr.zip"
    archive.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: shown raw
    settle(archive)  # its failure remembered: only a change of the file shows it again
    mount: Mount = make_mount(src)  # type: ignore[operator]
    folder = mount.mnt / "d"
    assert os.listdir(folder) == ["x.tif.zarr.zip"]
    with open(archive, "r+b") as fh:  # in place: the folder's mtime stays
        fh.write(good)
    deadline = time.monotonic() + RACY + 3
    while os.listdir(folder) != ["x.tif"]:
        assert time.monotonic() < deadline, (os.listdir(folder), mount.log_text())
        time.sleep(0.1)
    assert (folder / "x.tif").read_bytes() == tif.read_bytes()


def test_a_trusted_description_of_other_bytes_is_made_again_after_its_verification_fails(
    tmp_path: Path, make_mount: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One `write()` longer than the 2 s window: the listing after the window parses bytes the
    write has not reached, and is trusted. The `sha256sum` of that description fails (EIO); the
    archive is then described from the file again, and the next `sha256sum` gets the new file,
    here and after a remount on the same index. Before, EIO until the file changed again."""
    then = time.time() - 60  # the write started a minute ago: nothing racy about its stat
    mount, shown, tifs = _old_and_new_mounted(tmp_path, make_mount, monkeypatch, (4, 5), then)
    want = hashlib.sha256(tifs["new"].read_bytes()).hexdigest()

    during = subprocess.run(["sha256sum", str(shown)], capture_output=True, text=True)
    assert during.returncode != 0 and "Input/output error" in during.stderr, during
    deadline = time.monotonic() + 5
    while True:
        after = subprocess.run(["sha256sum", str(shown)], capture_output=True, text=True)
        if after.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert after.returncode == 0, (after.stderr, mount.log_text())
    assert after.stdout.split()[0] == want
    assert os.stat(shown).st_size == tifs["new"].stat().st_size

    mount.stop()
    monkeypatch.delenv("PYTHONPATH")
    mount.start()
    again = subprocess.run(["sha256sum", str(shown)], capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout.split()[0] == want, again.stderr
