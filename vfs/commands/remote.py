"""s3:// inputs for `decant` subcommands: the --s3-* options and opening an archive in a bucket.

Endpoint, region and credentials come from the usual AWS_* variables (AWS_ENDPOINT_URL,
AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY); `--s3-endpoint` overrides the endpoint.
Nothing here prints or logs a credential.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from vfs.commands.status import UsageError
from vfs.errors import NotAnArchiveError, StoreError
from vfs.stores import ByteSource, Folder, is_url, split_location
from vfs.stores.locate import open_folder

if TYPE_CHECKING:
    from vfs.decant.reader import DecantArchive
    from vfs.stores.s3 import S3Options

ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")


def location(text: str) -> Path | str:
    """argparse type: an s3:// URL stays a string (a Path would fold its '//'), else a Path."""
    return text if is_url(text) else Path(text)


def add_s3_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("object storage (inputs given as s3://BUCKET/KEY)")
    group.add_argument(
        "--s3-endpoint", metavar="URL", help="S3 endpoint (default AWS_ENDPOINT_URL)"
    )
    group.add_argument("--s3-region", metavar="NAME", help="region (default AWS_REGION)")
    group.add_argument(
        "--s3-timeout", type=float, default=10.0, metavar="S", help="one request (default 10 s)"
    )
    group.add_argument(
        "--s3-retries", type=int, default=3, metavar="N", help="retries per request (default 3)"
    )


def s3_options(args: argparse.Namespace) -> S3Options:
    from vfs.stores.s3 import S3Options

    return S3Options(
        endpoint=getattr(args, "s3_endpoint", None),
        region=getattr(args, "s3_region", None),
        timeout=getattr(args, "s3_timeout", 10.0),
        retries=getattr(args, "s3_retries", 3),
    )


def split(url: str, args: argparse.Namespace) -> tuple[Folder, str]:
    """(the folder holding the object, its key) for an s3:// URL; a bad URL is a usage error."""
    try:
        folder_url, key = split_location(url)
        return open_folder(folder_url, s3_options(args)), key
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def open_remote_archive(url: str, args: argparse.Namespace) -> DecantArchive:
    """The archive at an s3:// URL. Missing, refused, unreachable or not a decant archive at the
    top level is a usage error (exit 2); damage found once it opened is 1, as for files."""
    from vfs.decant.reader import DecantArchive

    folder, key = split(url, args)
    try:
        if not key.endswith(".zarr"):
            src = folder.open(key)
            head = src.read(0, min(4, src.size))
            if head not in ZIP_MAGIC:
                raise UsageError(f"{url}: not a decant archive (not a zip file)")
        return DecantArchive.open_at(folder, key)
    except (NotAnArchiveError, StoreError) as exc:
        raise UsageError(str(exc)) from None


def open_remote_source(url: str, args: argparse.Namespace) -> ByteSource:
    """The object at an s3:// URL, opened (one HEAD); missing or unreachable is exit 2."""
    folder, key = split(url, args)
    try:
        return folder.open(key)
    except StoreError as exc:
        raise UsageError(str(exc)) from None


def stored_bytes(url: str, args: argparse.Namespace) -> int:
    """What the archive occupies in the bucket: the object, or every key of a NAME.zarr/."""
    folder, key = split(url, args)
    if key.endswith(".zarr"):
        return sum(info.size for info in folder.list(key))
    info = folder.stat(key)
    return info.size if info else 0


def remote_name(url: str) -> str:
    return url.rstrip("/").rpartition("/")[2]
