"""Byte sources: where an archive's bytes come from (local file/folder, S3-compatible bucket).

This package's top level is the standard library only, so the format cores can import the
interface (`base`) and the local sources without pulling in an object-store client;
`vfs.stores.locate.open_folder` turns a path or an s3:// URL into a folder, importing the S3
module (and obstore) only for a URL.
"""

from __future__ import annotations

from vfs.stores.base import ByteSource, Folder, ObjectInfo, join_key
from vfs.stores.local import LocalFile, LocalFolder

__all__ = [
    "ByteSource",
    "Folder",
    "LocalFile",
    "LocalFolder",
    "ObjectInfo",
    "is_url",
    "join_key",
    "split_location",
]


def is_url(text: str) -> bool:
    return text.startswith("s3://")


def split_location(location: str) -> tuple[str, str]:
    """s3://B/a/b/NAME → ("s3://B/a/b", "NAME"): the folder holding an object, and its key."""
    bucket, _, key = location.removeprefix("s3://").partition("/")
    prefix, _, name = key.strip("/").rpartition("/")
    if not bucket or not name:
        raise ValueError(f"{location}: no bucket or no object key")
    return (f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"), name
