"""Daemon memory stays near --cache-size under random reads of files still being verified.

A shortened `tools/bench.py rss` scenario A: two 64 MiB stacks, --cache-size 64M, a fresh index,
4 threads of random 4 KiB preads on their own descriptors for 10 s. The bound is generous
(cache + 400 MiB, where the target is cache + 150): it is here to catch a regression to the
GiBs once seen, when parked and queued reads pinned whole decoded planes. No timing is asserted.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tests.toolbox import in_threads, proc_status

MiB = 1 << 20
CACHE = 64 * MiB
BOUND = CACHE + 400 * MiB
PLANE = (2048, 2048)  # uint16: 8 MiB per plane, 8 planes per 64 MiB file


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SRC holding two packed 64 MiB uint16 stacks (a smooth field plus noise)."""
    from vfs.decant.packer import pack_file

    base = tmp_path_factory.mktemp("memory-bounds")
    src = base / "src"
    src.mkdir()
    yy = np.arange(PLANE[0], dtype=np.float32)[:, None]
    xx = np.arange(PLANE[1], dtype=np.float32)[None, :]
    for seed, name in enumerate(("a.tif", "b.tif")):
        rng = np.random.default_rng(seed)
        smooth = 1500 + 900 * np.sin(xx / (300 + 40 * seed)) * np.cos(yy / 270)
        stack = np.stack(
            [(smooth + 30 * z).astype(np.uint16) + rng.integers(0, 64, PLANE, np.uint16)
             for z in range(8)]
        )  # fmt: skip
        tifffile.imwrite(base / name, stack, metadata={"axes": "ZYX"})
        del stack
        pack_file(base / name, src / f"{name}.zarr.zip")
        (base / name).unlink()
    return src


def random_preads(paths: list[Path], threads: int, seconds: float, size: int = 4096) -> int:
    fds = [os.open(paths[k % len(paths)], os.O_RDONLY) for k in range(threads)]
    counts = [0] * threads
    errors: list[OSError] = []
    deadline = time.monotonic() + seconds

    def work(k: int) -> None:
        rng = random.Random(k)
        pages = (os.fstat(fds[k]).st_size - size) // 4096
        try:
            while time.monotonic() < deadline:
                assert len(os.pread(fds[k], size, rng.randrange(pages) * 4096)) == size
                counts[k] += 1
        except OSError as exc:
            errors.append(exc)

    in_threads(work, threads)
    for fd in fds:
        os.close(fd)
    assert not errors, errors
    return sum(counts)


def test_random_reads_while_hashing_stay_near_the_cache_size(stacks: Path, make_mount) -> None:  # type: ignore[no-untyped-def]
    m = make_mount(stacks, "--read-only", "--cache-size", "64M")
    assert m.proc is not None
    paths = [m.mnt / "a.tif", m.mnt / "b.tif"]
    assert {os.getxattr(p, "user.decant.verified") for p in paths} <= {b"unknown", b"pending"}
    reads = random_preads(paths, threads=4, seconds=10.0)
    peak = proc_status(m.proc.pid, "VmHWM")
    time.sleep(2)  # handles closed: queued verifications may still be reading
    end = proc_status(m.proc.pid, "VmRSS")
    assert reads > 0
    assert peak < BOUND, f"peak RSS {peak // MiB} MiB over {BOUND // MiB} after {reads} preads"
    assert end < BOUND, f"RSS {end // MiB} MiB over {BOUND // MiB} once every handle closed"


def test_many_random_readers_of_a_file_being_verified_park_nothing_for_the_hash(  # type: ignore[no-untyped-def]
    stacks: Path, make_mount
) -> None:
    """Sixteen handles of random 1 MiB reads, an 8 MiB cache. Each handle's running hash used
    to park copies of reads far ahead of it (up to 8 MiB a handle) before giving up; a 537 MiB
    file read so peaked at 357 MiB, these 313-333 MiB; then 152-195 MiB, over the cache +
    150 MiB target (whole 8 MiB planes decoding in flight for a cache that holds one); now
    105-106 MiB, the planes being read block by block. The bound is the target."""
    m = make_mount(stacks, "--read-only", "--cache-size", "8M")
    assert m.proc is not None
    reads = random_preads([m.mnt / "a.tif"], threads=16, seconds=6.0, size=MiB)
    peak = proc_status(m.proc.pid, "VmHWM")
    bound = 8 * MiB + 150 * MiB
    assert reads > 0
    assert peak < bound, f"peak RSS {peak // MiB} MiB over {bound // MiB} after {reads} preads"


