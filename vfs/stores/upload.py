"""Publishing a local file to an object key: upload, read back, check, and only then succeed.

`put_verified(folder, key, local_path, verify)` is the one write path to a bucket, shared by
`decant pack -o s3://…` and (later) the mount's write side:

1. Upload. Files up to `single_put_max` go in one PUT with `If-None-Match: *` (obstore
   `mode="create"`): the store refuses it when the key exists, so two writers never overwrite
   each other's object silently. Larger files go as a multipart upload of `chunk_size` parts,
   which obstore cannot make conditional (a conditional put is always one request, its body held
   in memory): for those a HEAD first refuses an existing key, and a writer racing us between
   that HEAD and the upload's completion can be overwritten, or overwrite us. Either way an S3
   PUT (single or completed multipart) is atomic: no reader ever sees half an object under the
   key, and a failed or aborted upload leaves nothing there.
2. Check it is ours: a HEAD must show the ETag the upload returned (else another writer won).
3. `verify(folder, key)` reads the object back through the store (ranged GETs) and raises if it
   is not what was meant to be published (the caller decides what "byte-exact" means: the
   archive's originals against the source, or `same_bytes` against the local file).
4. On any failure after the upload, the object is deleted only if its ETag is still ours (S3
   has no conditional DELETE: a replacement landing between that HEAD and the DELETE would be
   lost; the window is one round trip). The local file is never touched.

SeaweedFS (4.x, measured in tests/s3/test_s3_commands_pack.py) answers `If-None-Match: *` on an
existing key with 412 Precondition Failed, as AWS S3 does; a store that ignores the header would
let a single PUT overwrite silently, which the ETag check after the upload then reports.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import obstore
from obstore.exceptions import AlreadyExistsError, BaseError

from vfs.errors import DecantError, StoreError
from vfs.stores.base import Folder
from vfs.stores.s3 import S3Folder, scrubbed, translate

log = logging.getLogger(__name__)

SINGLE_PUT_MAX = 256 << 20  # one conditional PUT up to this (its body is held in memory)
CHUNK_SIZE = 16 << 20  # multipart part size: 10,000 parts (S3's limit) reach 156 GiB
PART_CONCURRENCY = 4
MAX_PARTS = 10_000  # S3's limit on the parts of one multipart upload
# Parts in flight hold their bytes in memory: a part is at most PART_BUFFER, so an object at most
# 625 GiB (S3 takes parts of up to 5 GiB; a `truncate -s 4T` through a spool mount made parts
# of 440 MiB and took the daemon to 930 MiB of RSS, red team 50).
PART_BUFFER = 64 << 20
MAX_PART = PART_BUFFER
COMPARE_BLOCK = 8 << 20

Verify = Callable[[Folder, str], None]


class ObjectExistsError(StoreError):
    """The key already holds an object and overwriting was not asked for."""


class UploadError(StoreError):
    """The upload did not complete, or the object under the key is not the one uploaded."""


class UploadVerifyError(DecantError):
    """The object uploaded does not read back as what was meant to be published."""


@dataclass(frozen=True)
class Uploaded:
    """What was published: its URL, size and ETag, and whether the store guarded the key."""

    url: str
    size: int
    etag: str
    conditional: bool  # one PUT with If-None-Match: * (False: HEAD-then-multipart, or overwrite)


def put_verified(
    folder: Folder,
    key: str,
    local_path: Path,
    verify: Verify | None = None,
    *,
    overwrite: bool = False,
    single_put_max: int = SINGLE_PUT_MAX,
    chunk_size: int = CHUNK_SIZE,
    check: Callable[[], None] | None = None,
    metadata: dict[str, str] | None = None,
) -> Uploaded:
    """Upload `local_path` to `key` of an S3 folder, check it back, and return what was published.

    `verify` defaults to `same_bytes(local_path)`. Raises ObjectExistsError (key taken, nothing
    written), UploadError (the store failed, or another writer replaced the object) or
    UploadVerifyError (read back wrong); after the upload, a failure deletes the object first
    if it is still ours. The local file is only read. `check` is called before each part of
    a multipart upload is read and may raise to stop it (the daemon stopping): the upload is
    then abandoned, nothing is published, and the exception propagates. `metadata`: user
    metadata the object carries (`x-amz-meta-NAME`; the write side's upload token).
    """
    if not isinstance(folder, S3Folder):
        raise TypeError(f"{folder.name}: put_verified writes to S3 folders only")
    url = folder.url_of(key)
    size = local_path.stat().st_size
    etag, conditional = _upload(
        folder, key, local_path, size, overwrite, single_put_max, chunk_size, check, metadata
    )
    try:
        _check_ours(folder, key, etag, size)
        (verify or same_bytes(local_path))(folder, key)
        _check_ours(folder, key, etag, size)
    except (DecantError, OSError) as exc:
        gone = _delete_if_ours(folder, key, etag)
        fate = "deleted it" if gone else "left it (it is not ours, or could not be deleted)"
        if isinstance(exc, StoreError) and not isinstance(exc, UploadVerifyError):
            # The store failed or the object changed under the check: not bad bytes of ours.
            raise UploadError(f"{exc}; {fate}") from None
        raise UploadVerifyError(
            f"{url}: uploaded, but it does not read back as {local_path.name}: {exc}; {fate}"
        ) from None
    log.info("%s: %d bytes published (ETag %s)", url, size, etag)
    return Uploaded(url, size, etag, conditional)


def multipart_plan(url: str, size: int, chunk_size: int) -> tuple[int, int]:
    """(part size, parts in flight) for a multipart upload of `size` bytes: parts of
    `chunk_size`, grown (in whole MiB) where 10,000 of them would not reach `size` (S3 refuses
    part numbers past 10,000: a file past 156 GiB could never complete, and was retried for
    good), and fewer
    in flight as they grow, so the buffers stay near PART_BUFFER. UploadError for an object
    larger than 10,000 parts of PART_BUFFER, before anything is sent."""
    part = max(chunk_size, -(-size // MAX_PARTS))
    part = -(-part // (1 << 20)) << 20
    if part > MAX_PART:
        raise UploadError(
            f"{url}: {size} bytes, more than one upload takes ({MAX_PARTS} parts of "
            f"{MAX_PART >> 20} MiB: {MAX_PARTS * MAX_PART >> 30} GiB)"
        )
    return part, max(1, min(PART_CONCURRENCY, PART_BUFFER // part))


def _upload(
    folder: S3Folder,
    key: str,
    local_path: Path,
    size: int,
    overwrite: bool,
    single_put_max: int,
    chunk_size: int,
    check: Callable[[], None] | None = None,
    metadata: dict[str, str] | None = None,
) -> tuple[str, bool]:
    """(ETag, conditional) of the object written; nothing is written when the key is taken."""
    url = folder.url_of(key)
    conditional = not overwrite and size <= single_put_max
    options: dict[str, Any]
    source: Any = local_path
    if conditional:
        options = {"mode": "create", "use_multipart": False}
    else:
        if not overwrite and folder.stat(key) is not None:
            raise ObjectExistsError(f"{url}: already exists (--force replaces it)")
        part, in_flight = multipart_plan(url, size, chunk_size)
        options = {"chunk_size": part, "max_concurrency": in_flight}
        at_end = None if overwrite else (lambda: _still_free(folder, key))
        if check is not None or at_end is not None:  # parts read through Python
            source = _Checked(local_path, check or (lambda: None), size, at_end)
    if metadata:
        options["attributes"] = metadata  # a key obstore does not know is user metadata
    try:
        result = obstore.put(folder.client, folder.full_key(key), source, **options)
    except AlreadyExistsError:
        raise ObjectExistsError(f"{url}: already exists (--force replaces it)") from None
    except (BaseError, OSError) as exc:
        if isinstance(source, _Checked) and source.stopped is not None:
            raise source.stopped from None  # the caller's own reason (the daemon stopping)
        raise UploadError(str(translate(exc, url, "upload:"))) from None
    finally:
        if isinstance(source, _Checked):
            source.close()
    etag = result.get("e_tag")
    if not etag:
        raise UploadError(f"{url}: the store returned no ETag for the upload")
    return etag, conditional


class _Checked:
    """A file obstore reads a multipart upload's parts from, calling `check` before each read.

    Given a Path, obstore reads the file in Rust and nothing stops the upload short of the
    process: a SIGTERM during the upload of a 20 GiB file left the daemon uploading (and the
    mount answering nothing) for as long as the upload ran (red team 50)."""

    def __init__(
        self, path: Path, check: Callable[[], None], size: int = -1,
        at_end: Callable[[], None] | None = None,
    ) -> None:  # fmt: skip
        self._file = path.open("rb")
        self._check = check
        self._size = size
        self._at_end = at_end  # called once, as the read of the last part's bytes ends
        self.stopped: BaseException | None = None

    def read(self, n: int = -1) -> bytes:
        try:
            self._check()
            data = self._file.read(n)
            if self._at_end is not None and (not data or self._file.tell() >= self._size):
                at_end, self._at_end = self._at_end, None
                at_end()
        except BaseException as exc:
            self.stopped = exc
            raise
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        self._file.close()


def _still_free(folder: S3Folder, key: str) -> None:
    """Before a multipart upload that must not overwrite completes (it cannot be made
    conditional): the key is looked at again as its last part is read, and the upload abandoned
    if another writer put an object there meanwhile. Looked at only when the upload began, a
    file moved there through another host while a 700 MiB upload ran was overwritten, the
    moved file's old name already deleted (red team 86, F2). What lands in the last parts'
    flight (under a second at the bench's speeds) is still overwritten.

    Called from obstore's read of the parts, on a thread of its runtime, where a call into
    obstore panics ("Cannot start a runtime from within a runtime"): the HEAD runs on a thread
    of its own."""
    with ThreadPoolExecutor(1, thread_name_prefix="decant-head") as pool:
        try:
            found = pool.submit(folder.stat, key).result()
        except StoreError as exc:  # the store failing during the upload: the upload fails
            raise UploadError(f"{folder.url_of(key)}: upload: {exc}") from None
    if found is not None:
        raise ObjectExistsError(f"{folder.url_of(key)}: already exists (put there during the "
                                "upload: not overwritten)")  # fmt: skip


def _check_ours(folder: S3Folder, key: str, etag: str, size: int) -> None:
    info = folder.stat(key)
    url = folder.url_of(key)
    if info is None:
        raise UploadError(f"{url}: gone after the upload (deleted by another writer?)")
    if info.etag != etag or info.size != size:
        raise UploadError(
            f"{url}: replaced by another writer after the upload "
            f"(ETag {info.etag}, {info.size} bytes; ours {etag}, {size} bytes)"
        )


def _delete_if_ours(folder: S3Folder, key: str, etag: str) -> bool:
    try:
        info = folder.stat(key)
        if info is None or info.etag != etag:
            return False
        obstore.delete(folder.client, folder.full_key(key))
    except (DecantError, BaseError, OSError) as exc:
        log.warning("%s: could not delete the bad upload: %s", folder.url_of(key), scrubbed(exc))
        return False
    log.warning("%s: deleted the upload that failed its check", folder.url_of(key))
    return True


def same_bytes(local_path: Path, block: int = COMPARE_BLOCK) -> Verify:
    """A verifier: the object, read by ranged GETs, equals `local_path` byte for byte."""

    def verify(folder: Folder, key: str) -> None:
        source = folder.open(key)
        try:
            with open(local_path, "rb") as fh:
                if source.size != fh.seek(0, 2):
                    raise UploadVerifyError(f"{source.name}: {source.size} bytes, local differs")
                fh.seek(0)
                for offset in range(0, source.size, block):
                    want = min(block, source.size - offset)
                    if fh.read(want) != source.read(offset, want):
                        raise UploadVerifyError(f"{source.name}: bytes differ at {offset}")
        finally:
            source.close()

    return verify


__all__ = [
    "CHUNK_SIZE",
    "SINGLE_PUT_MAX",
    "ObjectExistsError",
    "UploadError",
    "UploadVerifyError",
    "Uploaded",
    "put_verified",
    "same_bytes",
]
