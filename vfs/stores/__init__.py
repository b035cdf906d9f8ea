"""Byte sources: where an archive's bytes come from (local file/folder, S3-compatible bucket).

`open_folder` is the one entry point for a location given by the user: a path or an s3:// URL.
The S3 module (and obstore) is imported only when an s3:// URL is opened.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vfs.stores.base import ByteSource, Folder, ObjectInfo, join_key
from vfs.stores.local import LocalFile, LocalFolder

if TYPE_CHECKING:
    from vfs.stores.s3 import S3Options

__all__ = [
    "ByteSource",
    "Folder",
    "LocalFile",
    "LocalFolder",
    "ObjectInfo",
    "is_url",
    "join_key",
    "open_folder",
    "split_location",
]


def is_url(text: str) -> bool:
    return text.startswith("s3://")


def open_folder(location: str | Path, options: S3Options | None = None) -> Folder:
    """A folder for a local path or an s3://BUCKET/PREFIX URL."""
    if isinstance(location, str) and is_url(location):
        from vfs.stores.s3 import S3Folder

        return S3Folder(location, options)
    return LocalFolder(Path(location))


def split_location(location: str) -> tuple[str, str]:
    """s3://B/a/b/NAME → ("s3://B/a/b", "NAME"): the folder holding an object, and its key."""
    bucket, _, key = location.removeprefix("s3://").partition("/")
    prefix, _, name = key.strip("/").rpartition("/")
    if not bucket or not name:
        raise ValueError(f"{location}: no bucket or no object key")
    return (f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"), name
