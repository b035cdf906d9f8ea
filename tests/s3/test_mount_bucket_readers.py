"""Unlucky readers of one original through a bucket mount (real SeaweedFS, real daemon): the
background verification a partial read queues reads ahead like a handle does; several processes
reading one file at once in different orders all get its bytes; an archive replaced in the
bucket under a reader gives ESTALE, never bytes of the new object. What the daemon fetched is
read from its `.decant-status`; every byte served is compared with the original TIFF."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import obstore
import pytest
from obstore.store import S3Store

from tests.mount.conftest import HAVE_FUSE, Mount
from tests.s3.conftest import S3Bucket
from vfs.decant.store import is_chunk_key

pytestmark = [
    pytest.mark.mount,
    pytest.mark.skipif(not HAVE_FUSE, reason="needs /dev/fuse and fusermount3"),
]

MiB = 1 << 20
NAME = "stack.tif"


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 24 MiB stack of 512 KiB planes (a ramp with noise: compresses to ~17 MiB), one chunk a
    plane: many more chunks than read-ahead runs need GETs."""
    import numpy as np
    import tifffile

    from vfs.decant.packer import PackOptions, pack_file

    out = tmp_path_factory.mktemp("readers")
    rng = np.random.default_rng(11)
    ramp = np.arange(256 * 1024, dtype=np.uint16).reshape(256, 1024) // 9
    stack = np.stack([ramp + rng.integers(0, 1024, ramp.shape, dtype=np.uint16) for _ in range(48)])
    tif = out / NAME
    tifffile.imwrite(tif, stack, photometric="minisblack")
    return tif, pack_file(tif, out / f"{NAME}.zarr.zip", PackOptions()).archive


class Daemon:
    """A bucket mount and what its `.decant-status` says."""

    def __init__(self, mount: Mount) -> None:
        self.mount = mount
        self.mnt = mount.mnt

    def status(self) -> dict[str, Any]:
        return json.loads((self.mnt / ".decant-status").read_text())["daemon"]  # type: ignore[no-any-return]

    def fetched(self) -> tuple[int, int]:
        """(GETs, bytes fetched) so far."""
        s3 = self.status()["s3"]
        return int(s3["gets"]), int(s3["bytes_fetched"])

    def settled(self, timeout: float = 30.0) -> tuple[int, int]:
        """`fetched()` once no GET was made for a second (read-ahead and verification done)."""
        seen: list[tuple[int, int]] = []

        def idle() -> bool:
            seen.append(self.fetched())
            return len(seen) > 5 and seen[-1] == seen[-6]

        wait_for(idle, timeout, "no GET for a second")
        return seen[-1]


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    import time

    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what}: not after {timeout} s")
        time.sleep(0.2)


@pytest.fixture
def daemon(
    s3_bucket: S3Bucket, packed: tuple[Path, Path], tmp_path: Path
) -> Iterator[Callable[..., Daemon]]:
    obstore.put(store(s3_bucket), s3_bucket.key(f"{NAME}.zarr.zip"), packed[1].read_bytes())
    mounts: list[Mount] = []

    def start(*extra: str) -> Daemon:
        m = Mount(s3_bucket.url(), tmp_path / "mnt", tmp_path / "mnt.log", tmp_path / "index")  # type: ignore[arg-type]
        mounts.append(m)
        return Daemon(m.start(*extra))

    yield start
    for m in mounts:
        m.stop()


def store(bucket: S3Bucket) -> S3Store:
    return S3Store(bucket.name, client_options={"allow_http": True})  # endpoint from AWS_*


def chunk_count(archive: Path) -> int:
    with zipfile.ZipFile(archive) as zf:
        return sum(1 for i in zf.infolist() if is_chunk_key(i.filename))


def another_stack(tmp_path: Path) -> tuple[Path, Path]:
    """Another original named like the packed one (4 planes of 7s), and its archive: what
    another host puts in the bucket in its place."""
    import numpy as np
    import tifffile

    from vfs.decant.packer import PackOptions, pack_file

    other = tmp_path / "other" / NAME
    other.parent.mkdir()
    tifffile.imwrite(other, np.full((4, 256, 1024), 7, dtype=np.uint16), photometric="minisblack")
    return other, pack_file(other, tmp_path / "other.zarr.zip", PackOptions()).archive


