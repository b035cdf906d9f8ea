"""The local byte sources pass the conformance suite; a file that shrinks reads as damage."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.unit.stores_conformance import FolderTests
from vfs.errors import CorruptArchiveError
from vfs.stores import Folder, LocalFile, LocalFolder
from vfs.stores.locate import open_folder


class TestLocalFolder(FolderTests):
    @pytest.fixture(autouse=True)
    def _root(self, tmp_path: Path) -> None:
        self.root = tmp_path / "root"

    def make_folder(self, files: dict[str, bytes]) -> Folder:
        for key, data in files.items():
            path = self.root / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return open_folder(self.root)

    def replace(self, folder: Folder, key: str, data: bytes) -> None:
        tmp = self.root / "tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self.root / key)


def test_open_folder_of_a_path_is_local(tmp_path: Path) -> None:
    assert isinstance(open_folder(tmp_path), LocalFolder)
    assert isinstance(open_folder(str(tmp_path)), LocalFolder)


def test_a_file_that_shrinks_after_open_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    with LocalFile(path) as src:
        os.truncate(path, 10)
        with pytest.raises(CorruptArchiveError, match="short read"):
            src.read(0, 100)
