"""Red team, round 45: TIFFs of every layout written through a real mount. One held back:
a TIFF with an empty axis was never published (see the commit that added this test).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tests.mount.test_write_side import MakeMount, wait_drained
from tests.toolbox import tiff_of_shape


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
