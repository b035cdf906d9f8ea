"""Sixteen readers at once of a GDI package member and a decant original through one daemon:
every byte right, and the daemon's peak RSS within --cache-size + 150 MiB.

Buffers kept for reuse (decode buffers, a package's idle decryption buffers, each reading
thread's read buffer) sat beside a full cache and took such readers 60-120 MiB past that bound;
they count in the cache's budget now (vfs.cache.PageCache.counts_idle, vfs.threadbuffers).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tests.mount.test_write_side import MakeMount
from tests.toolbox import in_threads, load_tool, proc_status

corpus = load_tool("make_c4gh_corpus")
MiB = 1 << 20
CACHE = 256 * MiB
BOUND = CACHE + 150 * MiB
SECONDS = 12
SIZES = [1, 4096, 65536, 300_000, MiB, 2 * MiB]


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Path]:
    """(SRC, node key, the member's plaintext, the original TIFF): a package of one 320 MiB
    member and the archive of a 256 MiB uint16 stack (8 MiB planes, a smooth field + noise)."""
    from vfs.decant.packer import pack_file

    base = tmp_path_factory.mktemp("concurrent-memory")
    src = base / "src"
    src.mkdir()
    keys = {n: corpus.make_keypair(base / "keys", n) for n in ("node", "writer")}
    plain = base / "member.bin"
    plain.write_bytes(os.urandom(320 * MiB))
    corpus.write_package(src / "p.tar.c4gh",
                         corpus.with_manifest([("member.bin", plain.read_bytes())]),
                         keys["writer"], [keys["node"]])  # fmt: skip
    yy = np.arange(2048, dtype=np.float32)[:, None]
    xx = np.arange(2048, dtype=np.float32)[None, :]
    smooth = 1500 + 900 * np.sin(xx / 300) * np.cos(yy / 270)
    rng = np.random.default_rng(5)
    stack = np.stack([(smooth + 30 * z).astype(np.uint16) + rng.integers(0, 64, (2048, 2048),
                      np.uint16) for z in range(32)])  # fmt: skip
    tif = base / "stack.tif"
    tifffile.imwrite(tif, stack, metadata={"axes": "ZYX"})
    del stack
    pack_file(tif, src / "stack.tif.zarr.zip")
    return src, keys["node"].secret_path, plain, tif


def churn(path: Path, reference: Path, threads: int, seconds: float) -> list[str]:
    """`threads` readers of `path` on their own descriptors, half streaming 1 MiB reads, half
    random reads of 1 byte to 2 MiB, each read compared with `reference`: what went wrong."""
    size = reference.stat().st_size
    wrong: list[str] = []
    deadline = time.monotonic() + seconds

    def work(k: int) -> None:
        rnd = random.Random(k)
        fd, ref = os.open(path, os.O_RDONLY), os.open(reference, os.O_RDONLY)
        pos = rnd.randrange(size)
        try:
            while time.monotonic() < deadline and not wrong:
                if k % 2:
                    off, n = rnd.randrange(size), rnd.choice(SIZES)
                else:
                    off, n = pos, MiB
                    pos = (pos + n) % size
                if os.pread(fd, n, off) != os.pread(ref, n, off):
                    wrong.append(f"{path.name}: {n} bytes at {off}")
        except OSError as exc:
            wrong.append(f"{path.name}: {exc}")
        finally:
            os.close(fd)
            os.close(ref)

    in_threads(work, threads)
    return wrong


def test_sixteen_readers_of_a_member_and_an_original_stay_within_the_bound(
    src: tuple[Path, Path, Path, Path], make_mount: MakeMount
) -> None:
    folder, key, plain, tif = src
    m = make_mount(folder, "--c4gh-key", str(key), "--cache-size", "256M")
    member, original = m.mnt / "p.tar.c4gh" / "member.bin", m.mnt / "stack.tif"
    assert member.stat().st_size == plain.stat().st_size
    wrong: list[str] = []
    sets = [(member, plain), (original, tif)]  # eight readers of each, at once
    in_threads(lambda k: wrong.extend(churn(*sets[k], 8, SECONDS)), 2)
    assert not wrong, wrong[:5]
    peak = proc_status(m.proc.pid, "VmHWM")
    assert peak <= BOUND, f"peak RSS {peak / MiB:.0f} MiB, over cache + 150 ({BOUND / MiB:.0f})"


def test_thirty_two_readers_of_an_original_under_a_small_cache_stay_within_the_bound(
    src: tuple[Path, Path, Path, Path], make_mount: MakeMount
) -> None:
    """Red team 52 F1: under `--cache-size 32M`, six plane decodes in flight (four request
    threads, two read-ahead threads) sat beside the cache, which could only evict for them.
    Every reader's decodes now hold at most half the cache together (PageCache.decodes).
    Before, this peaked at 184-196 MiB (bound 182); now ~145."""
    folder, key, _plain, tif = src
    m = make_mount(folder, "--c4gh-key", str(key), "--cache-size", "32M")
    wrong = churn(m.mnt / "stack.tif", tif, 32, SECONDS)
    assert not wrong, wrong[:5]
    peak, bound = proc_status(m.proc.pid, "VmHWM"), 32 * MiB + 150 * MiB
    assert peak <= bound, f"peak RSS {peak / MiB:.0f} MiB, over cache + 150 ({bound / MiB:.0f})"
