"""Red team, round 45: TIFFs of every layout, written through a real mount and read back
through it. Each test fails on the daemon before its fix; see the commit that added it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import shutil
import subprocess
from pathlib import Path

from tests.mount.test_write_side import MakeMount, wait_drained
from tests.toolbox import tiff_of_shape
from tests.unit.test_archive_changed import two_versions


def test_a_tiff_with_an_empty_axis_written_in_is_published_and_reads_back(
    tmp_path: Path, make_mount: MakeMount
) -> None:
    """ImageWidth 0, or SamplesPerPixel 0: `decant pack` archived such a file verbatim, but
    written into the mount it failed at every retry ("pages[0] shape [10, 0] has an empty
    axis") and stayed spooled. Now it is published, and a fresh mount serves its bytes."""
    src = tmp_path / "src"
    src.mkdir()
    files = {"w0.tif": tiff_of_shape(0, 10, 1), "spp0.tif": tiff_of_shape(10, 10, 0)}
    m = make_mount(src, "--settle", "0.2")
    for name, data in files.items():
        (m.mnt / "in").mkdir(exist_ok=True)
        (m.mnt / "in" / name).write_bytes(data)
    doc = wait_drained(m.mnt, src, timeout=30)
    assert doc["failed"] == [], doc["failed"]
    assert sorted(os.listdir(src / "in")) == sorted(f"{n}.zarr.zip" for n in files)
    m.stop()
    again = make_mount(src, name="again")
    for name, data in files.items():
        got = (again.mnt / "in" / name).read_bytes()
        assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest(), name


def test_an_archive_rewritten_in_place_under_an_open_handle_serves_old_bytes_or_eio(
    tmp_path: Path, make_mount: MakeMount
) -> None:
    """An original opened through the mount (not verified yet: direct_io), then its archive
    rewritten in place by `cp` of another: of 200 reads on the handle opened before, 44
    returned bytes of neither version with no error. Now each read gives the old version's
    bytes (what was decoded before) or EIO; a new open reads the new one."""
    old, old_tiff, new, new_tiff = two_versions(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy2(old, src / old.name)
    m = make_mount(src)
    shown = m.mnt / "X.tif"
    fd = os.open(shown, os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 600_000) == old_tiff[600_000:604_096]
        subprocess.run(["cp", str(new), str(src / old.name)], check=True)
        rng = random.Random(45)
        errors = 0
        for _ in range(200):
            offset, size = rng.randrange(len(old_tiff)), rng.choice([4096, 65536, 300_000])
            try:
                got = os.pread(fd, size, offset)
            except OSError as exc:
                assert exc.errno == errno.EIO
                errors += 1
                continue
            assert got == old_tiff[offset : offset + size], offset
        assert errors > 0
    finally:
        os.close(fd)
    assert shown.read_bytes() == new_tiff
