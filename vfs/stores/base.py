"""The byte-source interface: what the format cores may ask of wherever an archive's bytes live.

Two small protocols. A `ByteSource` is one immutable blob read by byte range (a local file, an
object read with ranged GETs). A `Folder` holds named blobs under a root (a local folder, a bucket
prefix): it lists, stats, fetches small ones whole and opens big ones as byte sources. This module
and `local.py` use the standard library only, so the cores can type against them without
importing an object-store client.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Protocol

from vfs.errors import CorruptArchiveError

# Entries of one folder a mount keeps (vfs.mount.buckettree cuts a listing there and logs it);
# a store lists one more at most, so that the cut is seen, and never gathers more first.
MAX_LISTED = 1_000_000
LEVEL_MAX = MAX_LISTED + 1


@dataclass(frozen=True)
class ObjectInfo:
    """One blob as a listing reports it. `key` is relative to the folder listed, '/'-separated."""

    key: str
    size: int
    mtime: float  # POSIX seconds
    etag: str | None = None  # object stores; None for local files

    @property
    def identity(self) -> tuple[object, ...]:
        """What changes when the blob is replaced: the index and the page cache key on it."""
        return (self.key, self.size, self.mtime, self.etag)


def replaced(listed: ObjectInfo, now: ObjectInfo) -> bool:
    """Whether `now` (a HEAD, an open) is another version of the object than `listed` (a LIST):
    by size and ETag, not by modification time: a listing and a HEAD may give it at different
    precisions (MinIO lists milliseconds; a Last-Modified header holds whole seconds)."""
    if listed.size != now.size:
        return True
    return bool(listed.etag and now.etag) and listed.etag != now.etag


class ByteSource(Protocol):
    """One immutable blob. `read` returns exactly `size` bytes or raises; thread-safe."""

    name: str  # for messages: a path or an s3:// URL, never a credential
    size: int

    @property
    def identity(self) -> tuple[object, ...]: ...

    def read(self, offset: int, size: int) -> bytes: ...

    def read_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]: ...

    def close(self) -> None: ...


class Folder(Protocol):
    """Named blobs under one root. Keys are relative, '/'-separated; folders are key prefixes."""

    name: str

    def stat(self, key: str) -> ObjectInfo | None: ...

    def get(self, key: str) -> bytes | None: ...

    def open(self, key: str) -> ByteSource: ...

    def sub(self, prefix: str) -> Folder: ...

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]: ...

    def list_dir(self, prefix: str = "") -> tuple[list[str], list[ObjectInfo]]: ...

    def close(self) -> None: ...


def check_range(source: ByteSource, offset: int, size: int) -> None:
    """A read must lie inside the blob: past the end means the archive is truncated or its
    directory lies, which the cores report as damage."""
    if offset < 0 or size < 0:  # as pread's EINVAL: an offset no file has
        raise CorruptArchiveError(f"{source.name}: read of {size} bytes at {offset}: bad range")
    if offset + size > source.size:
        raise CorruptArchiveError(
            f"{source.name}: read of {size} bytes at {offset} runs past the end "
            f"({source.size} bytes; truncated?)"
        )


def etag_number(etag: str | None) -> int:
    """An ETag as a signed 63-bit integer (an SQLite INTEGER): the
    stamp's inode column, and an object's inode number made of its key and ETag."""
    digest = hashlib.blake2b((etag or "").encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def join_key(prefix: str, key: str) -> str:
    """`prefix` and `key` as one key; either may be empty."""
    prefix, key = prefix.strip("/"), key.strip("/")
    return f"{prefix}/{key}" if prefix and key else prefix or key


class ObjectPath(PurePosixPath):
    """A key of a mounted bucket where the mount expects a path: `/`, `.name`, `.parent` and
    `relative_to` work as for paths, `str()` is the s3:// URL (logs, index keys), and any os call
    on it fails loudly instead of touching a local file of the same name.

    `/BUCKET/PREFIX/KEY` is kept as the path; an archive's own ObjectPath also carries `info`,
    the listing's ObjectInfo, so what keys on identity (index stamps) needs no request."""

    info: ObjectInfo | None

    def __str__(self) -> str:
        text = super().__str__()
        return f"s3:/{text}" if self.is_absolute() else text

    def __fspath__(self) -> str:
        raise TypeError(f"{self}: an object key, not a local path")

    @classmethod
    def of_url(cls, url: str) -> ObjectPath:
        """s3://BUCKET/PREFIX → its ObjectPath."""
        return cls("/" + url.removeprefix("s3://").strip("/"))


def key_problem(key: str) -> str | None:
    """Why obstore cannot take `key` as a path (so a listing skips it), or None. Here, not in
    vfs.stores.s3list: a mount of a local folder asks it of names written in, and the plain
    LIST client's urllib and XML imports cost every start ~10 ms."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
        return "holds a control character"
    if any(part in ("", ".", "..") for part in key.split("/")):
        return "has an empty, '.' or '..' segment"
    return None
