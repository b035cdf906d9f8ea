"""An image's version as `--no-watch` opens key its planes by (vfs/backends/acqstore.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.toolbox import make_chain, remove_chain
from vfs.acqstore.ngff import refuse_links
from vfs.backends.acqstore import image_version
from vfs.errors import CorruptArchiveError


def test_a_folder_renamed_inside_the_image_changes_its_version(tmp_path: Path) -> None:
    """Chunk folders `0/0` and `0/1` exchanged by rename: no file's times change, nor the top
    folder's, and the planes decoded before were served (red team, round 43)."""
    image = tmp_path / "img.zarr"
    for sub in ("0/0", "0/1"):
        (image / sub).mkdir(parents=True)
        (image / sub / "0").write_bytes(sub.encode())
    before = image_version(tmp_path, image)
    time.sleep(0.05)  # past the kernel's timestamp granularity
    os.rename(image / "0/0", image / "0/x")
    os.rename(image / "0/1", image / "0/0")
    os.rename(image / "0/x", image / "0/1")
    assert image_version(tmp_path, image) != before


def test_a_file_written_anew_changes_it_and_a_read_does_not(tmp_path: Path) -> None:
    image = tmp_path / "img.zarr"
    (image / "0").mkdir(parents=True)
    chunk = image / "0" / "0.0"
    chunk.write_bytes(b"a")
    before = image_version(tmp_path, image)
    time.sleep(0.05)
    assert chunk.read_bytes() == b"a" and image_version(tmp_path, image) == before
    os.utime(chunk, ns=(0, 10**18))
    assert image_version(tmp_path, image) != before


def test_an_image_folder_too_deep_to_walk_is_refused_not_recursed(tmp_path: Path) -> None:
    """os.walk recursed once a level: an image holding a folder 1,200 levels deep raised
    RecursionError in both walks; a link below the depth walked must not pass either."""
    image = tmp_path / "img.zarr"
    image.mkdir()
    bottom = make_chain(image, "d", 1200)
    (bottom / "chunk").symlink_to("/etc/passwd")
    try:
        for check in (lambda: image_version(tmp_path, image), lambda: refuse_links(image)):
            with pytest.raises(CorruptArchiveError, match="levels deep"):
                check()
    finally:
        os.unlink(bottom / "chunk")
        remove_chain(image, "d")
