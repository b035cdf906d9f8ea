"""A user who may write a folder of SRC fills it with files named like archives that are not
(a few bytes each) and then touches the folder every second: every rescan must not open and
parse every one of them again (CPU the whole mount shares), as long as none of them changed."""

from __future__ import annotations

import os
from pathlib import Path

from vfs.backends.decant import DecantBackend
from vfs.cache import PageCache
from vfs.mount.tree import SourceTree


class Counting(DecantBackend):
    def __init__(self) -> None:
        super().__init__(PageCache(1 << 20))
        self.described = 0

    def describe(self, path: Path):  # type: ignore[no-untyped-def]
        self.described += 1
        return super().describe(path)

    def describe_listed(self, path: Path, listed):  # type: ignore[no-untyped-def]
        self.described += 1  # what a listing describes: the archive it found, by its version
        return super().describe_listed(path, listed)


def test_a_broken_archive_is_not_described_again_until_it_changes(tmp_path: Path) -> None:
    for i in range(50):
        (tmp_path / f"junk{i}.tif.zarr.zip").write_bytes(b"not a zip")
    backend = Counting()
    tree = SourceTree(tmp_path, [backend])
    first = tree.scan(tmp_path)
    assert backend.described == 50 and len(first) == 50  # shown raw, each described once
    (tmp_path / "touch").write_bytes(b"")  # the folder changed: the mount rescans it
    assert set(tree.scan(tmp_path)) == set(first) | {"touch"}
    assert backend.described == 50, "unchanged broken archives were described again"
    changed = tmp_path / "junk0.tif.zarr.zip"
    changed.write_bytes(b"still not a zip, but new")
    os.utime(changed, ns=(1, 1))
    tree.scan(tmp_path)
    assert backend.described == 51  # a changed one is looked at again
