"""Red team 79: the `decant` commands agree with the mount on odd but readable archives, and
name damage as damage."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tifffile

from vfs.commands.status import FAILED, OK

Cli = Callable[..., tuple[int, str, str]]
MANIFEST = ".decant/manifest.json"


@pytest.fixture
def archive(tmp_path: Path, decant_cli: Cli) -> Path:
    tiff = tmp_path / "ex.tif"
    tifffile.imwrite(tiff, np.arange(2 * 32 * 24, dtype=np.uint16).reshape(2, 32, 24))
    out = tmp_path / "ex.tif.zarr.zip"
    assert decant_cli("pack", tiff, "-o", out)[0] == OK
    return out


def test_a_zip_with_bytes_before_it_verifies_and_restores(
    archive: Path, tmp_path: Path, decant_cli: Cli
) -> None:
    """What Python's zipfile reads (docs/format.md), and the mount serves and verifies: the
    commands refused it as "not a zip file" (exit 2), the only tools to check it."""
    prefixed = tmp_path / "prefix.zarr.zip"
    prefixed.write_bytes(b"X" * 1000 + archive.read_bytes())
    assert decant_cli("verify", prefixed)[0] == OK
    assert decant_cli("restore", prefixed, "-o", tmp_path / "out")[0] == OK
    assert (tmp_path / "out").read_bytes() == (tmp_path / "ex.tif").read_bytes()


def test_member_bundles_named_in_a_zip_archive_are_damage_not_an_output_error(
    archive: Path, tmp_path: Path, decant_cli: Cli
) -> None:
    """A manifest of a series of separate bundles inside a `.zarr.zip` (only a folder holds
    bundles): the lstat of `ARCHIVE/x.zarr.zip` failed ENOTDIR, reported as an output that
    cannot be written (exit 3, "cannot restore to …"). Now a damaged archive (exit 1)."""
    bad = tmp_path / "nested.zarr.zip"
    with zipfile.ZipFile(archive) as zin, zipfile.ZipFile(bad, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename == MANIFEST:
                doc = json.loads(data)
                member = {
                    "relpath": "a",
                    "original_size": doc["original_size"],
                    "original_sha256": doc["original_sha256"],
                    "subarchive": "x.zarr.zip",
                }
                doc.update(mode="series", series_consolidated=False, members=[member])
                data = json.dumps(doc).encode()
            zout.writestr(info, data)
    for command in (("verify", bad), ("restore", bad, "-o", tmp_path / "out")):
        code, _out, err = decant_cli(*command)
        assert code == FAILED, (command, code, err)
        assert "only a folder archive holds" in err and "cannot restore to" not in err
