"""A user's location (a path or an s3://BUCKET/PREFIX URL) as a `Folder`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vfs.stores import is_url
from vfs.stores.base import Folder
from vfs.stores.local import LocalFolder

if TYPE_CHECKING:
    from vfs.stores.s3 import S3Options


def open_folder(location: str | Path, options: S3Options | None = None) -> Folder:
    """A folder for a local path or an s3://BUCKET/PREFIX URL (obstore loads only for a URL)."""
    if isinstance(location, str) and is_url(location):
        from vfs.stores.s3 import S3Folder

        return S3Folder(location, options)
    return LocalFolder(Path(location))
