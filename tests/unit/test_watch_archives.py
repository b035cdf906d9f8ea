"""Which `.zarr/` folder archives a watcher batch changed a file in (vfs.mount.watch)."""

from __future__ import annotations

from pathlib import Path

from vfs.mount.watch import folder_archives


def test_folder_archives_are_the_zarr_folders_holding_a_changed_folder_below_src() -> None:
    src = Path("/data/src")
    changed = [
        src / "a" / "run.tif.zarr" / "0",  # a chunk folder
        src / "run2.tif.zarr",  # the archive's own folder
        src / "s.zarr" / "m.tif.zarr" / "0",  # nested: both archives
        src / "plain",  # no archive
        src,  # SRC itself, even if it were named *.zarr
        Path("/elsewhere/x.zarr/0"),  # not below SRC
    ]
    assert folder_archives(changed, src) == {
        str(src / "a" / "run.tif.zarr"),
        str(src / "run2.tif.zarr"),
        str(src / "s.zarr"),
        str(src / "s.zarr" / "m.tif.zarr"),
    }
    assert folder_archives([Path("/data/src.zarr/0")], Path("/data/src.zarr")) == set()
