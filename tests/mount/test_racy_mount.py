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

from tests.mount.conftest import Mount
from vfs.decant.packer import pack_file

RACY = 2.0  # vfs/mount/tree.py RACY_NS

SITECUSTOMIZE = """
import os
from vfs.backends.decant import DecantBackend

_real = DecantBackend.describe_listed
_done = []


def _racing(self, path, listed):
    if path.name == "x.tif.zarr.zip" and not _done:
        _done.append(path)
        old = os.environ["DECANT_TEST_OLD_ARCHIVE"]
        return _real(self, type(path)(old), os.stat(old))
    return _real(self, path, listed)


DecantBackend.describe_listed = _racing
"""


def test_an_archive_described_mid_write_serves_its_new_bytes_once_the_write_is_past(
    tmp_path: Path, make_mount: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    tifs = {}
    for version, seed in (("old", 1), ("new", 2)):
        tif = tmp_path / version / "x.tif"
        tif.parent.mkdir()
        pixels = np.random.default_rng(seed).integers(0, 4000, (3, 64, 48), np.uint16)
        tifffile.imwrite(tif, pixels)
        tifs[version] = tif
        pack_file(tif, tif.parent / "x.tif.zarr.zip")
    archive = src / "d" / "x.tif.zarr.zip"
    archive.write_bytes((tmp_path / "new" / "x.tif.zarr.zip").read_bytes())
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", str(hook))
    monkeypatch.setenv("DECANT_TEST_OLD_ARCHIVE", str(tmp_path / "old" / "x.tif.zarr.zip"))
    mount: Mount = make_mount(src)  # type: ignore[operator]
    shown = mount.mnt / "d" / "x.tif"
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