def test_the_verification_a_partial_read_queues_reads_ahead(
    daemon: Callable[..., Daemon], packed: tuple[Path, Path]
) -> None:
    """A handle that read a few bytes and closed queues a verification of the whole file. It
    read the archive chunk by chunk, each chunk a GET waited for in turn (one per chunk, where a
    sequential read through a handle makes one per read-ahead run): from a distant bucket,
    tens of round trips per hundred MiB."""
    tif, archive = packed
    d = daemon()
    path = d.mnt / NAME
    before = d.fetched()
    with open(path, "rb") as fh:
        fh.seek(tif.stat().st_size // 2)
        assert fh.read(4096) == tif.read_bytes()[fh.tell() - 4096 : fh.tell()]
    wait_for(lambda: d.status()["verified"] == 1, 60, "verified in the background")
    gets, fetched = (a - b for a, b in zip(d.settled(), before, strict=True))
    chunks = chunk_count(archive)
    size = archive.stat().st_size
    # Once is ~size in a few 16 MiB runs (plus the open's tail and the partial read's blocks).
    assert fetched < size * 1.5, (fetched, size)
    assert gets < chunks // 2, f"{gets} GETs for {chunks} chunks: one a chunk, no read-ahead"


BACKWARDS = """
import os, sys
path, size, step = sys.argv[1], int(sys.argv[2]), 1 << 20
fd = os.open(path, os.O_RDONLY)
parts = []
for off in range((size - 1) // step * step, -1, -step):
    parts.append(os.pread(fd, step, off))
sys.stdout.buffer.write(b"".join(reversed(parts)))
"""

RANDOM = """
import os, random, sys
path, size = sys.argv[1], int(sys.argv[2])
rng, fd = random.Random(7), os.open(path, os.O_RDONLY)
for _ in range(200):
    off = rng.randrange(size)
    data = os.pread(fd, 65536, off)
    sys.stdout.buffer.write(off.to_bytes(8, "little") + len(data).to_bytes(4, "little") + data)
"""


def test_readers_of_one_original_at_once_get_its_bytes_and_fetch_it_a_bounded_number_of_times(
    daemon: Callable[..., Daemon], packed: tuple[Path, Path]
) -> None:
    """Five processes read one original at once, each in its own order through its own
    handle: `dd` from the start, `dd` from the middle, `cat`, a reader going backwards in
    1 MiB steps, and one reading 64 KiB at random offsets. Each gets the original's bytes; the
    daemon fetches the archive at most once per reader and once for the verification (the
    handles share one opened archive and its read-ahead; read-ahead thrown away and fetched
    again without end, or two passes of one handle fetching twice, break the bound)."""
    import sys

    tif, archive = packed
    original = tif.read_bytes()
    size = len(original)
    d = daemon()
    path = str(d.mnt / NAME)
    before = d.fetched()
    half = size // 2 // (1 << 20)
    cmds = [
        ["dd", f"if={path}", "bs=1M", "status=none"],
        ["dd", f"if={path}", "bs=1M", f"skip={half}", "status=none"],
        ["cat", path],
        [sys.executable, "-c", BACKWARDS, path, str(size)],
        [sys.executable, "-c", RANDOM, path, str(size)],
    ]
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for c in cmds]
    outs = [p.communicate(timeout=120) for p in procs]
    for cmd, p, (_out, err) in zip(cmds, procs, outs, strict=True):
        assert p.returncode == 0, (cmd[0], err)
    whole = hashlib.sha256(original).hexdigest()
    for i in (0, 2, 3):
        assert hashlib.sha256(outs[i][0]).hexdigest() == whole, cmds[i][0]
    assert outs[1][0] == original[half << 20 :]
    stream, reads = outs[4][0], 0
    while stream:
        off = int.from_bytes(stream[:8], "little")
        n = int.from_bytes(stream[8:12], "little")
        assert stream[12 : 12 + n] == original[off : off + 65536], off
        stream, reads = stream[12 + n :], reads + 1
    assert reads == 200
    wait_for(lambda: d.status()["verified"] == 1, 60, "verified")
    _gets, fetched = (a - b for a, b in zip(d.settled(), before, strict=True))
    # Measured 2.3x here: the readers overlap, and the page cache serves some of each.
    assert fetched < (len(cmds) + 1) * archive.stat().st_size, (fetched, archive.stat().st_size)
    assert d.status()["errors"] == {}


def read_on_after(path: Path, original: bytes, change: Callable[[], object]) -> list[str]:
    """Read `path` in 1 MiB steps, calling `change` (the archive replaced or deleted in the
    bucket) after the first: each later read gives the original's bytes ("old", fetched before)
    or ESTALE ("stale"), never anything else."""
    outcomes = []
    with open(path, "rb", buffering=0) as fh:
        assert fh.read(1 << 20) == original[: 1 << 20]
        change()
        for off in range(1 << 20, len(original), 1 << 20):
            try:
                data = os.pread(fh.fileno(), 1 << 20, off)
            except OSError as exc:
                assert exc.errno == errno.ESTALE, exc
                outcomes.append("stale")
                continue
            assert data == original[off : off + (1 << 20)], off
            outcomes.append("old")
    return outcomes


