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


def test_folder_archives_of_a_folder_two_thousand_levels_deep() -> None:
    """A folder as deep as PATH_MAX allows; its parents were walked once per parent before
    (5.2 s of the event loop for one such folder), once now."""
    src = Path("/data/src")
    deep = src.joinpath(*["d"] * 1000, "x.zarr", *["e"] * 1000)
    assert folder_archives([deep], src) == {str(src.joinpath(*["d"] * 1000, "x.zarr"))}
