"""A name read from inside an archive is shown only where everyone who may list its folder
may read the archive (red team, round 43): names are the folder's, the same for every user,
and a 0600 `a1.zarr.zip` of another user's was listed as `patient_jane_doe.tif`."""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tifffile

from vfs.backends.decant import DecantBackend
from vfs.cache import PageCache
from vfs.decant.packer import pack_file
from vfs.mount.tree import SourceTree

SECRET = "patient_jane_doe.tif"


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    """SRC/pub (0755) with a zip archive `a1.zarr.zip` and a folder archive `a2.zarr/`, both
    renamed from archives of SECRET (and `b.tif`), both readable by all for now."""
    work, pub = tmp_path / "work", tmp_path / "src" / "pub"
    work.mkdir()
    pub.mkdir(parents=True)
    for folder in (tmp_path / "src", pub):
        folder.chmod(0o755)
    for name, value in ((SECRET, 1), ("b.tif", 2)):
        tifffile.imwrite(work / name, np.full((8, 8), value, np.uint16))
    pack_file(work / SECRET, pub / "a1.zarr.zip")
    pack_file(work / "b.tif", work / "b.tif.zarr.zip")
    with zipfile.ZipFile(work / "b.tif.zarr.zip") as zf:
        zf.extractall(pub / "a2.zarr")
    for path in [pub / "a1.zarr.zip", *(pub / "a2.zarr").rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return pub


def _names(pub: Path) -> set[str]:
    tree = SourceTree(pub.parent, [DecantBackend(PageCache(1 << 22))])
    return set(tree.scan(pub))


def test_names_from_inside_readable_archives_are_shown(folder: Path) -> None:
    assert _names(folder) == {SECRET, "b.tif"}


def test_a_private_archive_is_listed_under_its_own_name(folder: Path) -> None:
    (folder / "a1.zarr.zip").chmod(0o600)
    (folder / "a2.zarr/.decant/manifest.json").chmod(0o600)
    assert _names(folder) == {"a1.zarr.zip", "a2.zarr"}
    (folder / "a2.zarr/.decant/manifest.json").chmod(0o644)
    (folder / "a2.zarr/.decant").chmod(0o700)  # a folder on the way others may not search
    assert _names(folder) == {"a1.zarr.zip", "a2.zarr"}


def test_a_private_archive_in_a_folder_only_its_owner_lists_keeps_its_name(folder: Path) -> None:
    (folder / "a1.zarr.zip").chmod(0o600)
    folder.chmod(0o700)  # the folder's and the archive's owner alone lists it (root here)
    assert _names(folder) == {SECRET, "b.tif"}


def test_an_archive_named_after_its_original_keeps_its_name(folder: Path) -> None:
    shutil.move(folder / "a1.zarr.zip", folder / f"{SECRET}.zarr.zip")
    (folder / f"{SECRET}.zarr.zip").chmod(0o600)  # its name says as much as SRC's listing
    assert SECRET in _names(folder)


def test_a_group_that_lists_the_folder_must_read_the_archive(folder: Path) -> None:
    folder.chmod(0o750)
    os.chown(folder, 0, 0)
    archive = folder / "a1.zarr.zip"
    archive.chmod(0o640)
    os.chown(archive, 0, 1)  # another group: not every member of the folder's may read it
    assert "a1.zarr.zip" in _names(folder)
    os.chown(archive, 0, 0)  # the folder's own group, which may read it
    assert SECRET in _names(folder)
