"""The local byte sources pass the conformance suite; a file that shrinks reads as damage."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from tests.toolbox import make_chain, remove_chain
from tests.unit.stores_conformance import FolderTests
from vfs.decant.store import DirectoryStore
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


def test_the_daemon_opens_only_what_a_path_names_without_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, packed_corpus: dict[str, Any]
) -> None:
    """A folder of SRC swapped for a link to one the user cannot reach, between the listing
    and the open (red team: the daemon, as root, showed the name, size and sha256 of an archive
    in a 0700 folder): with EXACT_OPENS, as the daemon runs, every way an archive or package
    is opened refuses a link anywhere on its path; a path of no link opens as before."""
    from vfs.c4gh.segments import SegmentReader
    from vfs.cache import PageCache
    from vfs.decant.reader import DecantArchive
    from vfs.stores import local

    archive = next(iter(packed_corpus.values())).archive
    private, public = tmp_path / "private", tmp_path / "public"
    private.mkdir(), public.mkdir()
    (private / "a.zarr.zip").write_bytes(archive.read_bytes())
    (private / "a.zarr").mkdir()
    (public / "via").symlink_to(private)  # a folder on the way is a link
    (public / "b.zarr.zip").symlink_to(private / "a.zarr.zip")  # the file itself is a link
    monkeypatch.setattr(local, "EXACT_OPENS", True)
    for path in (public / "via" / "a.zarr.zip", public / "b.zarr.zip"):
        with pytest.raises(OSError) as caught:
            LocalFile(path)
        assert caught.value.errno == errno.ELOOP, path
        with pytest.raises(CorruptArchiveError, match="cannot read"):
            DecantArchive.open(path)
        reader = SegmentReader(path, 0, bytes(32), PageCache(0), file_size=1 << 20)
        with pytest.raises(OSError):
            reader.read(0, 10)
        reader.close()
    with pytest.raises(CorruptArchiveError, match="cannot read"):
        DirectoryStore(public / "via" / "a.zarr")
    with DecantArchive.open(private / "a.zarr.zip") as opened:  # no link: as before
        assert opened.originals()
    monkeypatch.setattr(local, "EXACT_OPENS", False)  # the command line: a user's own links
    with DecantArchive.open(public / "via" / "a.zarr.zip") as opened:
        assert opened.originals()


def test_a_folder_archive_s_value_is_read_as_the_size_its_head_stated() -> None:
    """FolderStore (a `.zarr/` archive in a bucket) checked a value's size with a HEAD, then
    fetched it with a plain GET: an object replaced in between came whole, whatever its size
    (1.2 GiB of peak memory for a 2-byte manifest; red team, stop 25). It reads exactly the
    stated size from what it opened (an object's GETs carry its ETag)."""
    from vfs.decant.store import FolderStore
    from vfs.errors import CorruptArchiveError

    class Opened:
        size = 2

        def read_apart(self, offset: int, size: int) -> bytes:
            assert (offset, size) == (0, 2)
            return b"{}"

        def close(self) -> None:
            pass

    class Swapped(Opened):
        def read_apart(self, offset: int, size: int) -> bytes:
            return b"{"  # the object changed under it: fewer bytes than it stated

    class Prefix:
        name = "s3://bucket/run.zarr"

        def __init__(self, opened: Opened) -> None:
            self.opened = opened

        def open(self, key: str) -> Opened:
            return self.opened

        def stat(self, key: str) -> object:
            return self.opened

        def get(self, key: str) -> bytes:
            raise AssertionError("an unranged GET of the whole object")

    assert FolderStore(Prefix(Opened())).get("zarr.json", 1 << 20) == b"{}"  # type: ignore[arg-type]
    with pytest.raises(CorruptArchiveError, match="changed while it was read"):
        FolderStore(Prefix(Swapped())).get("zarr.json", 1 << 20)  # type: ignore[arg-type]


def test_a_folder_1200_levels_deep_is_listed_to_its_bottom(tmp_path: Path) -> None:
    """os.walk raised RecursionError past ~1,000 levels (a folder archive anyone may nest)."""
    bottom = make_chain(tmp_path, "d", 1200)
    try:
        (bottom / "f").write_bytes(b"x")
        (tmp_path / "top").write_bytes(b"yz")
        found = {info.key: info.size for info in LocalFolder(tmp_path).list()}
        assert found == {"top": 2, "/".join(["d"] * 1200 + ["f"]): 1}
    finally:
        remove_chain(tmp_path, "d")
