"""A byte rots on disk under an archive that verified: written into the loop device's image, not
through the filesystem, so the archive's size, mtime, inode and ctime stay those its verified
state and digest map were recorded for. A fresh daemon on the same index then checks each small
read against the digest of the one blosc block it decodes: the read of the rotten block gives
EIO and the log names the chunk and the block. A read of another block of the same plane before
it is served byte-exact, without the whole compressed plane being read to check it; once the rot
is found, the original fails whole (its archive is known damaged)."""

from __future__ import annotations

import errno
import hashlib
import os
import struct
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile

from tests.mount.test_ingest_space import ext4_src  # noqa: F401 (a fixture)
from tests.mount.test_write_side import status, wait_status
from vfs.cache import PageCache
from vfs.decant.blosc_blocks import block_spans, parse_header
from vfs.decant.packer import PackOptions, pack_file
from vfs.decant.reader import DecantArchive

CHUNK = "0/1.0.0"  # plane 1 of the z-stack


def _stack(path: Path) -> bytes:
    """Three 2048×2048 uint16 planes, smooth plus a little noise: they compress, in blocks."""
    rng = np.random.default_rng(5)
    yy, xx = np.mgrid[0:2048, 0:2048]
    planes = [(yy + xx + 7 * k) % 4096 + rng.integers(0, 16, (2048, 2048)) for k in range(3)]
    tifffile.imwrite(path, np.stack(planes).astype(np.uint16), photometric="minisblack")
    return path.read_bytes()


def _data_offset(archive: Path, name: str) -> int:
    """Where entry `name`'s stored bytes start in the zip (after its local header)."""
    with zipfile.ZipFile(archive) as zf:
        info = zf.getinfo(name)
        assert info.compress_type == zipfile.ZIP_STORED
    with open(archive, "rb") as fh:
        fh.seek(info.header_offset)
        local = fh.read(30)
    name_len, extra_len = struct.unpack_from("<HH", local, 26)
    return info.header_offset + 30 + name_len + extra_len


def _on_device(path: Path, offset: int) -> int:
    """The byte of the filesystem image holding byte `offset` of `path` (filefrag's extents,
    in 512-byte units: exact whatever the filesystem's block size; a 64 MiB ext4 has 1 KiB)."""
    out = subprocess.run(["filefrag", "-v", "-b512", str(path)], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    block, within = divmod(offset, 512)
    for line in out.splitlines():
        parts = line.replace(":", " ").replace("..", " ").split()
        if len(parts) < 5 or not parts[0].isdigit():
            continue
        first, last, physical = int(parts[1]), int(parts[2]), int(parts[3])
        if first <= block <= last:
            return (physical + block - first) * 512 + within
    raise AssertionError(f"no extent of {path} holds byte {offset}:\n{out}")


def _in_file(archive: Path, page: int, pos: int) -> int:
    """The original's file offset of byte `pos` of page `page`'s bytes."""
    with DecantArchive.open(archive) as opened:
        (info,) = opened.originals()
        reader = opened.open_original(info.relpath, PageCache(0))
        for r in reader.regions:
            if r.page == page and r.pos <= pos < r.pos + r.length:
                return int(r.start + pos - r.pos)
    raise AssertionError(f"page {page} has no byte {pos}")


def test_a_rotten_block_of_a_verified_archive_fails_its_read_alone(
    ext4_src: Path,  # noqa: F811
    make_mount: Any,
    tmp_path: Path,
) -> None:
    original = _stack(tmp_path / "stack.tif")
    archive = pack_file(tmp_path / "stack.tif", ext4_src / "stack.tif.zarr.zip", PackOptions())
    path = archive.archive
    with zipfile.ZipFile(path) as zf:
        raw = zf.read(CHUNK)
    h = parse_header(raw, len(raw))
    assert h is not None and not h.memcpyed and h.nblocks >= 4, h
    spans = block_spans(h, raw)
    rotten, fine = 1, 3
    mid = (spans[rotten][0] + spans[rotten][1]) // 2

    m = make_mount(ext4_src)
    shown = m.mnt / "stack.tif"
    assert hashlib.sha256(shown.read_bytes()).hexdigest() == hashlib.sha256(original).hexdigest()
    wait_status(m.mnt, lambda doc: doc["daemon"]["verified"] == 1)
    m.stop()

    before = os.stat(path)
    device_byte = _on_device(path, _data_offset(path, CHUNK) + mid)
    image = ext4_src.parent / "src.img"
    os.sync()
    with open(image, "r+b") as fh:
        fh.seek(device_byte)
        byte = fh.read(1)
        fh.seek(device_byte)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    with zipfile.ZipFile(path) as zf:
        assert zf.open(CHUNK).read(mid + 1)[mid] == byte[0] ^ 0xFF, "the rot did not land"
    after = os.stat(path)
    stamp = ("st_size", "st_mtime_ns", "st_ino", "st_ctime_ns")
    assert [getattr(after, k) for k in stamp] == [getattr(before, k) for k in stamp]

    m = make_mount(ext4_src, "--index-dir", str(tmp_path / "mnt-index"), name="again")
    bad = _in_file(path, 1, rotten * h.blocksize + 4096)
    good = _in_file(path, 1, fine * h.blocksize + 4096)
    fd = os.open(m.mnt / "stack.tif", os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, good) == original[good : good + 4096]
        held = status(m.mnt)["daemon"]["cache"]["bytes"]
        assert 0 < held <= 2 * h.blocksize  # its block, not the 4 MiB compressed plane
        with pytest.raises(OSError) as info:
            os.pread(fd, 4096, bad)
        assert info.value.errno == errno.EIO
        with pytest.raises(OSError) as info:  # the original is known damaged now: all of it
            os.pread(fd, 4096, good + 8192)  # (not the page the kernel keeps from the first)
        assert info.value.errno == errno.EIO
    finally:
        os.close(fd)
    log = m.log_text()
    assert f"chunk '{CHUNK}' block {rotten} does not match its recorded xxh3 digest" in log, log
