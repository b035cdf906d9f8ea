"""Several readers streaming one GDI package member at once, through a real mount."""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.mount.test_write_side import MakeMount
from tests.toolbox import load_tool

corpus = load_tool("make_c4gh_corpus")
MiB = 1 << 20


def test_readers_streaming_parts_of_one_member_at_once_each_get_its_bytes(
    tmp_path: Path, make_mount: MakeMount
) -> None:
    """Four threads read a quarter each with 1 MiB preads, as a parallel copy tool does, on a
    fresh daemon and then on a verified one: their read-aheads queue pages behind each other's,
    so reads load whole pages themselves (vfs.backends.c4gh `_load_pages`) while the
    decrypting threads load others of the same pages."""
    src = tmp_path / "src"
    src.mkdir()
    keys = {n: corpus.make_keypair(tmp_path / "keys", n) for n in ("node", "writer")}
    data = random.Random(7).randbytes(48 * MiB + 12345)
    corpus.write_package(src / "p.tar.c4gh", corpus.with_manifest([("m.bin", data)]),
                         keys["writer"], [keys["node"]])  # fmt: skip
    m = make_mount(src, "--c4gh-key", str(keys["node"].secret_path), "--cache-size", "32M")
    member = m.mnt / "p.tar.c4gh" / "m.bin"
    quarter = -(-len(data) // 4)

    def stream(part: int) -> bool:
        fd = os.open(member, os.O_RDONLY)
        try:
            pos, end = part * quarter, min((part + 1) * quarter, len(data))
            while pos < end:
                got = os.pread(fd, min(MiB, end - pos), pos)
                if got != data[pos : pos + len(got)] or not got:
                    return False
                pos += len(got)
            return True
        finally:
            os.close(fd)

    for _ in range(2):  # unverified (hashing, direct_io), then verified (the kernel's cache)
        with ThreadPoolExecutor(4) as pool:
            assert all(pool.map(stream, range(4)))
        fd = os.open(member, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the next pass reads the daemon
        os.close(fd)
    assert "Traceback" not in m.log_text()


def test_parallel_readers_of_a_member_with_a_tampered_segment_get_eio_there_only(
    tmp_path: Path, make_mount: MakeMount
) -> None:
    """The same four readers, one cipher segment of the member flipped: a whole page loaded by
    a read or a read-ahead skips the bad segment, and every read that needs it fails (EIO)
    while every other read gets the member's bytes."""
    src = tmp_path / "src"
    src.mkdir()
    keys = {n: corpus.make_keypair(tmp_path / "keys", n) for n in ("node", "writer")}
    data = random.Random(8).randbytes(24 * MiB)
    corpus.write_package(tmp_path / "p.tar.c4gh", corpus.with_manifest([("m.bin", data)]),
                         keys["writer"], [keys["node"]])  # fmt: skip
    bad_segment = 200  # in the member's seventh page
    package = (tmp_path / "p.tar.c4gh").read_bytes()
    (src / "p.tar.c4gh").write_bytes(corpus.tamper(package, bad_segment))
    m = make_mount(src, "--c4gh-key", str(keys["node"].secret_path), "--cache-size", "32M")
    member = m.mnt / "p.tar.c4gh" / "m.bin"
    quarter = len(data) // 4
    failed: list[int] = []

    def stream(part: int) -> bool:
        fd = os.open(member, os.O_RDONLY)
        try:
            for pos in range(part * quarter, (part + 1) * quarter, MiB):
                try:
                    got = os.pread(fd, MiB, pos)
                except OSError as exc:
                    assert exc.errno == 5
                    failed.append(pos)
                    continue
                if got != data[pos : pos + MiB]:
                    return False
            return True
        finally:
            os.close(fd)

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(stream, range(4)))
    # The bad segment's plaintext lies in one or two of the 1 MiB reads, whatever the member's
    # offset in the package: those reads failed, and only those.
    assert 1 <= len(failed) <= 2, failed
    assert max(failed) - min(failed) <= MiB
    assert "Traceback" not in m.log_text()
