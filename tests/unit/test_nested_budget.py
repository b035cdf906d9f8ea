"""The member bundles of a nested series are open while some reader holds them, and charged to
the open-archive budget (vfs.backends.decant._SharedArchives) like the archive itself: a handle
on one member and opens of each other in turn kept every bundle open until the series closed
(1,801 descriptors through a mount, or 702 MiB for 8 members of a million zip entries each,
past any budget; red team, round 32)."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tifffile

import vfs.backends.decant as decant_backend
from vfs.backends.base import Entry
from vfs.backends.decant import DecantBackend
from vfs.cache import PageCache
from vfs.decant.packer import pack_file
from vfs.errors import OpenArchivesFullError

MEMBERS = 100


def nested_series(tmp_path: Path, name: str, members: int) -> Path:
    """A nested series (`.zarr/` folder) of `members` bundles, each a hard link of one."""
    tif = tmp_path / f"{name}.tif"
    tifffile.imwrite(tif, np.arange(64, dtype=np.uint16).reshape(8, 8))
    bundle = tmp_path / f"{name}.zarr.zip"
    pack_file(tif, bundle)
    sub = json.loads(zipfile.ZipFile(bundle).read(".decant/manifest.json"))
    out = tmp_path / f"{name}.zarr"
    (out / ".decant").mkdir(parents=True)
    records = []
    for i in range(members):
        os.link(bundle, out / f"m{i}.zarr.zip")
        records.append({
            "byteorder": "<", "husk_array": "", "husk_raw_size": 0, "pages": [],
            "original_sha256": sub["original_sha256"], "original_size": sub["original_size"],
            "relpath": f"f{i}.tif", "subarchive": f"m{i}.zarr.zip",
        })  # fmt: skip
    manifest = {
        "all_chunks_stored": True, "byteorder": "<", "decant_version": "0.1.0", "format": 1,
        "husk_raw_size": 0, "members": records, "mode": "series", "notes": "",
        "original_name": name, "original_sha256": "", "original_size": 0, "pages": [],
        "pixel_codec": "", "plane_order": [], "series_consolidated": False,
    }  # fmt: skip
    (out / ".decant/manifest.json").write_text(json.dumps(manifest))
    return out


def test_a_bundle_closes_with_its_last_reader(tmp_path: Path) -> None:
    series = nested_series(tmp_path, "s", MEMBERS)
    backend = DecantBackend(PageCache(8 << 20))
    held = backend.open(series, "f0.tif", Entry())
    want = bytes(held.read(0, held.size))
    fds = len(os.listdir("/proc/self/fd"))
    try:
        for i in range(1, MEMBERS):
            handle = backend.open(series, f"f{i}.tif", Entry())
            assert bytes(handle.read(0, handle.size)) == want
            handle.close()
        assert len(os.listdir("/proc/self/fd")) <= fds + 1  # not one per bundle read
        assert bytes(held.read(0, held.size)) == want  # the held member's bundle stays open
    finally:
        held.close()
    assert backend.shared.held == 0 and len(backend.shared) == 0


def test_handles_on_many_members_are_bounded_like_many_archives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even with nothing else open: one handle of any archive opens, but a handle per member
    past the budget is refused, and a refused open leaves no bundle open."""
    monkeypatch.setattr(decant_backend, "HELD_FLOOR", 1 << 20)
    series = nested_series(tmp_path, "s", MEMBERS)  # > 1 MiB of bundles held open at once
    backend = DecantBackend(PageCache(0))
    fds = len(os.listdir("/proc/self/fd"))
    handles, refused = [], 0
    try:
        for i in range(MEMBERS):
            try:
                handles.append(backend.open(series, f"f{i}.tif", Entry()))
            except OpenArchivesFullError:
                refused += 1
        assert handles and refused
        assert backend.shared.held <= backend.shared.budget
        assert len(os.listdir("/proc/self/fd")) - fds <= len(handles) + 1
    finally:
        for handle in handles:
            handle.close()
    assert backend.shared.held == 0 and len(os.listdir("/proc/self/fd")) <= fds