def test_an_archive_replaced_under_a_reader_gives_estale_never_the_new_bytes(
    daemon: Callable[..., Daemon],
    packed: tuple[Path, Path],
    s3_bucket: S3Bucket,
    tmp_path: Path,
) -> None:
    """The archive is replaced in the bucket (a new ETag) while a handle reads it in order, and
    read-ahead GETs pinned to the old ETag are in flight or queued: every read gives the old
    original's bytes (what read-ahead fetched before) or ESTALE, never the new object's; a new
    open reads the new original."""
    tif, _archive = packed
    original = tif.read_bytes()
    other, replacement = another_stack(tmp_path)
    # Read-ahead of 2 MiB (a 4th of the cache): most of the archive is read after the put.
    d = daemon("--cache-size", "8M", "--relist", "1s")
    path = d.mnt / NAME
    key = s3_bucket.key(f"{NAME}.zarr.zip")
    change = lambda: obstore.put(store(s3_bucket), key, replacement.read_bytes())  # noqa: E731
    assert "stale" in read_on_after(path, original, change)
    new = other.read_bytes()
    wait_for(lambda: path.stat().st_size == len(new), 30, "the new archive described")
    assert path.read_bytes() == new


def test_an_archive_deleted_under_a_reader_gives_estale_never_enoent(
    daemon: Callable[..., Daemon], packed: tuple[Path, Path], s3_bucket: S3Bucket
) -> None:
    """The archive is deleted from the bucket (another host's `rm`) while a handle reads it in
    order: every read gives the original's bytes (fetched before) or ESTALE. It gave ENOENT,
    "no such file", to a reader holding the file open (red team 50s)."""
    tif, _archive = packed
    original = tif.read_bytes()
    d = daemon("--cache-size", "8M")
    key = s3_bucket.key(f"{NAME}.zarr.zip")
    change = lambda: obstore.delete(store(s3_bucket), key)  # noqa: E731
    assert "stale" in read_on_after(d.mnt / NAME, original, change)


def test_an_archive_replaced_after_its_listing_opens_as_the_new_one(
    daemon: Callable[..., Daemon],
    packed: tuple[Path, Path],
    s3_bucket: S3Bucket,
    tmp_path: Path,
) -> None:
    """Another host replaces an archive this mount has listed (and verified), and the next
    relisting is far off: the open finds the object's ETag is not the listed one, gives ESTALE,
    and the key is listed again, so the kernel's retry opens the new original. Before, the open
    pinned the new object under the old listing's size and digests: every read failed with EIO,
    logged as damage, until the next relisting."""
    tif, _archive = packed
    other, replacement = another_stack(tmp_path)
    d = daemon("--relist", "10m")
    path = d.mnt / NAME
    assert path.read_bytes() == tif.read_bytes()
    wait_for(lambda: os.getxattr(path, "user.decant.verified") == b"yes", 30, "verified")
    obstore.put(store(s3_bucket), s3_bucket.key(f"{NAME}.zarr.zip"), replacement.read_bytes())
    got = subprocess.run(["cat", str(path)], capture_output=True, timeout=60, check=False)
    if got.returncode != 0:  # at most once: the key is listed again before the error returns
        assert b"Stale file handle" in got.stderr, got.stderr
        got = subprocess.run(["cat", str(path)], capture_output=True, timeout=60, check=False)
    assert got.returncode == 0, got.stderr
    assert hashlib.sha256(got.stdout).hexdigest() == hashlib.sha256(other.read_bytes()).hexdigest()
    assert "damaged" not in d.mount.log_text()


def test_handles_of_one_archive_share_its_opening(
    daemon: Callable[..., Daemon], packed: tuple[Path, Path]
) -> None:
    """Eight more handles opened on one original of a bucket archive while a first is open share
    its opened archive, as a local archive's handles do: they fetch less than the first did.
    Each used to GET the zip's tail and its metadata and keep its own parsed directory and
    manifest (memory that grows with the archive's entries, per handle). Each open still checks
    the object is the version listed, and every byte is the original's."""
    tif, _archive = packed
    original = tif.read_bytes()
    offset = 3 * MiB + 4096
    d = daemon()
    os.stat(d.mnt / NAME)  # listed and described (GETs of its own) before the counts start
    before = d.fetched()[0]
    fds = [os.open(d.mnt / NAME, os.O_RDONLY)]
    try:
        assert os.pread(fds[0], 4096, offset) == original[offset : offset + 4096]
        alone = d.fetched()[0] - before  # the opening and the block the read needs
        before = d.fetched()[0]
        fds += [os.open(d.mnt / NAME, os.O_RDONLY) for _ in range(8)]
        for fd in fds[1:]:
            assert os.pread(fd, 4096, offset) == original[offset : offset + 4096]
        more = d.fetched()[0] - before
    finally:
        for fd in fds:
            os.close(fd)
    # Before: 6 GETs for the first handle, 32 more for the next eight (a tail and the
    # archive's metadata each); the block they read is in the page cache either way.
    assert alone > 0 and more < alone, (more, alone)
