"""One conformance suite for every `Folder`/`ByteSource` (zarr's StoreTests pattern): a subclass
provides `make_folder(files)` and `replace(folder, key, data)`; tests/unit and tests/s3 run it."""

from __future__ import annotations

import random

import pytest

from vfs.errors import CorruptArchiveError, ObjectMissingError
from vfs.stores import Folder

BLOB = random.Random(7).randbytes(3 * 1024 * 1024 + 123)
FILES = {
    "big.bin": BLOB,
    "small.json": b'{"a": 1}',
    "empty": b"",
    "sub/x.zarr/.zgroup": b"{}",
    "sub/x.zarr/0/0.0": b"chunk",
    "sub/y.bin": b"y" * 10,
}


class FolderTests:
    def make_folder(self, files: dict[str, bytes]) -> Folder:
        raise NotImplementedError

    def replace(self, folder: Folder, key: str, data: bytes) -> None:
        raise NotImplementedError

    @pytest.fixture
    def folder(self) -> Folder:
        return self.make_folder(FILES)

    def test_random_ranges_equal_slices(self, folder: Folder) -> None:
        rng = random.Random(1)
        src = folder.open("big.bin")
        try:
            assert src.size == len(BLOB)
            for _ in range(100):
                off = rng.randrange(len(BLOB))
                n = rng.randint(0, min(len(BLOB) - off, rng.choice((1, 4096, 70_000, 1 << 20))))
                assert src.read(off, n) == BLOB[off : off + n], (off, n)
            assert src.read(len(BLOB) - 5, 5) == BLOB[-5:]
            assert src.read(0, len(BLOB)) == BLOB
        finally:
            src.close()

    def test_read_many_keeps_order(self, folder: Folder) -> None:
        src = folder.open("big.bin")
        ranges = [(o, 4096) for o in range(len(BLOB) - 4096, 0, -300_001)]
        assert src.read_many(ranges) == [BLOB[o : o + n] for o, n in ranges]
        src.close()

    def test_read_past_the_end_is_damage(self, folder: Folder) -> None:
        src = folder.open("small.json")
        with pytest.raises(CorruptArchiveError, match="runs past the end"):
            src.read(4, 100)
        src.close()

    def test_missing_keys(self, folder: Folder) -> None:
        assert folder.get("nope") is None
        assert folder.stat("nope") is None
        assert folder.get("sub/nope/x") is None
        with pytest.raises((FileNotFoundError, ObjectMissingError)):
            folder.open("nope")

    def test_get_and_stat(self, folder: Folder) -> None:
        assert folder.get("small.json") == FILES["small.json"]
        assert folder.get("empty") == b""
        info = folder.stat("sub/y.bin")
        assert info is not None and info.size == 10 and info.mtime > 0

    def test_listing(self, folder: Folder) -> None:
        assert sorted(i.key for i in folder.list()) == sorted(FILES)
        assert sorted(i.key for i in folder.list("sub/x.zarr")) == [
            "sub/x.zarr/.zgroup",
            "sub/x.zarr/0/0.0",
        ]
        dirs, files = folder.list_dir()
        assert dirs == ["sub"]
        assert [f.key for f in files] == ["big.bin", "empty", "small.json"]
        dirs, files = folder.list_dir("sub")
        assert dirs == ["x.zarr"] and [f.key for f in files] == ["sub/y.bin"]

    def test_sub_folder(self, folder: Folder) -> None:
        sub = folder.sub("sub/x.zarr")
        assert sub.get(".zgroup") == b"{}"
        assert sub.get("0/0.0") == b"chunk"
        assert sorted(i.key for i in sub.list()) == [".zgroup", "0/0.0"]

    def test_identity_changes_when_replaced(self, folder: Folder) -> None:
        before = folder.open("sub/y.bin")
        self.replace(folder, "sub/y.bin", b"z" * 11)
        after = folder.open("sub/y.bin")
        assert after.identity != before.identity
        assert after.read(0, 11) == b"z" * 11
        before.close()
        after.close()