def test_files_larger_than_the_cache_stream_whole_first_read_and_verified(  # type: ignore[no-untyped-def]
    stacks: Path, make_mount
) -> None:
    """A 64 MiB file with --cache-size 64M does not fit with its read-ahead: a forward reader
    drops the planes behind it and their buffers decode the planes ahead (while views of them
    may still wait to be hashed). sha256sum reads each file hashing, then verified with the
    kernel's copy dropped, and gets the recorded sha256 both times."""
    m = make_mount(stacks, "--read-only", "--cache-size", "64M")
    for name in ("a.tif", "b.tif"):
        path = m.mnt / name
        want = os.getxattr(path, "user.decant.sha256").decode()
        for verified in (b"unknown", b"yes"):
            assert os.getxattr(path, "user.decant.verified") in {verified, b"pending"}
            run = subprocess.run(["sha256sum", str(path)], capture_output=True, text=True)
            assert run.returncode == 0, run.stderr
            assert run.stdout.split()[0] == want
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # next pass reaches the daemon
            os.close(fd)
        assert os.getxattr(path, "user.decant.verified") == b"yes"


def test_planes_the_cache_cannot_keep_are_served_block_by_block(  # type: ignore[no-untyped-def]
    stacks: Path, make_mount
) -> None:
    """--cache-size 8M and planes of 8 MiB: `sha256sum` (32 KiB reads, the file not verified
    yet) used to decode a whole plane for every read, as none stayed in the cache (a 256 MiB
    stack: 106 s). Now each read decodes the blosc blocks it needs, kept one by one: the
    cache's misses stay near the file's blocks (256 of 256 KiB here), not its reads (2,048)."""
    m = make_mount(stacks, "--read-only", "--cache-size", "8M")
    path = m.mnt / "a.tif"
    run = subprocess.run(["sha256sum", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[0] == os.getxattr(path, "user.decant.sha256").decode()
    status = json.loads((m.mnt / ".decant-status").read_text())["daemon"]
    assert status["reads"] >= 2048, status  # 64 MiB in 32 KiB requests
    assert status["cache"]["misses"] < 1024, status


def test_handles_on_many_archives_park_for_their_hashes_within_one_bound(  # type: ignore[no-untyped-def]
    stacks: Path, tmp_path: Path, make_mount
) -> None:
    """80 handles, on 80 links of one archive (each another archive to the mount), each read
    1 MiB at 1, 2 and 3 MiB and held open: every running hash parks its reads (they are ahead
    of its position, and close), and each handle may park up to 8 MiB. With a 64 MiB cache the
    daemon grew by 306 MiB for 60 such handles, and a user may hold 4,096. Now all hashes
    together park at most PARKED_MAX; a hash past it gives up (the file is verified aside)."""
    from vfs.integrity import PARKED_MAX

    src = tmp_path / "links"
    src.mkdir()
    for i in range(80):
        os.link(stacks / "a.tif.zarr.zip", src / f"a{i:02d}.tif.zarr.zip")
    m = make_mount(src, "--read-only", "--cache-size", "64M")
    assert m.proc is not None
    names = sorted(os.listdir(m.mnt))
    assert len(names) == 80
    before = proc_status(m.proc.pid, "VmRSS")
    fds = [os.open(m.mnt / name, os.O_RDONLY) for name in names]
    try:
        for fd in fds:
            for at in (1, 2, 3):
                assert len(os.pread(fd, MiB, at * MiB)) == MiB
        time.sleep(0.5)  # the last reads reach their hashers
        grown = proc_status(m.proc.pid, "VmHWM") - before
    finally:
        for fd in fds:
            os.close(fd)
    bound = CACHE + PARKED_MAX + 60 * MiB
    assert grown < bound, f"grew {grown // MiB} MiB holding 80 handles, over {bound // MiB}"
