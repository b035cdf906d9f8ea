"""An in-memory `Folder`/`ByteSource` for tests: blobs in a dict, every read counted and checked.

It is not local (no `fileno`, not a `LocalFolder`), so code under test takes its byte-source
path, as it would for a bucket, without a server.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence

from vfs.errors import ObjectMissingError
from vfs.stores.base import ObjectInfo, check_range, join_key


class MemorySource:
    """One blob; `reads` records every (offset, size) asked, `closed` whether it was closed."""

    def __init__(self, name: str, data: bytes, etag: str = "1") -> None:
        self.name = name
        self.data = data
        self.size = len(data)
        self.etag = etag
        self.reads: list[tuple[int, int]] = []
        self.closed = False

    @property
    def identity(self) -> tuple[object, ...]:
        return (self.name, self.etag, self.size)

    def read(self, offset: int, size: int) -> bytes:
        assert not self.closed, f"{self.name}: read after close"
        check_range(self, offset, size)
        self.reads.append((offset, size))
        return self.data[offset : offset + size]

    def read_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return [self.read(off, n) for off, n in ranges]

    def close(self) -> None:
        self.closed = True


class MemoryFolder:
    """Blobs by key under a made-up memory:// name; `opened` lists every source handed out."""

    def __init__(self, files: dict[str, bytes], name: str = "memory://bucket") -> None:
        self.files = dict(files)
        self.name = name
        self.opened: list[MemorySource] = []

    def stat(self, key: str) -> ObjectInfo | None:
        data = self.files.get(key)
        return None if data is None else ObjectInfo(key, len(data), 0.0, "1")

    def get(self, key: str) -> bytes | None:
        return self.files.get(key)

    def open(self, key: str) -> MemorySource:
        if key not in self.files:
            raise ObjectMissingError(f"{self.name}/{key}: no such key")
        data = self.files[key]
        etag = hashlib.md5(data).hexdigest()  # as S3 gives a single-part upload
        source = MemorySource(f"{self.name}/{key}", data, etag)
        self.opened.append(source)
        return source

    def sub(self, prefix: str) -> MemoryFolder:
        cut = prefix.strip("/") + "/"
        inner = {k[len(cut) :]: v for k, v in self.files.items() if k.startswith(cut)}
        return MemoryFolder(inner, join_key(self.name, prefix))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        for key in sorted(self.files):
            if key.startswith(prefix):
                info = self.stat(key)
                assert info is not None
                yield info

    def list_dir(self, prefix: str = "") -> tuple[list[str], list[ObjectInfo]]:
        raise NotImplementedError

    def close(self) -> None:
        pass
