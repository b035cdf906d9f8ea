"""`decant pack … -o s3://…`: pack to a temp file, upload it, read it back from the bucket, check.

Each input is packed (and checked, as any pack is) into a private temp folder, uploaded with
`vfs.stores.upload.put_verified` (one PUT with If-None-Match: * up to 256 MiB, multipart above),
then opened from the bucket by ranged GETs and every original reconstructed and hashed: success
is printed only when each one's sha256 equals the source file's, hashed again here. The temp
archive is deleted afterwards either way; the source is only read.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from vfs.commands.progress import byte_progress
from vfs.commands.remote import split
from vfs.commands.status import (
    OK,
    OutputError,
    UsageError,
    quiet,
    report,
    require_readable,
    say,
)
from vfs.errors import DecantError, StoreError

if TYPE_CHECKING:
    from vfs.decant.packer import PackOptions, PackResult
    from vfs.stores import Folder
    from vfs.stores.upload import Uploaded, Verify

SUFFIX = ".zarr.zip"


def pack_to_bucket(args: argparse.Namespace, options: PackOptions) -> int:
    """Every input packed and published under the s3:// output; the highest status wins."""
    if args.series:
        raise UsageError("--series packs to a local folder only (s3:// output: one file each)")
    status = OK
    for src in args.inputs:
        try:
            _pack_one(src, _target(src, args), options, args)
        except (DecantError, OSError) as exc:
            status = max(status, report(exc))
    return status


def _target(src: Path, args: argparse.Namespace) -> str:
    """The object URL: -o itself for one input, else -o as a prefix + NAME.zarr.zip."""
    from vfs.decant.packer import default_archive_name

    out: str = args.output
    if len(args.inputs) == 1 and not out.endswith("/"):
        return out
    return f"{out.rstrip('/')}/{default_archive_name(src)}"


def _pack_one(src: Path, url: str, options: PackOptions, args: argparse.Namespace) -> None:
    from vfs.decant.packer import pack_file
    from vfs.stores.upload import ObjectExistsError, UploadError, put_verified

    require_readable(src)
    if not src.is_file():
        raise UsageError(f"{src}: not a regular file (a folder packs with --series)")
    if not url.endswith(SUFFIX):
        raise UsageError(f"{url}: an archive in a bucket is named NAME{SUFFIX}")
    if "\\" in url:  # as a mount refuses such a name (EINVAL)
        raise UsageError(f"{url}: holds a backslash, which object stores take for '/' (the "
                         "archive would land in another folder, under another name)")  # fmt: skip
    folder, key = split(url, args)
    silent = quiet(args)
    try:
        if not options.overwrite and folder.stat(key) is not None:  # early; the PUT decides
            raise UsageError(f"{url}: already exists (--force replaces it)")
        shown = key.removesuffix(SUFFIX)  # the name mounts show the original under
        if folder.stat(shown) is not None:
            raise UsageError(_taken(folder, shown, "not uploaded"))
        with tempfile.TemporaryDirectory(prefix="decant-pack-") as tmp:
            local = Path(tmp) / key.rpartition("/")[2]
            try:
                with byte_progress(f"packing {src.name}", src.stat().st_size, silent) as bar:
                    result = pack_file(src, local, options, bar)
            except OSError as exc:
                raise OutputError(f"{src}: cannot write {local}: {exc.strerror or exc}") from None
            uploaded = put_verified(
                folder, key, local, _originals_match(src, silent), overwrite=options.overwrite
            )
        if folder.stat(shown) is not None:  # put there while this one was packed: older
            raise OutputError(_taken(folder, shown, f"uploaded to {url}, but not shown"))
    except ObjectExistsError as exc:
        raise UsageError(str(exc)) from None
    except UploadError as exc:
        raise OutputError(str(exc)) from None
    except StoreError as exc:  # the early HEAD: unreachable, refused
        raise UsageError(str(exc)) from None
    finally:
        folder.close()
    _print(result, uploaded, silent)


def _taken(folder: Folder, shown: str, what: str) -> str:
    return (f"{folder.url_of(shown)}: an object of the name this archive presents is in the "
            f"bucket, and mounts show the older of the two under it; {what}")  # fmt: skip


def _originals_match(src: Path, silent: bool) -> Verify:
    """A verifier: the archive opened from the bucket restores to `src` (sha256 of every
    original reconstructed from ranged GETs, against the manifest and the source file)."""

    def verify(folder: Folder, key: str) -> None:
        from vfs.decant.packer import file_sha256
        from vfs.decant.reader import DecantArchive
        from vfs.decant.verify import verify_opened

        expected = file_sha256(src)
        with DecantArchive.open_at(folder, key) as archive:
            total = sum(info.size for info in archive.originals())
            with byte_progress(f"checking {key.rpartition('/')[2]}", total, silent) as bar:
                verdicts = verify_opened(archive, bar)
        bad = [v for v in verdicts if not v.ok or v.actual != expected]
        if len(verdicts) != 1 or bad:
            got = ", ".join(f"{v.relpath} {v.actual}" for v in verdicts) or "no original"
            raise VerifyFailed(f"restores to {got}, source sha256 {expected}")

    return verify


class VerifyFailed(DecantError):
    """The archive read back from the bucket does not restore to its source."""


def _print(result: PackResult, uploaded: Uploaded, silent: bool) -> None:
    if silent:
        return
    ratio = result.archive_size / result.original_size if result.original_size else 0.0
    why = f" ({result.reason})" if result.reason else ""
    guard = "" if uploaded.conditional else ", not a conditional PUT"
    say(
        f"{result.source} -> {uploaded.url}: {result.mode}, ratio {ratio:.3f}{why} "
        f"(uploaded and checked{guard})"
    )


__all__ = ["pack_to_bucket"]
