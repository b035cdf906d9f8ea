"""`decant restore`'s pipeline (and `decant verify`'s): an original streamed in file order.

Decoders reconstruct whole regions ahead (a pixel segment is a view of its decoded plane, so
nothing is joined or copied), the calling thread hashes, and for a restore a writer thread writes
the same views meanwhile: each long call (decode, sha256, write) releases the GIL, so on two
cores the three overlap. Reading fixed 4 MiB blocks through `OriginalReader.read`, as before,
joined (copied) every block that crossed a region boundary and hashed and wrote in one thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import hashlib
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from vfs.decant.limits import MAX_CHUNK_BYTES, compressed_bound
from vfs.decant.reader import OriginalReader
from vfs.decant.store import Store, is_chunk_key
from vfs.errors import CorruptArchiveError

Views = list[bytes | memoryview]
Progress = Callable[[int], None] | None

JOB_BYTES = 8 << 20  # consecutive regions gathered into one decode job (about a plane)
DECODERS = 2  # planes decode in parallel: the hash and the write leave gaps on both cores
AHEAD = 3  # jobs decoded ahead of the one being hashed (each holds about one plane)
WRITEBACK = 32 << 20  # ask the kernel to start writing back every this many bytes


def jobs(reader: OriginalReader, job_bytes: int = 0) -> list[list[tuple[int, int]]]:
    """The original's regions in file order as (offset, length), grouped into jobs of about
    `job_bytes` (JOB_BYTES). A larger region is cut, so no job holds more than that."""
    job_bytes = job_bytes or JOB_BYTES
    out: list[list[tuple[int, int]]] = []
    job: list[tuple[int, int]] = []
    held = 0
    for region in reader.regions.regions:
        offset, left = region.start, region.length
        while left > 0:
            n = min(left, job_bytes)
            job.append((offset, n))
            held += n
            offset, left = offset + n, left - n
            if held >= job_bytes:
                out.append(job)
                job, held = [], 0
    if job:
        out.append(job)
    return out


def _materialize(reader: OriginalReader, job: list[tuple[int, int]]) -> Views:
    """A job's bytes: one read per region, each a view of a cached plane or husk block."""
    return [reader.read(offset, n) for offset, n in job]


def decoded(reader: OriginalReader, pool: ThreadPoolExecutor) -> Iterator[Views]:
    """Every job's views in file order, up to AHEAD jobs decoding ahead of the consumer."""
    # Whole planes for every read: a small region must not take the partial-decode path (its
    # blocks would be decoded again when the rest of the plane is read).
    reader.partial_limit = 0
    pending: deque[Future[Views]] = deque()
    todo = iter(jobs(reader))
    try:
        for job in todo:
            pending.append(pool.submit(_materialize, reader, job))
            if len(pending) > AHEAD:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()


def write_original(reader: OriginalReader, fd: int, progress: Progress = None) -> str:
    """Write the original to `fd` from its current position; return its sha256 (hex).

    The caller compares it with the manifest and discards the file on a mismatch."""
    digest = hashlib.sha256()
    writeback = _Writeback(fd)
    with (
        ThreadPoolExecutor(DECODERS, thread_name_prefix="decant-restore") as decoders,
        ThreadPoolExecutor(1, thread_name_prefix="decant-write") as writer,
    ):
        writing: Future[None] | None = None
        for views in decoded(reader, decoders):
            if writing is not None:
                writing.result()
            writing = writer.submit(_write_views, fd, views, writeback)
            for view in views:  # hashed here while the writer copies the same views
                digest.update(view)
            if progress:
                progress(sum(len(v) for v in views))
        if writing is not None:
            writing.result()
    return digest.hexdigest()


def _write_views(fd: int, views: Views, writeback: _Writeback) -> None:
    for view in views:
        data = memoryview(view)
        while data.nbytes:
            written = os.write(fd, data)
            data = data[written:]
            writeback.wrote(written)


class _Writeback:
    """Starts the kernel's write-back of each WRITEBACK bytes as soon as they are written, so the
    fsync before the rename waits for the tail only (sync_file_range(2), SYNC_FILE_RANGE_WRITE:
    no waiting, no metadata). Where libc lacks it, the final fsync does all the work."""

    _FN: Any = False  # the libc function once looked up (None: there is none)

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.done = self.at = os.lseek(fd, 0, os.SEEK_CUR)

    def wrote(self, n: int) -> None:
        self.at += n
        if self.at - self.done >= WRITEBACK:
            fn = self._sync_file_range()
            if fn is not None:
                fn(self.fd, self.done, self.at - self.done, 2)  # SYNC_FILE_RANGE_WRITE
            self.done = self.at

    @classmethod
    def _sync_file_range(cls) -> Any:
        if cls._FN is False:
            fn = None
            with contextlib.suppress(OSError, AttributeError, TypeError):
                fn = ctypes.CDLL(ctypes.util.find_library("c") or None).sync_file_range
                fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                fn.restype = ctypes.c_int
            cls._FN = fn
        return cls._FN


def damaged_chunks(store: Store, limit: int = 3) -> list[str]:
    """After a sha256 mismatch: the chunks whose stored bytes fail the store's own check (a zip
    entry's CRC-32), to name in the error. Restore reads without that check: the sha256 of the
    whole output is the check that decides, and the CRC pass cost 0.04-0.13 s of CPU per
    512 MiB here (a sixth to half of the decode)."""
    bad: list[str] = []
    try:
        keys = store.all_keys()
    except NotImplementedError:
        return bad
    for key in keys:
        if not is_chunk_key(key):
            continue
        try:
            store.get(key, compressed_bound(MAX_CHUNK_BYTES))  # what a decode would read
        except CorruptArchiveError as exc:
            bad.append(str(exc))
            if len(bad) >= limit:
                break
    return bad
