"""`decant restore`'s pipeline (and `decant verify`'s): an original streamed in file order.

Decoders reconstruct whole regions ahead (a pixel segment is a view of its decoded plane, so
nothing is joined or copied), the calling thread hashes, and for a restore a writer thread writes
the same views meanwhile: each long call (decode, sha256, write) releases the GIL, so on two
cores the three overlap. Reading fixed 4 MiB blocks through `OriginalReader.read`, as before,
joined (copied) every block that crossed a region boundary and hashed and wrote in one thread.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from vfs.decant.limits import MAX_CHUNK_BYTES, compressed_bound
from vfs.decant.output import Output
from vfs.decant.reader import OriginalReader
from vfs.decant.store import Store, is_chunk_key
from vfs.errors import CorruptArchiveError

Views = list[bytes | memoryview]
Progress = Callable[[int], None] | None

JOB_BYTES = 8 << 20  # consecutive regions gathered into one decode job (about a plane)
DECODERS = 2  # planes decode in parallel: the hash and the write leave gaps on both cores
AHEAD = 3  # jobs decoded ahead of the one being hashed (each holds about one plane)
WRITE_AHEAD = 2  # jobs the writer may lag behind the hash: a slow write of one is absorbed
DIRECT = True  # write the output with O_DIRECT where the filesystem takes it (decant.output)


def jobs(reader: OriginalReader, job_bytes: int = 0) -> list[list[tuple[int, int]]]:
    """The original's regions in file order as (offset, length), grouped into jobs of about
    `job_bytes` (JOB_BYTES). A larger region is cut, so no job holds more than that."""
    job_bytes = job_bytes or JOB_BYTES
    out: list[list[tuple[int, int]]] = []
    job: list[tuple[int, int]] = []
    held = 0
    for region in reader.regions:
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
    out = Output(fd, DIRECT)
    with (
        ThreadPoolExecutor(DECODERS, thread_name_prefix="decant-restore") as decoders,
        ThreadPoolExecutor(1, thread_name_prefix="decant-write") as writer,
    ):
        writing: deque[Future[None]] = deque()
        for views in decoded(reader, decoders):
            while len(writing) > WRITE_AHEAD:
                writing.popleft().result()
            writing.append(writer.submit(out.write, views))
            for view in views:  # hashed here while the writer copies the same views
                digest.update(view)
            if progress:
                progress(sum(len(v) for v in views))
        while writing:
            writing.popleft().result()
    out.close()
    return digest.hexdigest()


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
